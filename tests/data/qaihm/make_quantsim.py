#!/usr/bin/env python3
"""Regenerate tests/data/qaihm/quantsim/: AIMET's own QuantSim (aimet-onnx) run on graphs of export/.

For each graph in GRAPHS (parts of the committed export tests/data/qaihm/export/, made by
qai-hub-models 0.55.0's own code), this script
  1. builds an ``aimet_onnx.quantsim.QuantizationSimModel`` from the part's ONNX (int4 params,
     int16 activations, min-max: the settings of qai-hub-models' ``_build_quantsim``; AIMET's
     default quantsim config; CPU);
  2. loads the part's own encodings file into it with aimet-onnx's
     ``load_encodings_to_sim(sim, path, strict=False, allow_overwrite=False)``:
     strict=False makes every quantizer take the file's settings (bit width, symmetry,
     per-channel) where the sim's defaults differ, adds a quantizer for any file entry the sim
     lacks, and (``disable_missing_quantizers=True``, the default) disables every quantizer
     the file has no entry for; allow_overwrite=False freezes the loaded encodings;
  3. checks quantizer by quantizer that the sim now holds exactly the file: every enabled
     quantizer has a file entry and its exported encoding (``export_encodings("1.0.0")``)
     equals the entry (bw, dtype, enc_type, is_sym, offsets equal; scales to rtol 1e-6, the
     float64 min/max round trip of AIMET's TfEncoding), every file entry has an enabled
     quantizer; it stops if not;
  4. runs the sim's session on seeded, realistic inputs (see ``make_inputs``) and writes the
     inputs and outputs to quantsim/<graph>.npz, with a JSON ``meta`` entry (the graph, the
     seed, the scenario, how each input was drawn, the quantizer counts and the names of the
     quantizers not set from the file, how AIMET rounded the graph's inputs (see
     ``rounding_check``), the package versions).
A summary of every graph is written to quantsim/summary.json.

Environment: the venv of make_export.py's docstring works; this script needs only
    /root/.pyenv/versions/3.10.13/bin/python3.10 -m venv /work/venvs/qaihm
    /work/venvs/qaihm/bin/pip install aimet-onnx==2.26.0 torch==2.4.1 onnx==1.18.0 \
        onnxruntime==1.22.0 "numpy<2"
(aimet-onnx 2.26.0 is the version that made the export's encodings; it requires torch.)

Run (CPU only, about 7 s on 2 cores):
    /work/venvs/qaihm/bin/python tests/data/qaihm/make_quantsim.py

The parts are ONNX IR 11; onnxruntime 1.22 refuses IR 11, so the sim is built from the model
with ``ir_version = 10`` set in memory (the files are not changed).

npz layout: ``in_<i>`` / ``out_<i>`` arrays, in the order of ``meta["inputs"]`` /
``meta["outputs"]`` (the graph's input and output names); ``meta`` a JSON string.
"""
from __future__ import annotations

import hashlib
import io
import json
import platform
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
EXPORT = HERE / "export"
OUT = HERE / "quantsim"
NAME = "qwen2_5_7b_instruct_w8a16"
PARTS = 6
CL = 256

# (AR, part): the embedding part and two decoder/LM-head prompt parts, and a token part
GRAPHS = [(128, 1), (128, 2), (128, 6), (1, 3)]
SEED = 20240  # graph k uses SEED + k

ROPE_THETA = 1.0e6  # the tiny model's rope_theta (make_export.TINY_CONFIG)
HEAD_DIM = 16
VOCAB = 1024
# How many past tokens the KV cache holds in each scenario: qai-hub-models' generator
# (_shared/llm/generator.py) keeps the valid past in the LAST slots of the past cache, zeros and
# a masked attention_mask in the slots before, then the AR new tokens, causal among themselves.
N_PAST = {128: 100, 1: 200}
HIDDEN_SIGMAS = 4.0  # hidden-state inputs ~ N(0, 1) * max|range| / 4, clipped to the range
KV_SIGMAS = 3.0      # past KV ~ N(0, 1) * max|range| / 3, clipped to the range


def stem(ar: int, part: int) -> str:
    return f"{NAME}_ar{ar}_cl{CL}_{part}_of_{PARTS}"


def graph_paths(ar: int, part: int) -> tuple[Path, Path]:
    d = EXPORT / f"ar{ar}_cl{CL}" / f"{stem(ar, part)}.aimet"
    return d / f"{stem(ar, part)}.onnx", d / f"{stem(ar, part)}.encodings"


def label(ar: int, part: int) -> str:
    return f"ar{ar}_cl{CL}_part{part}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def enc_range(e: dict) -> tuple[float, float]:
    """The float range [min, max] an AIMET 1.0.0 per-tensor encoding covers."""
    scale, offset = float(e["scale"][0]), float(e["offset"][0])
    return offset * scale, (offset + 2 ** int(e["bw"]) - 1) * scale


# ============================================================================ inputs


def rope(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of pos * theta^(-2i/head_dim), i < head_dim/2: qai-hub-models' RopeEmbedding
    (first half of LlamaRotaryEmbedding's table), shaped [1, 1, AR, head_dim/2]."""
    inv_freq = ROPE_THETA ** (-np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM)
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return (np.cos(angles).astype(np.float32)[None, None],
            np.sin(angles).astype(np.float32)[None, None])


def make_inputs(model: onnx.ModelProto, acts: dict, ar: int, seed: int):
    """Seeded realistic inputs for every graph input; returns (feeds, how each was drawn,
    scenario)."""
    rng = np.random.default_rng(seed)
    n_past = N_PAST[ar]
    past_slots = CL - ar
    pad = past_slots - n_past
    positions = np.arange(n_past, n_past + ar)
    scenario = {"ar": ar, "context_length": CL, "past_slots": past_slots,
                "valid_past": n_past, "padded_past_slots": pad,
                "positions": [int(positions[0]), int(positions[-1])]}
    feeds, how = {}, {}
    for vi in model.graph.input:
        name = vi.name
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        e = acts.get(name)
        if name == "input_ids":
            feeds[name] = rng.integers(3, VOCAB, size=shape).astype(dtype)
            how[name] = f"uniform integers in [3, {VOCAB})"
        elif name == "attention_mask":
            lo = np.float32(enc_range(e)[0])   # the masked value: the encoding's minimum
            mask = np.full(shape, lo, np.float32)
            mask[..., pad:past_slots] = 0.0                      # the valid past
            causal = np.tril(np.ones((ar, ar), bool))
            mask[0, 0, :, past_slots:][causal] = 0.0             # new tokens, causal
            feeds[name] = mask
            how[name] = (f"causal: 0 where visible, {float(lo)!r} (the encoding's minimum) where "
                         f"masked; past slots [0, {pad}) padding (masked), [{pad}, {past_slots}) "
                         f"the valid past, then the {ar} new token(s) causal")
            scenario["mask_value"] = float(lo)
        elif name in ("position_ids_cos", "position_ids_sin"):
            cos, sin = rope(positions)
            feeds[name] = cos if name.endswith("cos") else sin
            how[name] = (f"RoPE of positions {positions[0]}..{positions[-1]}: "
                         f"{'cos' if name.endswith('cos') else 'sin'}(pos * {ROPE_THETA:g}^(-2i/"
                         f"{HEAD_DIM})), i < {HEAD_DIM // 2}")
        elif name.startswith("past_"):
            lo, hi = enc_range(e)
            sigma = max(abs(lo), abs(hi)) / KV_SIGMAS
            values = np.clip(rng.standard_normal(shape) * sigma, lo, hi).astype(np.float32)
            axis = 3 if name.startswith("past_key") else 2       # key [2,1,16,T], value [2,1,T,16]
            index = [slice(None)] * 4
            index[axis] = slice(0, pad)
            values[tuple(index)] = 0.0                           # padding slots are zeros
            feeds[name] = values
            how[name] = (f"N(0,1) * {sigma:.6g} (max|range| / {KV_SIGMAS:g}), clipped to the "
                         f"encoding's range [{lo:.6g}, {hi:.6g}]; padding slots [0, {pad}) zero")
        else:   # the hidden state between parts
            lo, hi = enc_range(e)
            sigma = max(abs(lo), abs(hi)) / HIDDEN_SIGMAS
            feeds[name] = np.clip(rng.standard_normal(shape) * sigma, lo, hi).astype(np.float32)
            how[name] = (f"N(0,1) * {sigma:.6g} (max|range| / {HIDDEN_SIGMAS:g}), clipped to "
                         f"the encoding's range [{lo:.6g}, {hi:.6g}]")
        assert feeds[name].dtype == dtype and list(feeds[name].shape) == shape, name
    return feeds, how, scenario


# ============================================================================ the sim


def build_sim(onnx_path: Path, enc_path: Path):
    """QuantSim of the graph with the file's encodings loaded; returns (sim, record)."""
    from aimet_onnx.common.defs import QuantizationDataType
    from aimet_onnx.quantsim import QuantizationSimModel, load_encodings_to_sim

    model = onnx.load(str(onnx_path))                  # external data from the part's .data
    model.ir_version = min(model.ir_version, 10)        # onnxruntime 1.22 refuses IR 11
    sim = QuantizationSimModel(model, param_type="int4", activation_type="int16",
                               quant_scheme="min_max", providers=["CPUExecutionProvider"])
    before = set(sim.qc_quantize_op_dict)
    file = json.loads(enc_path.read_text())
    entries = {e["name"]: e for e in file["param_encodings"] + file["activation_encodings"]}
    mismatched = load_encodings_to_sim(sim, str(enc_path), strict=False, allow_overwrite=False)

    added = sorted(set(sim.qc_quantize_op_dict) - before)
    not_from_file, problems, set_from_file = [], [], []
    for name, q in sorted(sim.qc_quantize_op_dict.items()):
        e = entries.get(name)
        if e is None:
            not_from_file.append(name)
            if q.enabled:
                problems.append(f"{name}: enabled, no entry in the file")
            continue
        if not q.enabled:
            problems.append(f"{name}: in the file, quantizer disabled")
            continue
        if not q.is_encoding_frozen:
            problems.append(f"{name}: encoding not frozen")
        got = q.export_encodings("1.0.0")
        same = (got is not None and q.data_type == QuantizationDataType.int
                and all(got[k] == e[k] for k in ("bw", "dtype", "enc_type", "is_sym"))
                and np.array_equal(np.asarray(got["offset"], np.float64),
                                   np.asarray(e["offset"], np.float64))
                and np.allclose(np.asarray(got["scale"], np.float64),
                                np.asarray(e["scale"], np.float64), rtol=1e-6, atol=0))
        if not same:
            problems.append(f"{name}: sim {got} != file {e}")
            continue
        set_from_file.append(name)
    missing = sorted(set(entries) - set(sim.qc_quantize_op_dict))
    problems += [f"{name}: file entry without a quantizer" for name in missing]
    if problems:
        raise SystemExit(f"{enc_path.name}: the sim does not hold the file:\n  "
                         + "\n  ".join(problems))

    shared = {}
    for name, q in sim.qc_quantize_op_dict.items():
        shared.setdefault(id(q), []).append(name)
    tied = sorted(sorted(v) for v in shared.values() if len(v) > 1)
    reasons = {}
    for name in not_from_file:
        op = next((n.op_type for n in sim.model.model.graph.node if name in n.output), None)
        if op is None:
            reasons[name] = "bias parameter (the file has no bias encodings)" \
                if name.endswith(".bias") else "parameter without an entry in the file"
        else:
            reasons[name] = f"output of a {op} node; no entry in the file"
    record = {
        "quantizers_in_sim": len(sim.qc_quantize_op_dict),
        "file_entries": len(entries),
        "file_param_entries": len(file["param_encodings"]),
        "file_activation_entries": len(file["activation_encodings"]),
        "set_from_file": len(set_from_file),
        "set_from_file_tied_groups": tied,   # AIMET ties Concat's input and output quantizers
        "quantizers_added_for_file_entries": added,
        "settings_changed_to_the_file": len(mismatched),
        "not_set_from_file_disabled": reasons,
    }
    return sim, record


def rounding_check(sim, feeds: dict, acts: dict) -> dict:
    """How AIMET's quantizer rounds, on this graph's inputs: for each input with an activation
    encoding, how many values AIMET's quantize-dequantize (the QcQuantizeOp kernel the session
    runs) gives differently from (a) float32 floor(x / scale - offset + 0.5), round half up
    after adding the offset, and (b) round half to even of x / scale, then - offset (onnxruntime
    QuantizeLinear's rounding, the QDQ reference's)."""
    out = {}
    for name, x in feeds.items():
        e = acts.get(name)
        if e is None:
            continue
        scale, offset = np.float32(e["scale"][0]), np.float32(e["offset"][0])
        qmax = np.float32(2 ** int(e["bw"]) - 1)
        got = sim.qc_quantize_op_dict[name].quantize_dequantize(x.copy())
        half_up = (np.clip(np.floor(x / scale - offset + np.float32(0.5)), 0, qmax) + offset) * scale
        half_even = (np.clip(np.round(x / scale) - offset, 0, qmax) + offset) * scale
        out[name] = {"values": int(x.size),
                     "differ_from_floor_half_up_f32": int((got != half_up).sum()),
                     "differ_from_round_half_even": int((got != half_even).sum())}
    return out


def run_sim(sim, feeds: dict, output_names: list) -> dict:
    """The sim's outputs under the graph's output names: AIMET renames a graph output that has
    an output quantizer to '<name>_updated' (the quantizer's output)."""
    names = [o.name for o in sim.session.get_outputs()]
    assert [n.removesuffix("_updated") for n in names] == output_names, (names, output_names)
    return dict(zip(output_names, sim.session.run(None, feeds)))


# ============================================================================ main


def write_npz(path: Path, arrays: dict) -> None:
    """np.savez_compressed with fixed zip timestamps: re-running gives identical bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for key, value in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asanyarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())


def versions() -> dict:
    from importlib.metadata import version
    out = {"python": platform.python_version()}
    for pkg in ("aimet-onnx", "onnx", "onnxruntime", "numpy", "torch"):
        out[pkg] = version(pkg)
    return out


def main() -> None:
    OUT.mkdir(exist_ok=True)
    vers = versions()
    summary = {"versions": vers, "graphs": {}}
    for k, (ar, part) in enumerate(GRAPHS):
        onnx_path, enc_path = graph_paths(ar, part)
        seed = SEED + k
        structure = onnx.load(str(onnx_path), load_external_data=False)
        file = json.loads(enc_path.read_text())
        acts = {e["name"]: e for e in file["activation_encodings"]}
        feeds, how, scenario = make_inputs(structure, acts, ar, seed)
        sim, record = build_sim(onnx_path, enc_path)
        output_names = [o.name for o in structure.graph.output]
        outputs = run_sim(sim, feeds, output_names)
        rounding = rounding_check(sim, feeds, acts)
        rel = lambda p: str(p.relative_to(HERE))   # noqa: E731
        meta = {
            "graph": rel(onnx_path), "encodings": rel(enc_path),
            "onnx_sha256": sha256(onnx_path), "encodings_sha256": sha256(enc_path),
            "seed": seed, "scenario": scenario,
            "inputs": list(feeds), "outputs": output_names, "input_generation": how,
            "sim": ("aimet_onnx.quantsim.QuantizationSimModel(model, param_type='int4', "
                    "activation_type='int16', quant_scheme='min_max', "
                    "providers=['CPUExecutionProvider']) (ir_version set to 10 in memory); "
                    "load_encodings_to_sim(sim, encodings, strict=False, allow_overwrite=False)"),
            "quantizers": record, "rounding_on_inputs": rounding, "versions": vers,
        }
        arrays = {f"in_{i}": v for i, v in enumerate(feeds.values())}
        arrays |= {f"out_{i}": outputs[n] for i, n in enumerate(output_names)}
        arrays["meta"] = np.array(json.dumps(meta, indent=1))
        path = OUT / f"{label(ar, part)}.npz"
        write_npz(path, arrays)
        summary["graphs"][label(ar, part)] = {
            k2: meta[k2] for k2 in ("graph", "seed", "scenario", "rounding_on_inputs")} | {
            "quantizers": {k2: v for k2, v in record.items() if k2 != "set_from_file_tied_groups"},
            "npz_bytes": path.stat().st_size}
        print(f"{path.name}: {record['set_from_file']} of {record['quantizers_in_sim']} "
              f"quantizers set from the file ({record['file_entries']} entries), "
              f"{len(record['not_set_from_file_disabled'])} disabled (no entry), "
              f"{len(record['quantizers_added_for_file_entries'])} added; "
              f"{path.stat().st_size} bytes", flush=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("done:", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
