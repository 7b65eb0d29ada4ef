"""Make real AIMET encodings (and AIMET's own weight QDQ) for hexbundle's tests.

Every *.encodings file in this directory is written by aimet-onnx's
QuantizationSimModel.export(); this script only renames nothing and edits nothing: it
chooses the file name via `filename_prefix` and copies no bytes itself.

Environment (a venv OUTSIDE the repo; aimet-onnx pulls CUDA torch wheels that run on CPU):

    python3 -m venv /work/venvs/aimet242                       # CPython 3.11.7
    /work/venvs/aimet242/bin/pip install aimet-onnx==2.42.0
    # resolved: aimet-onnx 2.42.0, onnx 1.23.2, onnxruntime 1.32.0, numpy 2.4.6,
    #           torch 2.14.1 (if pip refuses torch because of /etc/xdg/pip's cap: rm -r /etc/xdg/pip)

The graph: part 2 of 4 of the project's embedded model qwen2-tiny, PROMPT graph
(prompt_ar128_cl256_2_of_4.onnx + part_2_of_4.data: 2 decoder layers, hidden 128, 4 heads /
2 kv heads, head_dim 32, intermediate 512; MatMul weights stored [in, out]). Generate it with
the project itself (system python3, not the venv), then copy ONNX + data to a scratch dir:

    cd /work/main && python3 -m doit inputs          # -> build/qwen2-tiny/inputs/
    # (HEXBUNDLE_BUILD_ROOT=/some/scratch/root puts it elsewhere; same bytes, own lock)
    mkdir -p /work/scratch/aimet/graph
    cp build/qwen2-tiny/inputs/prompt_ar128_cl256_2_of_4.onnx \
       build/qwen2-tiny/inputs/part_2_of_4.data \
       build/qwen2-tiny/inputs/prompt_ar128_cl256_1_of_4.onnx \
       build/qwen2-tiny/inputs/part_1_of_4.data /work/scratch/aimet/graph/
    # (part 1, the float embedding, makes the calibration inputs; --embedding points elsewhere)

Run:

    /work/venvs/aimet242/bin/python tests/data/aimet/make_encodings.py \
        --graph /work/scratch/aimet/graph/prompt_ar128_cl256_2_of_4.onnx

What it does (all aimet_onnx 2.42.0 public API unless marked):
  * QuantizationSimModel(model, param_type="int4", activation_type="int16",
    quant_scheme="min_max", config_file=None)  -> default config
    "default_config_per_channel.json": params symmetric, MatMul/Gemm/Conv weights
    per-channel, activations (every op output + model inputs) asymmetric, bias unquantized.
  * kind "per_channel": nothing more (default per-channel int4 MatMul weights).
  * kind "per_block":  aimet_onnx.quantsim.set_blockwise_quantization_for_weights(
        sim, ("MatMul", "Gemm"), bitwidth=4, symmetric=True, block_size=32)
    (block along the weight's input-feature dim, per-channel along output). "Gemm" is needed:
    AIMET's MatmulAdd supergroup pass sees q/k/v_proj (MatMul + bias Add) as Gemm ops, and
    with ("MatMul",) only those 6 weights silently stay per-channel.
  * kind "lpbq":       aimet_onnx.quantsim.set_grouped_blockwise_quantization_for_weights(
        sim, ("MatMul", "Gemm"), bitwidth=4, decompressed_bw=8, block_size=32)
    (deprecated by AIMET in favour of set_lpbq_for_params(sim, bitwidth=4, block_size=32,
    op_types={"MatMul", "Gemm"}), which means the same thing: scale_bits = 4 = 8 - 4).
  * kind "per_channel_zps" (optional extra): like per_channel, plus
    QcQuantizeOp.set_zero_point_shift(0.5) on every MatMul weight quantizer (what
    QSpec(shift_zero_point=True) does; AIMET documents it for int2 but it is accepted for int4).
    It is the only way found to get `zero_point_shift` into an export.
  * sim.compute_encodings(callback): the callback runs 4 batches of the REAL inputs of the
    graph through sim.session (real_batches(); computed beforehand with the float graphs in
    onnxruntime): for each of 2 seeded sequences of 256 random token ids (vocab 1024), the
    hidden state = part 1's float output (the embedding) for the chunk's 128 tokens; chunk 1
    (positions 0..127) with n_past 0: past K/V zeros, additive mask causal over the new slots,
    past slots -10000; chunk 2 (positions 128..255) with n_past 128: past K/V = chunk 1's
    past_*_out of the float part-2 graph, mask 0 on all past slots + causal on the new ones.
    RoPE cos/sin of the absolute positions (theta 1e6). As hexbundle/runtime/conventions.py,
    so the boundary encodings (hidden in/out, past K/V in) cover what `doit verify` feeds.
  * sim.export(OUT_DIR, f"{kind}_{version}", export_model=False, encoding_version=version)
    for version in 0.6.1, 1.0.0, 2.0.0, 2.1.0. A refused combination is recorded with AIMET's
    exception text in refused.json (and no file is written for it).
  * qdq_<kind>.npz: AIMET's own quantize-dequantize of three weights, from
    sim.qc_quantize_op_dict[name].quantize_dequantize(float_weight) -- the same libpymo kernel
    that the in-graph QcQuantizeOp runs and that sim.fold_param_quantizers() /
    sim._get_qdq_parameters() use (float32, key = tensor name, shape [in, out]).
  * verify(): recomputes the npz values from the 2.0.0 numbers (see its docstring);
    `--verify-only` runs just that.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper

import aimet_onnx
from aimet_onnx.quantsim import (
    QuantizationSimModel,
    set_blockwise_quantization_for_weights,
    set_grouped_blockwise_quantization_for_weights,
)

OUT_DIR = Path(__file__).resolve().parent
KINDS = ("per_channel", "per_block", "lpbq", "per_channel_zps")
VERSIONS = ("0.6.1", "1.0.0", "2.0.0", "2.1.0")
BLOCK_SIZE = 32
# AIMET's "MatmulAdd" supergroup pass (default config) turns q/k/v_proj MatMul+Add(bias) into
# Gemm nodes in its connected graph, so ("MatMul",) alone leaves q/k/v per-channel.
WEIGHT_OP_TYPES = ("MatMul", "Gemm")
N_SEQUENCES = 2          # x 2 chunks (n_past 0 and n_past AR) = 4 calibration batches
SEED = 1234
VOCAB = 1024             # qwen2-tiny (configs/models/qwen2-tiny.toml)
ROPE_THETA = 1e6
MASK_VALUE = -10000.0    # additive "may not attend" (hexbundle/runtime/conventions.py)
RUNTIME_INPUTS = ("attention_mask", "position_ids_cos", "position_ids_sin")
QDQ_WEIGHTS = (
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.1.mlp.up_proj.weight",
)


def input_shapes(model: onnx.ModelProto) -> dict:
    return {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim)
            for i in model.graph.input}


def real_batches(graph: Path, embedding: Path, n_sequences: int, seed: int) -> list:
    """Calibration feeds with the inputs the part-2 prompt graph really gets (the runtime
    conventions of hexbundle/runtime/conventions.py, written out here so that the AIMET venv
    needs no hexbundle), computed with the FLOAT graphs in onnxruntime.

    Per sequence: 2 * AR random token ids (seeded) -> part 1 (the embedding, input_ids int32)
    -> the hidden state. Chunk 1 = tokens [0, AR) with n_past 0 (past K/V zeros, past slots
    masked, causal over the new slots); chunk 2 = tokens [AR, 2 AR) with n_past = AR, its past
    K/V = chunk 1's past_*_out of the float part-2 graph (all past slots valid, causal new).
    Mask additive (0 / -10000), shape (1, 1, AR, CL); RoPE cos/sin of the absolute positions
    (theta 1e6, head_dim 32). Returns 2 * n_sequences feeds, n_past 0 and AR alternating."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    part1 = ort.InferenceSession(str(embedding), opts, providers=["CPUExecutionProvider"])
    part2 = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
    shapes = input_shapes(onnx.load(str(graph), load_external_data=False))
    ids_in = part1.get_inputs()[0]
    assert ids_in.type == "tensor(int32)", ids_in.type       # input_ids int32 (1, AR)
    table = onnx.load(str(embedding), load_external_data=False).graph.initializer
    assert [t.dims[0] for t in table] == [VOCAB], [list(t.dims) for t in table]
    hidden_name = next(n for n in shapes if n not in RUNTIME_INPUTS and not n.startswith("past_"))
    _, _, ar, cl = shapes["attention_mask"]
    half = shapes["position_ids_cos"][-1]                    # head_dim / 2
    past = cl - ar                                           # past slots [0, past)
    out_names = [o.name for o in part2.get_outputs()]
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(n_sequences):
        ids = rng.integers(0, VOCAB, 2 * ar).astype(np.int32)
        kv = {n: np.zeros(s, np.float32) for n, s in shapes.items() if n.startswith("past_")}
        for chunk, n_past in enumerate((0, past)):
            pos = np.arange(chunk * ar, (chunk + 1) * ar, dtype=np.float64)
            inv_freq = 1.0 / (ROPE_THETA ** (np.arange(0, 2 * half, 2, dtype=np.float64) / (2 * half)))
            ang = pos[:, None] * inv_freq[None, :]           # as conventions.rope_inputs
            allowed = np.zeros((ar, cl), bool)
            allowed[:, past - n_past:past] = True
            allowed[:, past:] = np.tri(ar, dtype=bool)
            feed = {
                hidden_name: part1.run(None, {ids_in.name: ids[None, chunk * ar:(chunk + 1) * ar]})[0],
                "attention_mask": np.where(allowed, 0.0, MASK_VALUE).astype(np.float32)
                                    .reshape(shapes["attention_mask"]),
                "position_ids_cos": np.cos(ang).astype(np.float32).reshape(shapes["position_ids_cos"]),
                "position_ids_sin": np.sin(ang).astype(np.float32).reshape(shapes["position_ids_sin"]),
                **kv,
            }
            batches.append(feed)
            outs = dict(zip(out_names, part2.run(None, feed)))
            kv = {n: outs[n[:-len("_in")] + "_out"] for n in kv}   # chunk 2's past = chunk 1's new
    return batches


def build_sim(graph: Path, kind: str) -> QuantizationSimModel:
    model = onnx.load(str(graph))   # loads part_2_of_4.data from the graph's directory
    sim = QuantizationSimModel(model, param_type="int4", activation_type="int16",
                               quant_scheme="min_max", config_file=None)
    if kind == "per_block":
        set_blockwise_quantization_for_weights(sim, WEIGHT_OP_TYPES, bitwidth=4, symmetric=True,
                                               block_size=BLOCK_SIZE, strict=True)
    elif kind == "lpbq":
        set_grouped_blockwise_quantization_for_weights(sim, WEIGHT_OP_TYPES, bitwidth=4,
                                                       decompressed_bw=8,
                                                       block_size=BLOCK_SIZE, strict=True)
    elif kind == "per_channel_zps":
        for name in sim.param_names:
            if name.endswith(".weight") and "layernorm" not in name:
                sim.qc_quantize_op_dict[name].set_zero_point_shift(0.5)
    return sim


def verify(graph: Path) -> None:
    """Recompute each qdq_<kind>.npz from the 2.0.0 file's numbers and the float weights, in
    float32, and count mismatching elements (all 0 with aimet-onnx 2.42.0). The formula that is
    bit-exact: S = float32(y_scale) (LPBQ: float32(per_channel_float_scale * per_block_int_scale)
    computed in float64), repeated block_size times along `axis` for blockwise; u = -8 - zp
    (the 0.6.1/1.0.0 unsigned offset, + zero_point_shift); qdq = (clip(round_half_even(w/S - u),
    0, 15) + u) * S. NB with a fractional zero point, rounding w/S + zp in the signed domain
    differs from AIMET at float32 ties (1 element of 65536 here)."""
    proto = onnx.load(str(graph), load_external_data=False)
    for kind in KINDS:
        encs = {e["name"]: e for e in
                json.loads((OUT_DIR / f"{kind}_2.0.0.encodings").read_text())["encodings"]}
        qdq = np.load(OUT_DIR / f"qdq_{kind}.npz")
        for t in proto.graph.initializer:
            if t.name not in qdq.files:
                continue
            w, e = onnx.numpy_helper.to_array(t, base_dir=str(graph.parent)), encs[t.name]
            if "per_channel_float_scale" in e:
                s = (np.array(e["per_channel_float_scale"]) *
                     np.array(e["per_block_int_scale"])).astype(np.float32)
            else:
                s = np.array(e["y_scale"], np.float32)
            zp = np.array(e.get("y_zero_point", 0.0), np.float32)
            if e.get("block_size"):
                s = np.repeat(s, e["block_size"], axis=e["axis"])
            else:            # per-channel along axis 1 ([in, out] MatMul weight)
                s, zp = s[None, :], (zp[None, :] if zp.ndim else zp)
            u = np.float32(-8) - zp
            ref = (np.clip(np.round(w / s - u), 0, 15) + u) * s
            print(f"verify {kind:16s} {t.name:40s} mismatches {int((ref != qdq[t.name]).sum())}"
                  f" / {w.size}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graph", type=Path,
                    default=Path("/work/scratch/aimet/graph/prompt_ar128_cl256_2_of_4.onnx"))
    ap.add_argument("--embedding", type=Path, default=None,
                    help="part 1's float prompt graph (default: prompt_ar128_cl256_1_of_4.onnx "
                         "next to --graph)")
    ap.add_argument("--kinds", nargs="*", default=list(KINDS))
    ap.add_argument("--verify-only", action="store_true",
                    help="only check qdq_*.npz against the 2.0.0 files' numbers")
    args = ap.parse_args()
    if args.verify_only:
        verify(args.graph)
        return 0

    proto = onnx.load(str(args.graph), load_external_data=False)
    embedding = args.embedding or args.graph.parent / "prompt_ar128_cl256_1_of_4.onnx"
    batches = real_batches(args.graph, embedding, N_SEQUENCES, SEED)
    floats = {t.name: onnx.numpy_helper.to_array(t, base_dir=str(args.graph.parent))
              for t in proto.graph.initializer if t.name in QDQ_WEIGHTS}

    refused_path = OUT_DIR / "refused.json"
    refused = json.loads(refused_path.read_text()) if refused_path.exists() else {}
    for kind in args.kinds:
        print(f"== {kind}", flush=True)
        sim = build_sim(args.graph, kind)

        def calibrate(session):
            for feed in batches:
                session.run(None, feed)

        sim.compute_encodings(calibrate)

        for version in VERSIONS:
            key = f"{kind}_{version}"
            try:
                sim.export(str(OUT_DIR), key, export_model=False, encoding_version=version)
                refused.pop(key, None)
                print(f"   wrote {key}.encodings", flush=True)
            except Exception as e:  # record AIMET's refusal verbatim
                refused[key] = f"{type(e).__name__}: {e}"
                print(f"   REFUSED {key}: {refused[key]}", flush=True)

        qdq = {name: np.asarray(sim.qc_quantize_op_dict[name].quantize_dequantize(w),
                                dtype=np.float32)
               for name, w in floats.items()}
        np.savez_compressed(OUT_DIR / f"qdq_{kind}.npz", **qdq)
        print(f"   wrote qdq_{kind}.npz", flush=True)

    refused_path.write_text(json.dumps({"aimet_onnx": aimet_onnx.__version__,
                                        **{k: v for k, v in sorted(refused.items())
                                           if k != "aimet_onnx"}}, indent=2) + "\n")
    if set(args.kinds) == set(KINDS):
        verify(args.graph)
    return 0


if __name__ == "__main__":
    sys.exit(main())
