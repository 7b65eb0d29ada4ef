"""Stand-in for the QAIRT SDK's Python API (tests only): records calls, writes small JSON files."""
import json
import logging
import os
import tempfile
from pathlib import Path

from qairt._standin import mode, record, sdk_build
from qairt.api.compiler.config import CompileConfig
from qairt.utils.loggers import get_logger, maybe_suppress_stdout

__sdk_version__ = "2.42.0.251225"
_convert_logger = get_logger("qairt.convert")
_compile_logger = get_logger("qairt.compile")
_qti_logger = get_logger("qti.aisw.converters")
_log = logging.getLogger("qairt.standin")      # an ordinary logger: propagates to the root


def _working_dir(strays):
    """A working directory in QAIRT_TMP_DIR, as qairt.convert / qairt.compile make one, with
    the side files the real save() copies next to its target."""
    root = os.getenv("QAIRT_TMP_DIR", default=tempfile.gettempdir())
    path = Path(tempfile.mkdtemp(prefix="temp_working_dir_", dir=root))
    for name in strays:
        (path / name).write_text("stray\n")
    return path


class _Module:
    def __init__(self, path, graphs):
        self.path, self._graphs = path, list(graphs)
        self.working_directory = None

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
        # as the real Model.save: every *.safetensors / *.encodings of the working directory
        # is copied next to the target
        source = self.module.working_directory
        if source and Path(source).exists():
            for file in Path(source).iterdir():
                if file.suffix in (".safetensors", ".encodings"):
                    (Path(path).parent / file.name).write_bytes(file.read_bytes())
        return str(path)

    def standin_record(self):
        return {"model": self.name, "path": self.module.path, "graphs": self.module.graph_names()}


class CompiledModel(Model):
    def save(self, path="", **kwargs):
        record("CompiledModel.save", path, **kwargs)
        doc = {"standin": "ctxbin", "graphs": self.module.graph_names(), **self.module.info}
        text = json.dumps(doc, sort_keys=True) + "\n"
        # $STANDIN_QAIRT_BIN_BYTES ({"<bin name>": bytes}): padded with blanks (still JSON) to
        # the size the size model expects, so a bundle step's size check passes
        sizes = json.loads(os.environ.get("STANDIN_QAIRT_BIN_BYTES") or "{}")
        want = sizes.get(Path(path).name, 0)
        Path(path).write_text(text + " " * max(0, want - len(text)))
        # as the real CompiledModel.save: other *.bin files of the working directory too
        source = self.module.working_directory
        if source is not None:
            for file in Path(source).iterdir():
                if file.suffix == ".bin" and file.stem != self.name:
                    (Path(path).parent / file.name).write_bytes(file.read_bytes())
        return str(path)


def convert(model, encodings=None, calibration_config=None, backend="HTP", **extra_args):
    record("qairt.convert", model, encodings=encodings, calibration_config=calibration_config,
           backend=backend, **extra_args)
    _convert_logger.info("Starting model conversion...")
    # ConverterConfig(**extra_args): extra="allow", but a declared field is checked
    if extra_args.get("float_precision", 32) not in (32, 16):
        raise ValueError("1 validation error for ConverterConfig\nfloat_precision\n  Input "
                         "should be 32 or 16")
    if mode() == "error_log":
        _convert_logger.error("Failed to apply encodings for tensor 'lm_head.weight'")
    if mode() == "qti_error":
        _qti_logger.error("Op 'Gather' of node '/model/embed_tokens/Gather': int64 indices")
    graph = Path(model).stem
    module = _Module("", [graph])
    module.working_directory = _working_dir([f"{graph}.safetensors", f"{graph}.encodings"])
    module.info = {"graph": graph, "onnx": str(model), "encodings": str(encodings),
                   "float_precision": extra_args.get("float_precision", 32)}
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
    # As the real one: fd 1 is muted while the binary is generated unless qairt.compile is at
    # DEBUG; what the C++ side prints comes through file descriptors, not Python.
    with maybe_suppress_stdout(logger=_compile_logger):
        os.write(1, b"[ INFO ] standin context-binary generator: composing graphs\n")
        if mode() == "unknown_key":
            os.write(1, b"[ ERROR ] Unknown Key graphs/0/weights_packing passed in config\n")
        if mode() == "compile_error_log":
            _compile_logger.error("Graph prompt_ar128_cl256_1_of_4: VTCM overflow, spilling")
    _compile_logger.info("Compiled model: %s for backend: %s", models[0].name, config.backend)
    _log.info("Compiled model: %s for backend: %s", models[0].name, config.backend)
    if mode() == "raise":
        raise RuntimeError("Could not create compiled binary")
    graphs = [g for m in models for g in m.module.graph_names()]
    module = _Module("", graphs)
    module.working_directory = _working_dir([f"{models[0].name}.bin", "adapter_weights.bin"])
    module.info = {"dlcs": [m.module.path for m in models], "config": repr(config),
                   **_binary_facts(graphs, config)}
    return CompiledModel(module, name=models[0].name)


def _binary_facts(graphs, config):
    """What the stand-in's context binary says about itself (read by the stand-in
    qnn-context-binary-utility): its graphs, device and weight buffers."""
    device = config.device_custom_configs[0] if config.device_custom_configs else None
    context = config.context_custom_configs[0] if config.context_custom_configs else None
    shared = bool(context and context.weight_sharing_enabled)
    soc_model = device.soc_model if device else 0
    dsp_arch = device.dsp_arch if device else None
    if mode() == "bin_missing_graph":
        graphs = graphs[:1]
    if mode() == "bin_two_copies":     # a weight_sharing_enabled the generator dropped
        shared = False
    if mode() == "bin_other_soc":
        soc_model = 69
    # the SDK build that made it, as qnn-context-binary-utility reports it (buildId)
    build = "v2.41.0.250101153012_190001" if mode() == "bin_other_build" else sdk_build()
    return {"device": {"soc_model": soc_model, "dsp_arch": dsp_arch}, "build_id": build,
            "weight_buffers": {g: (1 if shared else i + 1) for i, g in enumerate(graphs)},
            "graphs": graphs}
