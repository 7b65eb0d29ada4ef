"""Stand-in for the QAIRT SDK's Python API (tests only): records calls, writes small JSON files."""
import json
import logging
import os
from pathlib import Path

from qairt._standin import mode, record
from qairt.api.compiler.config import CompileConfig

__sdk_version__ = "2.42.0.251225"
_log = logging.getLogger("qairt.standin")


class _Module:
    def __init__(self, path, graphs):
        self.path, self._graphs = path, list(graphs)

    def graph_names(self):
        return list(self._graphs)


class Model:
    def __init__(self, module, name=""):
        self.module, self.name = module, name

    def save(self, path="", **kwargs):
        record("Model.save", path, **kwargs)
        doc = {"standin": "dlc", **self.module.info}
        Path(path).write_text(json.dumps(doc, sort_keys=True) + "\n")
        self.module.path = str(path)
        return str(path)

    def standin_record(self):
        return {"model": self.name, "path": self.module.path, "graphs": self.module.graph_names()}


class CompiledModel(Model):
    def save(self, path="", **kwargs):
        record("CompiledModel.save", path, **kwargs)
        doc = {"standin": "ctxbin", "graphs": self.module.graph_names(), **self.module.info}
        Path(path).write_text(json.dumps(doc, sort_keys=True) + "\n")
        return str(path)


def convert(model, encodings=None, calibration_config=None, backend="HTP", **extra_args):
    record("qairt.convert", model, encodings=encodings, calibration_config=calibration_config,
           backend=backend, **extra_args)
    _log.info("Starting model conversion...")
    if mode() == "error_log":
        _log.error("Failed to apply encodings for tensor 'lm_head.weight'")
    graph = Path(model).stem
    module = _Module("", [graph])
    module.info = {"graph": graph, "onnx": str(model), "encodings": str(encodings),
                   "float_bitwidth": extra_args.get("float_bitwidth")}
    return Model(module, name=graph)


def load(path, **load_args):
    record("qairt.load", path, **load_args)
    doc = json.loads(Path(path).read_text())
    if doc.get("standin") != "dlc":
        raise ValueError(f"Path: {path} could not be loaded as a DLC or Binary.")
    module = _Module(str(path), [doc["graph"]])
    module.info = {}
    return Model(module, name=doc["graph"])


def compile(model, *, backend=None, config=None):
    record("qairt.compile", model, backend=backend, config=config)
    if not isinstance(config, CompileConfig):
        raise TypeError("config must be a CompileConfig")
    models = model if isinstance(model, list) else [model]
    # What the C++ side prints comes through file descriptors, not Python.
    os.write(1, b"[ INFO ] standin context-binary generator: composing graphs\n")
    _log.info("Compiled model: %s for backend: %s", models[0].name, config.backend)
    if mode() == "unknown_key":
        os.write(2, b"[ ERROR ] Unknown Key graphs/0/weights_packing passed in config\n")
    if mode() == "raise":
        raise RuntimeError("Could not create compiled binary")
    graphs = [g for m in models for g in m.module.graph_names()]
    module = _Module("", graphs)
    module.info = {"dlcs": [m.module.path for m in models], "config": repr(config)}
    return CompiledModel(module, name=models[0].name)
