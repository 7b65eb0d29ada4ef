"""Makes the real QNN context binaries in this folder with Qualcomm's own HTP compiler (QAIRT
2.51.0's x64 QnnHtp.dll from the onnxruntime-qnn wheel requirements/ortqnn.txt pins, through
ONNX Runtime's QNN EP under Wine: hexbundle/backends/ortqnn_kit.py). Run from the project root
after `python3 -m doit ortqnn_kit`:

    python3 tests/data/qualcomm/make_ortqnn_fixtures.py [OUT_DIR]

A two-layer MLP (64 -> 256 -> 64, ReLU) quantized by onnxruntime.quantization (QDQ, uint16
activations, per-channel weights), as a prompt graph [1,8,64] and a token graph [1,1,64] over
the same weights:
  mlp_int8_shared_qnn.bin    prompt + token in ONE bin, weights stored once (soc_model 77, v73)
  mlp_int8_prompt_qnn.bin    the prompt graph alone, int8 weights
  mlp_int8_token_qnn.bin     the token graph alone, int8 weights
  mlp_int4_prompt_qnn.bin    the prompt graph alone, int4 weights (packed two to a byte)
and each bin's EPContext model (*.onnx) beside it; and
  mlp_int8_prompt.dlc        the prompt graph's real DLC, written by QnnIr.dll
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

EP_OPTIONS = {"backend_path": "QnnHtp.dll", "soc_model": "77", "htp_arch": "73",
              "htp_graph_finalization_optimization_mode": "3"}
HIDDEN, INNER = 64, 256


def mlp_weights():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((HIDDEN, INNER)).astype(np.float32) * 0.1,
            rng.standard_normal((INNER, HIDDEN)).astype(np.float32) * 0.1)


def qdq_mlp(seq: int, weight_bits: int, out: Path) -> Path:
    """The MLP for `seq` positions, QDQ-quantized (weights int8 or int4 per channel)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    w1, w2 = mlp_weights()
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, HIDDEN])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    float_path = out.with_suffix(".float.onnx")
    onnx.save(model, str(float_path))
    rng = np.random.default_rng(1)
    samples = iter([{"x": rng.standard_normal((1, seq, HIDDEN)).astype(np.float32)}
                    for _ in range(4)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(samples, None)

    quantize_static(str(float_path), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt16, per_channel=True,
                    weight_type=QuantType.QInt4 if weight_bits == 4 else QuantType.QInt8)
    float_path.unlink()
    return out


def main(out_dir: Path) -> None:
    """The bins are compiled in a scratch dir with relative names (Kit.compile): the graph
    names ONNX Runtime hashes into them do not depend on where this runs."""
    from hexbundle.backends.ortqnn_kit import ensure_kit
    kit = ensure_kit(ROOT)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prompt8 = qdq_mlp(8, 8, tmp / "prompt8.onnx")
        token8 = qdq_mlp(1, 8, tmp / "token8.onnx")
        prompt4 = qdq_mlp(8, 4, tmp / "prompt4.onnx")
        kit.compile([(prompt8, tmp / "mlp_int8_shared.onnx"),
                     (token8, tmp / "mlp_int8_shared_token.onnx")], EP_OPTIONS, print, 600)
        kit.compile([(prompt8, tmp / "mlp_int8_prompt.onnx")], EP_OPTIONS, print, 600)
        kit.compile([(token8, tmp / "mlp_int8_token.onnx")], EP_OPTIONS, print, 600)
        kit.compile([(prompt4, tmp / "mlp_int4_prompt.onnx")], EP_OPTIONS, print, 600)
        (dlc,) = kit.dump_dlc(prompt8, tmp / "dlc", {"backend_path": "QnnHtp.dll"}, print, 600)
        dlc.replace(tmp / "mlp_int8_prompt.dlc")
        for made in sorted(tmp.glob("mlp_*")):
            shutil.copyfile(made, out_dir / made.name)
    for path in sorted(out_dir.glob("mlp_*")):
        print(f"{path.name}: {path.stat().st_size} B")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
