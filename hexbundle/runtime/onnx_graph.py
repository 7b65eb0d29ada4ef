"""The float reference: a float ONNX graph run by onnxruntime, as a part session's graph.

`OnnxGraph` is the other `GraphExecutor` next to the interpreter's `GraphRunner`: verify compares
the bundle with it, and `scripts/generate.py --engine onnx` generates through it.

Heavy imports (onnx, onnxruntime) happen inside the methods: a no-op `doit` must stay fast.
"""
from __future__ import annotations

import os
from pathlib import Path

from hexbundle.runtime.sessions import IoInfo
from hexbundle.support.errors import VerifyError


class OnnxGraph:
    """A float ONNX graph run by onnxruntime; the session is created on first use, dropped by close()."""

    def __init__(self, path: Path):
        import onnx
        if not Path(path).is_file():
            raise VerifyError(f"{path}: the float ONNX is missing; run `doit inputs` or put the "
                              f"export there")
        self.path = Path(path)
        model = onnx.load(str(path), load_external_data=False)
        self.name = model.graph.name
        initializers = {i.name for i in model.graph.initializer}

        def info(v):
            t = v.type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
            return IoInfo(v.name, dtype, tuple(d.dim_value for d in t.shape.dim))

        self.inputs = [info(v) for v in model.graph.input if v.name not in initializers]
        self.outputs = [info(v) for v in model.graph.output]
        self._session = None

    def run(self, feeds: dict) -> dict:
        if self._session is None:
            try:
                import onnxruntime
            except ImportError:
                raise VerifyError("the float reference needs onnxruntime: python3 -m pip "
                                  "install -e '.[verify]'") from None
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = min(4, os.cpu_count() or 1)
            # prepacking copies every MatMul weight while the session is created: 5.2 GB peak
            # instead of 3.4 GB for a 7B-shaped part of 3.1 GB float weights
            options.add_session_config_entry("session.disable_prepacking", "1")
            self._session = onnxruntime.InferenceSession(str(self.path), options,
                                                         providers=["CPUExecutionProvider"])
        names = [o.name for o in self.outputs]
        return dict(zip(names, self._session.run(names, feeds)))

    def close(self) -> None:
        self._session = None
