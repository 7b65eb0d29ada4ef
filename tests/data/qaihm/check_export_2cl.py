#!/usr/bin/env python3
"""Check tests/data/qaihm/export-2cl/ and print the facts its README section records.

Run with any Python that has onnx, onnxruntime and numpy (the qaihm venv or the
project's):  python3 tests/data/qaihm/check_export_2cl.py
Exits non-zero when a check fails.  What it checks, per (AR, context length):
  - onnx.checker.check_model(path, full_check=True) on every ONNX, by path;
  - the six parts run in a chain with onnxruntime give the unsplit graph's
    logits and KV outputs (random inputs, fixed seed);
and across the two context lengths of one AR:
  - which files are byte-identical (.data, .encodings, .onnx);
  - initializer names, their external-data records (location, offset, length),
    node names and ops, input and output names: identical or not;
  - the CL-512 graph, given the CL-256 graph's history in the last slots of its
    longer KV cache and the rest masked, gives the CL-256 graph's logits;
and against export/ (same calibration): which files are byte-identical.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
ROOT = HERE / "export-2cl"
OLD = HERE / "export"
ARS = (128, 1)
CLS = (256, 512)
PARTS = 6
NAME = "qwen2_5_7b_instruct_w4a16"
UNSPLIT = "TinyQwen2_AIMETOnnx.aimet"
MASKED = -50.0  # qai-hub-models' attention_mask_min_clip for w4a16
failures: list = []


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def unsplit_onnx(ar: int, cl: int) -> Path:
    return ROOT / f"ar{ar}_cl{cl}" / UNSPLIT / "model.onnx"


def part_stem(ar: int, cl: int, i: int) -> str:
    return f"{NAME}_ar{ar}_cl{cl}_{i}_of_{PARTS}"


def part_file(ar: int, cl: int, i: int, ext: str) -> Path:
    stem = part_stem(ar, cl, i)
    return ROOT / f"ar{ar}_cl{cl}" / f"{stem}.aimet" / f"{stem}.{ext}"


def session(path: Path) -> ort.InferenceSession:
    # Parts are IR 11, which onnxruntime 1.22 refuses; IR 10 in memory runs them.
    model = onnx.load(str(path))
    model.ir_version = min(model.ir_version, 10)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def shape_of(value_info) -> list:
    return [d.dim_value for d in value_info.type.tensor_type.shape.dim]


def random_inputs(sess: ort.InferenceSession, rng: np.random.Generator) -> dict:
    feeds = {}
    for inp in sess.get_inputs():
        if inp.name == "input_ids":
            feeds[inp.name] = rng.integers(0, 1024, size=inp.shape, dtype=np.int32)
        elif inp.name == "attention_mask":
            mask = np.zeros(inp.shape, np.float32)
            mask[..., : inp.shape[-1] // 3] = MASKED
            feeds[inp.name] = mask
        else:
            feeds[inp.name] = rng.standard_normal(inp.shape).astype(np.float32)
    return feeds


def check_onnx_checker() -> None:
    paths = sorted(ROOT.rglob("*.onnx"))
    bad = []
    for path in paths:
        try:
            onnx.checker.check_model(str(path), full_check=True)
        except Exception as err:  # noqa: BLE001 - report every graph that fails
            bad.append(f"{path.relative_to(ROOT)}: {err}")
    check(not bad, f"onnx.checker full_check on {len(paths)} graphs" + "".join("\n     " + b for b in bad))


def check_chain(ar: int, cl: int) -> None:
    rng = np.random.default_rng(ar * 10000 + cl)
    whole = session(unsplit_onnx(ar, cl))
    feeds = random_inputs(whole, rng)
    expected = dict(zip([o.name for o in whole.get_outputs()], whole.run(None, feeds)))
    produced = dict(feeds)
    for i in range(1, PARTS + 1):
        part = session(part_file(ar, cl, i, "onnx"))
        names = [o.name for o in part.get_outputs()]
        outs = part.run(None, {x.name: produced[x.name] for x in part.get_inputs()})
        produced.update(zip(names, outs))
    worst = max(float(np.max(np.abs(produced[k] - v))) for k, v in expected.items())
    check(worst == 0.0, f"ar{ar}_cl{cl}: 6 parts chained == unsplit, {len(expected)} outputs, "
                        f"max |diff| {worst:g}")


def graph_facts(path: Path) -> dict:
    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    records = [{e.key: e.value for e in t.external_data} for t in g.initializer]
    return {
        "initializer names": [t.name for t in g.initializer],
        # A part's location is its own .data file, whose name holds the CL: compared apart.
        "external-data offsets and lengths": [(t.name, r.get("offset"), r.get("length"))
                                              for t, r in zip(g.initializer, records) if r],
        "external-data locations": sorted({r["location"] for r in records if r}),
        "node names and ops": [(n.name, n.op_type) for n in g.node],
        "input names": [i.name for i in g.input],
        "output names": [o.name for o in g.output],
        "input shapes": [shape_of(i) for i in g.input],
    }


def compare_cl(ar: int) -> None:
    pairs = [("unsplit", unsplit_onnx(ar, CLS[0]), unsplit_onnx(ar, CLS[1]))]
    pairs += [(f"part {i}", part_file(ar, CLS[0], i, "onnx"), part_file(ar, CLS[1], i, "onnx"))
              for i in range(1, PARTS + 1)]
    for label, a, b in pairs:
        fa, fb = graph_facts(a), graph_facts(b)
        compared = [k for k in fa if k not in ("input shapes", "external-data locations")]
        same = [k for k in compared if fa[k] == fb[k]]
        differ = [k for k in compared if fa[k] != fb[k]]
        own_data = [[path.with_suffix(".data").name] for path in (a, b)]
        check([fa["external-data locations"], fb["external-data locations"]] == own_data,
              f"ar{ar} {label}: each graph's external data is in its own .data, "
              f"{fa['external-data locations']} / {fb['external-data locations']}")
        print(f"     ar{ar} {label}: cl{CLS[0]} vs cl{CLS[1]} identical: {', '.join(same) or '-'}"
              f"; differ: {', '.join(differ) or '-'}")
        if fa["node names and ops"] == fb["node names and ops"]:
            ga, gb = (onnx.load(str(x), load_external_data=False).graph.node for x in (a, b))
            unlike = [(x.name, x.op_type) for x, y in zip(ga, gb)
                      if x.SerializeToString() != y.SerializeToString()]
            print(f"       nodes whose bytes differ: {len(unlike)}"
                  + (f", e.g. {unlike[0]}" if unlike else ""))
        if "node names and ops" in differ:
            na, nb = fa["node names and ops"], fb["node names and ops"]
            only_a = sorted(set(na) - set(nb))
            only_b = sorted(set(nb) - set(na))
            print(f"       nodes only in cl{CLS[0]}: {len(only_a)} {only_a[:3]}; "
                  f"only in cl{CLS[1]}: {len(only_b)} {only_b[:3]}; same set: {set(na) == set(nb)}")
        check(not set(differ) & {"initializer names", "external-data offsets and lengths",
                                  "input names", "output names"},
              f"ar{ar} {label}: same initializer names, external-data offsets and lengths, "
              f"input and output names at both context lengths")


def compare_files_across_cl() -> None:
    for ar in ARS:
        groups = {"unsplit .data": [], "unsplit .encodings": [], "unsplit .onnx": [],
                  "parts .data": [], "parts .encodings": [], "parts .onnx": []}
        for ext, key in (("data", "data"), ("encodings", "encodings"), ("onnx", "onnx")):
            a, b = (ROOT / f"ar{ar}_cl{cl}" / UNSPLIT / f"model.{ext}" for cl in CLS)
            groups[f"unsplit .{key}"].append(sha(a) == sha(b))
            for i in range(1, PARTS + 1):
                groups[f"parts .{key}"].append(
                    sha(part_file(ar, CLS[0], i, ext)) == sha(part_file(ar, CLS[1], i, ext)))
        print(f"     ar{ar}: byte-identical between cl{CLS[0]} and cl{CLS[1]}: "
              + "; ".join(f"{k} {sum(v)}/{len(v)}" for k, v in groups.items()))
    data = {sha(p) for p in ROOT.rglob("TinyQwen2_AIMETOnnx.aimet/model.data")}
    check(len(data) == 1, f"the four unsplit model.data files are one content ({len(data)} distinct)")
    for ar in ARS:
        same = all(sha(part_file(ar, CLS[0], i, "data")) == sha(part_file(ar, CLS[1], i, "data"))
                   for i in range(1, PARTS + 1))
        check(same, f"ar{ar}: every part's .data is byte-identical at both context lengths")
    for i in range(1, PARTS + 1):
        across = {sha(part_file(ar, cl, i, "data")) for ar in ARS for cl in CLS}
        check(len(across) == 1, f"part {i}: one .data content for all four (AR, CL)")


def compare_with_old_export() -> None:
    if not OLD.is_dir():
        return
    old_name = "qwen2_5_7b_instruct_w8a16"
    for ar in ARS:
        results = {}
        for ext in ("data", "encodings", "onnx"):
            new = [sha(part_file(ar, 256, i, ext)) for i in range(1, PARTS + 1)]
            old = []
            for i in range(1, PARTS + 1):
                stem = f"{old_name}_ar{ar}_cl256_{i}_of_{PARTS}"
                old.append(sha(OLD / f"ar{ar}_cl256" / f"{stem}.aimet" / f"{stem}.{ext}"))
            results[ext] = sum(n == o for n, o in zip(new, old))
        unsplit = {ext: sha(ROOT / f"ar{ar}_cl256" / UNSPLIT / f"model.{ext}")
                   == sha(OLD / f"ar{ar}_cl256" / f"qwen2_5_7b_instruct.{ext}")
                   for ext in ("data", "encodings", "onnx")}
        print(f"     ar{ar}_cl256 vs export/: parts byte-identical .data {results['data']}/6, "
              f".encodings {results['encodings']}/6, .onnx {results['onnx']}/6; unsplit "
              + ", ".join(f".{k} {'same' if v else 'differs'}" for k, v in unsplit.items()))


def check_context_equivalence(ar: int) -> None:
    """The CL-512 graph, fed the CL-256 history in its last KV slots and the rest masked,
    computes what the CL-256 graph computes."""
    rng = np.random.default_rng(7 + ar)
    small, large = session(unsplit_onnx(ar, 256)), session(unsplit_onnx(ar, 512))
    feeds = random_inputs(small, rng)
    feeds["attention_mask"][:] = 0.0
    past_small, past_large = 256 - ar, 512 - ar
    pad = past_large - past_small
    big = {}
    for inp in large.get_inputs():
        value = feeds[inp.name]
        if inp.name.startswith("past_key_"):      # [kv_heads, 1, head_dim, past]
            value = np.concatenate([np.zeros(value.shape[:3] + (pad,), np.float32), value], axis=3)
        elif inp.name.startswith("past_value_"):  # [kv_heads, 1, past, head_dim]
            value = np.concatenate([np.zeros(value.shape[:2] + (pad,) + value.shape[3:],
                                             np.float32), value], axis=2)
        elif inp.name == "attention_mask":         # [1, 1, ar, context]
            value = np.concatenate([np.full(value.shape[:3] + (pad,), MASKED, np.float32), value],
                                   axis=3)
        big[inp.name] = value
    want = small.run(["logits"], feeds)[0]
    got = large.run(["logits"], big)[0]
    diff = float(np.max(np.abs(want - got)))
    scale = float(np.max(np.abs(want)))
    check(diff <= 1e-4 * max(scale, 1.0),
          f"ar{ar}: cl512 graph with the cl256 history in its last {past_small} KV slots "
          f"({pad} masked with {MASKED:g}) gives the cl256 logits: max |diff| {diff:.3g} "
          f"(max |logit| {scale:.3g})")


def main() -> int:
    dirs = sorted(p.name for p in ROOT.iterdir() if p.is_dir())
    check(dirs == sorted(f"ar{ar}_cl{cl}" for ar in ARS for cl in CLS), f"directories: {dirs}")
    check_onnx_checker()
    for cl in CLS:
        for ar in ARS:
            check_chain(ar, cl)
    compare_files_across_cl()
    for ar in ARS:
        compare_cl(ar)
        check_context_equivalence(ar)
    compare_with_old_export()
    total = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    print(f"     total {total} bytes in {sum(1 for p in ROOT.rglob('*') if p.is_file())} files")
    print("FAILED: " + "; ".join(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
