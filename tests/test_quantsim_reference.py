"""The QDQ reference (runtime/qdq.py) against AIMET's own QuantSim: for graphs of the committed
qai-hub-models export (tests/data/qaihm/export), tests/data/qaihm/quantsim/ holds the outputs of
aimet-onnx 2.26.0's QuantizationSimModel with the export's own encodings file loaded into it, for
seeded inputs (made by tests/data/qaihm/make_quantsim.py, which this suite does not run: no aimet
or torch here). The reference built from the same ONNX and encodings, run by onnxruntime, must
give the same outputs: cosine >= 0.9999 at every position of every output. With one activation
encoding dropped from the file it measurably does not."""
import hashlib
import json
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from hexbundle.runtime.qdq import write_qdq_model

DATA = Path(__file__).resolve().parent / "data" / "qaihm"
QUANTSIM = DATA / "quantsim"
GRAPHS = ["ar128_cl256_part1", "ar128_cl256_part2", "ar128_cl256_part6", "ar1_cl256_part3"]
COS_MIN = 0.9999

# The entry dropped in the sabotage test, and the output it shows in. Measured with the committed
# data, dropping each of part 2's 220 internal activation entries (all but the data-movement ones)
# in turn: the 16-bit residual stream after layer 0 has the range [-0.0864, 0.0770]; 3 of its 8192
# values exceed it here (up to 0.0841), and AIMET, like the faithful reference, clips them. Without
# the entry they reach the part's hidden output unclipped: cosine against AIMET 0.99944691 instead
# of 0.99999999, max |error| 7.0e-03 instead of 9.5e-06.
SABOTAGED_GRAPH = "ar128_cl256_part2"
DROPPED = "/model/model/layers.0/Add_1_output_0"
SHOWN_IN = "/model/model/layers.1/Add_1_output_0"


def load(label: str):
    """(meta, inputs, AIMET's outputs) of one saved graph."""
    with np.load(QUANTSIM / f"{label}.npz") as z:
        meta = json.loads(str(z["meta"]))
        feeds = {name: z[f"in_{i}"] for i, name in enumerate(meta["inputs"])}
        want = {name: z[f"out_{i}"] for i, name in enumerate(meta["outputs"])}
    return meta, feeds, want


def position_axis(name: str, ndim: int) -> int:
    """past_key [2,1,16,T], past_value [2,1,T,16]; hidden states and logits [1,T,D]."""
    if name.startswith("past_key"):
        return 3
    if name.startswith("past_value"):
        return 2
    return ndim - 2


def cosines(name: str, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Cosine similarity per position (everything else of that position flattened)."""
    axis = position_axis(name, want.ndim)
    a = np.moveaxis(got, axis, 0).reshape(got.shape[axis], -1).astype(np.float64)
    b = np.moveaxis(want, axis, 0).reshape(want.shape[axis], -1).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(norms, 1e-30)


def run_reference(meta: dict, encodings: Path, out_dir: Path, feeds: dict) -> dict:
    path = write_qdq_model(DATA / meta["graph"], encodings, out_dir)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(path), options,
                                           providers=["CPUExecutionProvider"])
    return dict(zip(meta["outputs"], session.run(meta["outputs"], feeds)))


def compare(meta: dict, got: dict, want: dict) -> dict:
    """{output: (min cosine over positions, max |error|)}"""
    return {name: (float(cosines(name, got[name], want[name]).min()),
                   float(np.abs(got[name].astype(np.float64) - want[name]).max()))
            for name in meta["outputs"]}


def table(label: str, rows: dict) -> str:
    return "\n".join(f"{label} {name}: cosine min {cos:.8f}, max |error| {err:.3g}"
                     for name, (cos, err) in rows.items())


def test_the_saved_graphs_were_made_from_the_committed_export_with_every_encoding_loaded():
    assert sorted(p.stem for p in QUANTSIM.glob("*.npz")) == sorted(GRAPHS)
    for label in GRAPHS:
        meta, feeds, want = load(label)
        for key, digest in (("graph", "onnx_sha256"), ("encodings", "encodings_sha256")):
            assert hashlib.sha256((DATA / meta[key]).read_bytes()).hexdigest() == meta[digest], \
                (label, meta[key])
        q = meta["quantizers"]
        # every entry of the file set a quantizer of the sim; every other quantizer was off
        assert q["set_from_file"] == q["file_entries"] > 0, (label, q)
        assert q["quantizers_in_sim"] == q["set_from_file"] + len(q["not_set_from_file_disabled"])
        assert meta["versions"]["aimet-onnx"] == "2.26.0"
        assert set(feeds) and set(want)


@pytest.mark.parametrize("label", GRAPHS)
def test_the_qdq_reference_gives_aimets_quantsim_outputs(label, tmp_path):
    meta, feeds, want = load(label)
    got = run_reference(meta, DATA / meta["encodings"], tmp_path / "qdq", feeds)
    rows = compare(meta, got, want)
    print("\n" + table(label, rows))
    assert all(cos >= COS_MIN for cos, _ in rows.values()), table(label, rows)


def test_the_reference_without_one_activation_encoding_is_measurably_further_from_aimet(
        tmp_path):
    meta, feeds, want = load(SABOTAGED_GRAPH)
    encodings = json.loads((DATA / meta["encodings"]).read_text())
    kept = [e for e in encodings["activation_encodings"] if e["name"] != DROPPED]
    assert len(kept) == len(encodings["activation_encodings"]) - 1
    dropped = tmp_path / "dropped.encodings"
    dropped.write_text(json.dumps({**encodings, "activation_encodings": kept}))

    faithful = compare(meta, run_reference(meta, DATA / meta["encodings"], tmp_path / "a",
                                           feeds), want)
    sabotaged = compare(meta, run_reference(meta, dropped, tmp_path / "b", feeds), want)
    print("\n" + table("faithful", faithful) + "\n" + table(f"without {DROPPED}", sabotaged))
    (cos_ok, err_ok), (cos_bad, err_bad) = faithful[SHOWN_IN], sabotaged[SHOWN_IN]
    assert cos_ok >= COS_MIN > cos_bad          # measured: 0.99999999 and 0.99944691
    assert 1 - cos_bad > 1000 * (1 - cos_ok)
    assert err_bad > 100 * err_ok               # measured: 7.0e-03 and 9.5e-06
