"""The float reference: a float ONNX graph run by onnxruntime, as a part session's graph.

`OnnxGraph` is the other `GraphExecutor` next to the interpreter's `GraphRunner`: verify compares
the bundle with it, and `scripts/generate.py --engine onnx` generates through it.

Heavy imports (onnx, onnxruntime) happen inside the methods: a no-op `doit` must stay fast.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from hexbundle.runtime.sessions import IoInfo
from hexbundle.support.errors import VerifyError


class OnnxGraph:
    """A float ONNX graph run by onnxruntime; the session is created on first use, dropped by close()."""

    def __init__(self, path: Path, optimize: bool = True, source: Path = None):
        import onnx
        self.optimize = optimize   # off: no fusion may change what a node computes (runtime.qdq)
        # messages name the export's ONNX; `path` may be its quantized reference (runtime.qdq)
        self.source = Path(source or path)
        self.what = "the float ONNX's quantized reference" if source else "the float ONNX"
        if not Path(path).is_file():
            raise VerifyError(f"{path}: the float ONNX is missing; run `doit inputs` or put the "
                              f"export there")
        self.path = Path(path)
        model = onnx.load(str(path), load_external_data=False)
        self.name = model.graph.name
        self.ir_version = model.ir_version
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
            # onnxruntime's telemetry writes ~/.cache/Microsoft/DeveloperTools/.onnxruntime/
            # (a device id, a database) and $TMPDIR/.ses when it is imported: files of the user's
            # outside the build root, on every `doit verify`. Off unless the user turned it on.
            os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
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
            # onnxruntime's arena keeps what a run allocated, rounded up, for the next: off,
            # the 7B shape's last part (LM head) peaks at 3.30 GiB instead of 3.48 (one prompt
            # chunk, measured), in the same time
            options.enable_cpu_mem_arena = False
            if not self.optimize:
                options.graph_optimization_level = \
                    onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
            self._session = self._open(onnxruntime, options)
        names = [o.name for o in self.outputs]
        return dict(zip(names, self._session.run(names, feeds)))

    def _open(self, onnxruntime, options):
        try:
            return onnxruntime.InferenceSession(str(self.path), options,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:   # onnxruntime raises its own Fail/InvalidGraph/... types
            text = str(exc).strip()
            if "IR version" in text:
                # qai-hub-models exports are IR 11: an older onnxruntime refuses them outright
                found = re.search(r"Unsupported model IR version[^\n]*", text)
                detail = found.group(0) if found else text
                raise VerifyError(
                    f"{self.source}: onnxruntime {onnxruntime.__version__} cannot load IR version "
                    f"{self.ir_version} ({detail}); upgrade it (python3 -m pip install -U "
                    f"onnxruntime) or re-export the model with a lower IR version") from None
            detail = text.splitlines()[0] if text else type(exc).__name__
            if len(detail) > 500:
                detail = detail[:500] + "..."
            raise VerifyError(
                f"{self.source}: onnxruntime {onnxruntime.__version__} refused {self.what} "
                f"({type(exc).__name__}: {detail}); check the export (python3 -c \"import onnx; "
                f"onnx.checker.check_model('{self.source}', full_check=True)\") and rebuild its "
                "inputs") from None

    def close(self) -> None:
        if self._session is not None:
            self._session = None
            return_freed_memory()


def return_freed_memory() -> None:
    """Give the heap glibc keeps after a session is dropped back to the system (malloc_trim).
    Without it ~0.6 GB of a 7B-shaped part's freed session stays resident into the next part,
    under the next session's weights (verify's peak RSS). A no-op where there is no glibc."""
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass
