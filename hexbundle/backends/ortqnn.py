"""Backend "ortqnn": Qualcomm's own HTP compiler (QAIRT's x64 QnnHtp.dll, from the pinned
onnxruntime-qnn wheel) through ONNX Runtime's QNN execution provider, under Wine on Linux.

convert: a graph's QDQ ONNX, the export's graph with its AIMET encodings applied
  (runtime/qdq.write_qdq_model, integer_weights: each weight as its integers + DequantizeLinear,
  4-bit weights packed two to a byte), one self-contained file at the step's output path (the
  file under dlc/ is this ONNX, not a DLC). HTP compiles an integer graph, so the tensors the
  export leaves float get encodings here, and the log counts them:
    - a float weight (norm scale, bias, constant): 16-bit, from its own range (qdq.py);
    - an activation without an encoding: 16-bit, from its range over CALIBRATION_RUNS runs of
      each of the part's graphs in onnxruntime (united by name: one encoding for the part's
      graphs), on inputs as a first call meets them (_input_feed).
compile: a part's graphs into ONE context binary (ortqnn_driver.c: EPContext weight sharing,
  weights stored once) for the device's soc_model and dsp_arch; its header, targets and QAIRT
  build string read back from its bytes (formats/qnn_context.py, formats/qairt_version.py) and
  logged. The graphs inside are named by ONNX Runtime (`QNN_QNN_<hash>_<n>_0`), not
  `prompt_ar128_cl4096_1_of_3`: the EP gives no way to name them (docs/backends.md).
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from hexbundle.config.backend_options import CompileOptions, ConvertOptions
from hexbundle.backends.ortqnn_kit import ensure_kit, kit_fingerprint, qnn_pin
from hexbundle.config.toolchain import project_root
from hexbundle.formats.onnxfile import load_structure
from hexbundle.formats.qairt_version import read_file_release
from hexbundle.formats.qnn_context import is_qnn_context, read_qnn_context
from hexbundle.runtime.conventions import (ATTENTION_MASK, POSITION_COS, POSITION_SIN,
                                          causal_mask, is_kv)
from hexbundle.support.atomic import commit, output_path, temp_dir
from hexbundle.support.errors import BackendError, FormatError

QAIRT_RELEASE = "2.51.0"           # what requirements/ortqnn.txt's onnxruntime-qnn carries
ACTIVATION_BITWIDTH = 16           # an activation the export leaves unencoded (a16)
CALIBRATION_RUNS = 4
# A derived range is the calibrated one times this: real inputs reach past what 4 runs on drawn
# inputs see (the Qwen3 checkpoint's part 2 on verify's prompt: 75 of its 193 derived tensors,
# up to 1.19x), and HTP computes an RMSNorm whole (fused), ignoring its inner encodings, so
# a value the QDQ models clip there is a difference between the simulator and the reference
# (issue 48). One bit of the 16 covers them. Measured by `doit verify` (its simulated-reference
# floor, LSB of the 16-bit output): q3 (the Qwen3 checkpoint) 2614 without, 842 with; the
# qwen2-tiny model, which clips nothing, pays for the coarser grids: 49 without, 99 with.
CALIBRATION_HEADROOM = 2.0
TIMEOUT_ENV = "HEXBUNDLE_ORTQNN_TIMEOUT"
DEFAULT_TIMEOUT = 1800.0           # seconds for one part's compile under Wine


def _timeout() -> float:
    try:
        return float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT)
    except ValueError:
        raise BackendError(f"{TIMEOUT_ENV}={os.environ[TIMEOUT_ENV]!r} is not a number of "
                           "seconds") from None


class OrtQnnBackend:
    name = "ortqnn"
    # Real HTP bins and the board runtime of their release, but no board's Genie can use them
    # yet: their graph names (docs/backends.md; the manifest's runtime.deployment says why)
    deployable = False
    checks_weight_values = False      # the convert step scans them before (steps/convert.py)
    marks_outputs = False             # QnnIr's DLC and QNN's context binary: no place for a key

    def toolchain_version(self) -> str:
        """In every step's key (backends.describe): a change of the pins or of the driver's
        source changes it, so convert and compile rerun."""
        root = project_root()
        return (f"QAIRT {QAIRT_RELEASE} (onnxruntime-qnn {qnn_pin(root).version}, kit "
                f"{kit_fingerprint(root)})")

    # The step's output key (`made_for`, steps/outputkey.py) has no place in Qualcomm's DLC or
    # context binary: not recorded, and made_for() answers None (docs/remote-cache.md: what a
    # cache must be trusted with, remote_cache_trust), as for the qairt backend.
    def made_for(self, path: Path) -> None:
        return None

    # ---------------------------------------------------------------------------------- convert

    def convert(self, onnx_path: Path, encodings_path: Path, dlc_path: Path, graph_name: str,
                options: ConvertOptions, log: Callable[[str], None], made_for: str = "",
                part_graphs: tuple = ()) -> None:
        from hexbundle.runtime.qdq import write_qdq_model
        with temp_dir(dlc_path.parent, dlc_path.name) as scratch:
            derived = derived_activations([(onnx_path, encodings_path), *part_graphs],
                                          scratch / "calibrate", options.float_bitwidth)
            final = write_qdq_model(onnx_path, encodings_path, scratch / "final", name=graph_name,
                                    float_bitwidth=options.float_bitwidth, integer_weights=True,
                                    activations=derived)
            with output_path(dlc_path) as out:
                _save_self_contained(final, out)
            log_real_dlc(dlc_path, scratch / "qnn-ir", log)
        log(f"{dlc_path.name}: the QDQ ONNX of {graph_name} ({dlc_path.stat().st_size} B; "
            f"{len(derived)} activations without an encoding given {ACTIVATION_BITWIDTH}-bit "
            f"ranges from {CALIBRATION_RUNS} calibration runs of each of the part's "
            f"{1 + len(part_graphs)} graphs)")

    def check_dlc(self, dlc_path: Path, graph_name: str, log: Callable[[str], None]) -> None:
        model = load_structure(dlc_path)
        if not any(n.op_type == "DequantizeLinear" for n in model.graph.node):
            raise BackendError(f"{dlc_path}: not an ortqnn QDQ model of {graph_name} (no "
                               "DequantizeLinear); rebuild it with `doit convert`")
        log(f"{dlc_path.name}: a QDQ ONNX model")

    # ---------------------------------------------------------------------------------- compile

    def compile(self, dlc_paths: list, bin_path: Path, options: CompileOptions,
                log: Callable[[str], None], made_for: str = "") -> None:
        kit = ensure_kit(project_root())
        with temp_dir(bin_path.parent, bin_path.name) as scratch:
            (scratch / "ctx").mkdir()
            pairs = []   # the models beside their outputs (Kit.compile runs there)
            for dlc, name in zip(dlc_paths, options.graph_names):
                model = scratch / "ctx" / f"{name}.model.onnx"
                link_or_copy(dlc, model)
                pairs.append((model, scratch / "ctx" / f"{name}.onnx"))
            started = time.monotonic()
            kit.compile(pairs, ep_options(options), log, _timeout())
            log(f"compiled {len(pairs)} graphs in {time.monotonic() - started:.1f} s "
                "(Wine start included)")
            made = scratch / "ctx" / f"{options.graph_names[0]}_qnn.bin"
            if not made.is_file():
                raise BackendError(f"the QNN EP wrote no context binary {made.name} (it wrote: "
                                   + ", ".join(p.name for p in (scratch / "ctx").iterdir()) + ")")
            self.check_bin(made, options, log)
            commit(made, bin_path)

    def check_bin(self, bin_path: Path, options: CompileOptions,
                  log: Callable[[str], None]) -> None:
        """A real context binary for the device's dsp_arch, with a QAIRT build string of the
        pinned release; logs what its bytes say."""
        if not is_qnn_context(bin_path):
            raise FormatError(f"{bin_path}: not a QNN context binary; rebuild it with "
                              "`doit compile`")
        facts = read_qnn_context(bin_path)
        release = read_file_release(bin_path)
        arch = int(options.device.dsp_arch.lstrip("v"))
        if not facts.targets or any(a != arch for _, a in facts.targets):
            raise BackendError(f"{bin_path}: compiled for {facts.targets or 'no target'}, not "
                               f"dsp_arch {options.device.dsp_arch}")
        if release.release is None or release.release.dotted != QAIRT_RELEASE:
            raise BackendError(f"{bin_path}: QAIRT build string {release.describe()}, not "
                               f"{QAIRT_RELEASE}")
        h = facts.header
        log(f"{bin_path.name}: QNN context binary, {bin_path.stat().st_size} B (metadata "
            f"{h.metadata_size} B, payload {h.payload_size} B at {h.payload_offset}); build "
            f"{release.release.text}; soc_model {options.device.soc_model} is QAIRT's "
            + ", ".join(f"{s} v{a}" for s, a in facts.targets)
            + f"; vtcm {', '.join(str(v) for v in facts.vtcm_sizes)} B")

    def compile_unpacked_probe(self, dlc_paths: list, options: CompileOptions, scratch: Path,
                               log: Callable[[str], None]) -> Path:
        """The size check's yardstick (checks/sizes.py): this part's bin compiled again, in the
        same run, from the same QDQ models with every 4-bit weight stored one per byte
        (INT4/UINT4 -> INT8/UINT8, the same integers). Same graphs, so the same HTP program
        and container: it differs from a faithful bin in the weights' bytes."""
        (scratch / "probe").mkdir(parents=True, exist_ok=True)
        probes = []
        for dlc in dlc_paths:
            probe = scratch / "probe" / dlc.name
            widen_4bit_weights(dlc, probe)
            probes.append(probe)
        out = scratch / "probe" / "unpacked.bin"
        self.compile(probes, out, options, log)
        return out

    def compile_packed_reference(self, dlc_paths: list, declared: frozenset,
                                 options: CompileOptions, scratch: Path,
                                 log: Callable[[str], None]) -> Optional[Path]:
        """The size check's second yardstick: this part compiled from the same QDQ models with
        every weight its encodings declare 4-bit (`declared`: weight names) stored as INT4/UINT4,
        whatever the convert wrote. HTP does not store every 4-bit tensor in half the bytes
        (it pads some tensors' rows: docs/backends.md), so what packing saves is measured on
        this compile, not computed. None when the models already store every declared weight
        as 4 bits: then the reference is the bin's own inputs, and the compile is
        deterministic (tests/test_ortqnn.py), so the bin itself is the reference."""
        (scratch / "reference").mkdir(parents=True, exist_ok=True)
        models, narrowed = [], 0
        for dlc in dlc_paths:
            model = scratch / "reference" / dlc.name
            count = narrow_declared_4bit(dlc, model, declared)
            narrowed += count
            models.append(model if count else dlc)
        if not narrowed:
            return None
        log(f"size check: {narrowed} declared 4-bit values were stored wider; compiling the "
            "part with them as 4 bits for reference")
        out = scratch / "reference" / "packed.bin"
        self.compile(models, out, options, log)
        return out


def derived_activations(graphs: list, scratch: Path, float_bitwidth: int) -> dict:
    """The encodings convert gives the activations the export leaves float, for a part's graphs
    (`graphs`: [(onnx, encodings)], each of the part's graphs): ACTIVATION_BITWIDTH bits over
    each tensor's range in CALIBRATION_RUNS onnxruntime runs of every graph, united by name
    and widened by CALIBRATION_HEADROOM (calibrate, seeded: the same ranges every time). So a part's prompt and token graphs give
    a tensor one encoding, as the export's one encodings file does, and the token graph's is
    not its own 4 rows': calibrated alone, the Qwen3 checkpoint's part 2 token graph clipped a
    k norm's mean square at 0.72 where a decode step reached 0.97 (issue 48). `doit verify`
    derives them again from the export's files for its references of an ortqnn bundle
    (checks/simulated.derived_for)."""
    from hexbundle.runtime.qdq import derived_encodings, write_qdq_model
    ranges, constants = {}, set()
    for index, (onnx_path, encodings_path) in enumerate(graphs):
        first = write_qdq_model(Path(onnx_path), Path(encodings_path), scratch / f"graph{index}",
                                name=Path(onnx_path).stem, float_bitwidth=float_bitwidth,
                                integer_weights=True)
        for name, (lo, hi) in calibrate(first, Path(onnx_path)).items():
            was = ranges.get(name, (lo, hi))
            ranges[name] = (min(was[0], lo), max(was[1], hi))
        constants |= {o for n in load_structure(Path(onnx_path)).graph.node
                      if n.op_type == "Constant" for o in n.output}
    # a Constant's range is its value, which stays exact at the grid's end: HTP squares with
    # Pow's exponent only where it is exactly 2 (off the grid, part 2's first Pow was 22489
    # LSB off on the simulator)
    return derived_encodings({name: (lo, hi) if name in constants else
                              (lo * CALIBRATION_HEADROOM, hi * CALIBRATION_HEADROOM)
                              for name, (lo, hi) in ranges.items()}, ACTIVATION_BITWIDTH)


def link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def log_real_dlc(model: Path, scratch: Path, log: Callable[[str], None]) -> None:
    """The graph's real DLC, written by QAIRT's QnnIr.dll through the EP, read back and logged
    (its members and the converterVersion it states). Not kept: its metadata carry the time of
    writing, and the compile takes the QDQ ONNX, not the DLC."""
    from hexbundle.formats.qairt_version import parse_release
    from hexbundle.formats.qnn_dlc import read_qnn_dlc
    kit = ensure_kit(project_root())
    dlcs = kit.dump_dlc(model, scratch, {"backend_path": "QnnHtp.dll"}, log, _timeout())
    if not dlcs:
        raise BackendError(f"{model}: QnnIr.dll wrote no DLC of it")
    for dlc in dlcs:
        info = read_qnn_dlc(dlc)
        release = parse_release(info.converter_version)
        if release is None or release.dotted != QAIRT_RELEASE:
            raise BackendError(f"{dlc.name}: converterVersion {info.converter_version!r}, not "
                               f"QAIRT {QAIRT_RELEASE}")
        log(f"real DLC by QnnIr.dll ({info.tool}): {dlc.name}, {dlc.stat().st_size} B, members "
            + ", ".join(f"{n} {b} B" for n, b in sorted(info.members.items()))
            + f"; converterVersion {info.converter_version}")


def ep_options(options: CompileOptions) -> dict:
    """The QNN EP's options for a compile: QnnHtp.dll, the device, the optimization level."""
    device = options.device
    out = {"backend_path": "QnnHtp.dll", "soc_model": str(device.soc_model),
           "htp_arch": device.dsp_arch.lstrip("v"),
           "htp_graph_finalization_optimization_mode": str(options.optimization_type)}
    if device.vtcm_mb:
        out["vtcm_mb"] = str(device.vtcm_mb)
    return out


# ==================================================================================== convert


def widen_4bit_weights(model_path: Path, out: Path) -> int:
    """The QDQ model with every 4-bit initializer (INT4/UINT4: weights and their zero points)
    stored as 8-bit integers of the same values: what a convert that lost weights packing
    writes. Returns how many 4-bit values it widened."""
    import onnx
    from onnx import TensorProto, numpy_helper
    model = onnx.load(str(model_path), load_external_data=True)
    wider = {TensorProto.INT4: np.int8, TensorProto.UINT4: np.uint8}
    count = 0
    for init in model.graph.initializer:
        if init.data_type in wider:
            values = numpy_helper.to_array(init)
            count += values.size
            init.CopyFrom(numpy_helper.from_array(values.astype(wider[init.data_type]), init.name))
    onnx.save(model, str(out))
    return count


def narrow_declared_4bit(model_path: Path, out: Path, declared: frozenset) -> int:
    """The QDQ model with each weight named in `declared` (its integers `<name>__q`, its zero
    point `<name>__zero_point`, as runtime/qdq.py writes them) stored as INT4/UINT4 when it
    was written as INT8/UINT8. Writes `out` only when something changed; returns how many
    values it narrowed. A declared 4-bit weight whose integers leave the 4-bit range was not
    quantized to its encoding: BackendError naming it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    model = onnx.load(str(model_path), load_external_data=True)
    narrower = {TensorProto.INT8: (TensorProto.INT4, -8, 7),
                TensorProto.UINT8: (TensorProto.UINT4, 0, 15)}
    names = {f"{n}__q" for n in declared} | {f"{n}__zero_point" for n in declared}
    count = 0
    for init in model.graph.initializer:
        if init.name not in names or init.data_type not in narrower:
            continue
        to, lo, hi = narrower[init.data_type]
        values = numpy_helper.to_array(init)
        if values.size and (values.min() < lo or values.max() > hi):
            raise BackendError(f"{model_path}: '{init.name}' holds integers {values.min()}.."
                               f"{values.max()}, outside the 4 bits its encoding declares: the "
                               "convert did not quantize it to its encoding; rebuild with "
                               "`doit convert`")
        count += values.size
        init.CopyFrom(helper.make_tensor(init.name, to, values.shape,
                                         values.reshape(-1).tolist()))
    if count:
        onnx.save(model, str(out))
    return count


def _save_self_contained(model_path: Path, out: Path) -> None:
    """The QDQ model with its weights inside (one file: the step's one output)."""
    import onnx
    model = onnx.load(str(model_path), load_external_data=True)
    onnx.save(model, str(out))


def _calibration_feeds(inputs, encodings: dict, rng) -> dict:
    """One calibration run's inputs (_input_feed); cos and sin of the same random angles."""
    feeds = {i.name: _input_feed(i, encodings.get(i.name), rng) for i in inputs}
    if POSITION_COS in feeds and POSITION_SIN in feeds:
        angles = rng.uniform(0.0, 2 * np.pi, feeds[POSITION_COS].shape)
        feeds[POSITION_COS] = np.cos(angles).astype(np.float32)
        feeds[POSITION_SIN] = np.sin(angles).astype(np.float32)
    return feeds


def _input_feed(value_info, encoding, rng) -> np.ndarray:
    """A calibration input, as the graph meets it on its first call: the mask causal over the new
    rows with no past (the token graph's one row attends to itself), so the past KV cache is
    masked out (zeros); cos/sin of random angles (_calibration_feeds: cos^2 + sin^2 = 1, RoPE
    keeps a vector's norm, as real positions do); the main input drawn inside its encoding's
    range; integer inputs (token ids) small ids. A mask of zeros over a random past averaged
    the attention over thousands of random values instead: in the Qwen3 checkpoint's part 2
    the residual stream stayed ~20x below its encoding, and the range derived for the next
    RMSNorm's mean square 580x below the real one, which the QDQ models then clipped
    (issue 48)."""
    from onnx import TensorProto
    shape = [d.dim_value or 1 for d in value_info.type.tensor_type.shape.dim]
    elem = value_info.type.tensor_type.elem_type
    if elem in (TensorProto.INT64, TensorProto.INT32):
        return rng.integers(0, 100, shape).astype(np.int64 if elem == TensorProto.INT64 else np.int32)
    name = value_info.name
    if name == ATTENTION_MASK:
        return causal_mask(shape[-2], shape[-1], 0).reshape(shape)
    if is_kv(name) or encoding is None or not encoding.is_int:
        return np.zeros(shape, np.float32)
    scale, offset = float(encoding.scale[0]), float(encoding.offset[0])
    lo, hi = offset * scale, (offset + 2 ** encoding.bitwidth - 1) * scale
    return np.clip(rng.normal(0.0, (hi - lo) / 8, shape), lo, hi).astype(np.float32)


def calibrate(model_path: Path, source: Path) -> dict:
    """(lo, hi) of every float tensor a node makes that has no Q/DQ after it yet, over
    CALIBRATION_RUNS runs of the QDQ model in onnxruntime (CPU, no graph optimization). Which
    tensors are float: shape inference of the export's own graph (`source`: standard ops only,
    where the QDQ model's com.microsoft Q/DQ would stop it; qdq.py keeps producers' names)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, shape_inference
    model = onnx.load(str(model_path), load_external_data=False)
    inferred = shape_inference.infer_shapes(load_structure(source))
    types = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    quantized = {i for n in model.graph.node if n.op_type in ("QuantizeLinear",) for i in n.input}
    dq_outputs = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    wanted = [o for n in model.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
              for o in n.output if o and o not in quantized and o not in dq_outputs
              and o in types and types[o].type.tensor_type.elem_type == TensorProto.FLOAT]
    existing = {o.name for o in model.graph.output}
    model.graph.output.extend(types[o] for o in wanted if o not in existing)
    staged = model_path.with_name(model_path.stem + ".calibrate.onnx")
    onnx.save(model, str(staged))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    session = ort.InferenceSession(str(staged), so, providers=["CPUExecutionProvider"])
    encodings = _input_encodings(model)
    rng = np.random.default_rng(0)
    ranges = {}
    for _ in range(CALIBRATION_RUNS):
        feeds = _calibration_feeds(model.graph.input, encodings, rng)
        for name, value in zip(wanted, session.run(wanted, feeds)):
            finite = value[np.isfinite(value)]
            if finite.size:
                lo, hi = ranges.get(name, (0.0, 0.0))
                ranges[name] = (min(lo, float(finite.min())), max(hi, float(finite.max())))
    return ranges


def _input_encodings(model) -> dict:
    """Graph input -> its activation encoding, read back from the Q/DQ pair qdq.py put after it
    (QuantizeLinear(input, scale, zero_point))."""
    from onnx import numpy_helper

    class _Enc:
        is_int = True

        def __init__(self, scale, zero_point, bits):
            self.scale, self.offset, self.bitwidth = [scale], [-zero_point], bits

    inits = {i.name: i for i in model.graph.initializer}
    inputs = {i.name for i in model.graph.input}
    out = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] in inputs and len(node.input) == 3:
            scale = float(numpy_helper.to_array(inits[node.input[1]]))
            zp = numpy_helper.to_array(inits[node.input[2]])
            out[node.input[0]] = _Enc(scale, float(zp), zp.dtype.itemsize * 8)
    return out
