"""How HTP stores 4-bit weights, measured: one-graph QDQ models holding N weights of one shape,
compiled by the ortqnn kit's QnnHtp.dll (QAIRT 2.51.0, soc_model 77, v73) with the weights as
INT4 and again as INT8 (the same integers), and the two bins' metadata compared.

    python3 scripts/htp_int4_storage.py KIND,O,I,N[,SEQ] ...     (e.g. conv,64,96,16 mm,160,96,4)

KIND conv: N Conv weights [O, I, 1, 1] on an input [1, I, 1, SEQ]; mm: N MatMul weights [I, O]
on [1, SEQ, I]; per channel (axis 0 / 1), 16-bit activations. Prints both file sizes, the
declared saving (half a byte per weight), what formats/qnn_context.weights_shrink measures, and
every metadata word that differs (index, INT8 bin, INT4 bin). docs/backends.md records a run.
Run after `python3 -m doit ortqnn_kit`.
"""
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import onnx                                                        # noqa: E402
from onnx import TensorProto, helper, numpy_helper                 # noqa: E402

from hexbundle.backends.ortqnn_kit import ensure_kit               # noqa: E402
from hexbundle.formats.qnn_context import metadata_words, weights_shrink   # noqa: E402

EP = {"backend_path": "QnnHtp.dll", "soc_model": "77", "htp_arch": "73",
      "htp_graph_finalization_optimization_mode": "3"}

def model(kind, O, I, n, bits, seq, path):
    """The QDQ model: x -> Q/DQ (uint16) -> N x (Conv or MatMul with a DQ'd weight) -> Q/DQ."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    dt = TensorProto.INT4 if bits == 4 else TensorProto.INT8
    inits += [numpy_helper.from_array(np.array(1/65535, np.float32), "xs"),
              numpy_helper.from_array(np.array(32768, np.uint16), "xz")]
    if kind == "conv":
        xshape = [1, I, 1, seq]
    else:
        xshape = [1, seq, I]
    nodes += [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
              helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"])]
    outs = []
    for k in range(n):
        if kind == "conv":
            shape, axis, ch = [O, I, 1, 1], 0, O
        else:
            shape, axis, ch = [I, O], 1, O
        vals = rng.integers(-8 if bits == 4 else -128, 8 if bits == 4 else 128, size=shape)
        w = helper.make_tensor(f"w{k}", dt, shape, vals.flatten().tolist())
        inits += [w, numpy_helper.from_array(np.full(ch, 0.01, np.float32), f"ws{k}"),
                  helper.make_tensor(f"wz{k}", dt, [ch], [0]*ch)]
        nodes.append(helper.make_node("DequantizeLinear", [f"w{k}", f"ws{k}", f"wz{k}"], [f"wd{k}"], axis=axis))
        nodes.append(helper.make_node("Conv" if kind == "conv" else "MatMul", ["xd", f"wd{k}"], [f"y{k}"]))
        inits += [numpy_helper.from_array(np.array(1/100, np.float32), f"ys{k}"),
                  numpy_helper.from_array(np.array(32768, np.uint16), f"yz{k}")]
        nodes += [helper.make_node("QuantizeLinear", [f"y{k}", f"ys{k}", f"yz{k}"], [f"yq{k}"]),
                  helper.make_node("DequantizeLinear", [f"yq{k}", f"ys{k}", f"yz{k}"], [f"out{k}"])]
        oshape = [1, O, 1, seq] if kind == "conv" else [1, seq, O]
        outs.append(helper.make_tensor_value_info(f"out{k}", TensorProto.FLOAT, oshape))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, xshape)], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]); m.ir_version = 10
    onnx.save(m, str(path))

def run(kind, O, I, n, seq=1, kit=None):
    """Compile both (same file names in two folders: the graph names in the bins match)."""
    with tempfile.TemporaryDirectory() as t:
        t = Path(t); bins = {}
        for bits in (4, 8):
            d = t / str(bits); d.mkdir()
            src = d / "m.onnx"; model(kind, O, I, n, bits, seq, src)
            kit.compile([(src, d / "ctx.onnx")], EP, lambda l: None, 600)
            (b,) = [p for p in d.glob("ctx*.bin")]
            bins[bits] = b
        a, b = metadata_words(bins[8]), metadata_words(bins[4])
        diffs = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y]
        s = weights_shrink(bins[8], bins[4])
        print(f"{kind} W[{O},{I}] x{n} seq{seq}: files {bins[8].stat().st_size} {bins[4].stat().st_size}; "
              f"declared saving {n*O*I//2}; shrink {s}; diffs {diffs}", flush=True)

def main(specs: list) -> int:
    if not specs:
        print(__doc__, file=sys.stderr)
        return 2
    kit = ensure_kit(ROOT)
    for spec in specs:
        kind, O, I, n, *rest = spec.split(",")
        run(kind, int(O), int(I), int(n), int(rest[0]) if rest else 1, kit)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
