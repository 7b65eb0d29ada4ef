"""Validate a model's inputs before converting them: everything the build refuses, and why.

One module, used by the convert step (steps/convert.py, before the backend sees a file), the
local split (inputs/split.py, before cutting an unsplit graph) and `doit inspect`
(checks/inspect.py, which collects every problem instead of stopping at the first). The
tokenizer is validated by its one reader, formats/tokenizer.py; input files that are not
regular files (a FIFO would hang the reader) by support/files.py, which every reader asks.

* The ONNX (`check_onnx`, `structure_problems`): a regular file that parses; every initializer
  defined once; every external-data record a file name next to the ONNX, a regular file, its
  window inside it (formats/onnxfile.py); every node reads a tensor a graph input, an
  initializer or an earlier node produces, and each tensor is produced once; every op one ONNX
  defines at an opset ONNX knows; every float constant outside the weights' external data
  finite (inline initializers in any field, Constant/ConstantOfShape values and float
  attributes, in subgraphs and functions too); then onnx.checker's full check BY PATH (strict shape
  inference included): the checker parses the .onnx itself and never opens the external data,
  so a 7B part's weights are not loaded for it.
* The graph's inputs and outputs against the model config (`expected_io`, `io_problems`): names,
  dtypes and shapes a graph of that kind, AR, context length and part must declare (the
  conventions of runtime/conventions.py). An AR-1 token graph copied over the AR-128 prompt
  graph is refused naming the file, the input, the shape expected and the shape found.
* The weights' values (`WeightValueCheck`, `check_weight_values`): NaN or infinity, and a
  weight stored as float16 holding a value beyond float16's range (|x| > 65504), are errors
  naming the tensor and the element. Streamed block by block (formats/onnxfile.py), never a
  graph's weights at once; the reference backend runs the same check inside its conversion pass
  (no second read), other backends get a pass of their own before the SDK reads the files.

Every refusal is an InputError naming the file, the tensor, node or input, and what to do.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import onnx

from hexbundle.config.model import Architecture, Graph, Model, Part
from hexbundle.formats.onnxfile import initializer_values
from hexbundle.formats.qaihm import graph_io, load_structure
from hexbundle.runtime.conventions import (ATTENTION_MASK, POSITION_COS, POSITION_SIN,
                                           key_shape, kv_names, mask_shape, past_slots,
                                           rope_shape, value_shape)
from hexbundle.support.errors import HexbundleError, InputError

DEFAULT_DOMAINS = ("", "ai.onnx")
FLOAT16_MAX = float(np.finfo(np.float16).max)   # 65504: anything larger is not a float16
SHOWN_PROBLEMS = 4       # an error lists this many I/O mismatches, then counts the rest


# ============================================================================ the ONNX itself

def check_onnx(onnx_path: Path) -> onnx.ModelProto:
    """The model proto without its weights, once every structural check passed; else an
    InputError with the first problem (and how many more there are)."""
    model = load_structure(onnx_path)
    problems = structure_problems(onnx_path, model)
    if problems:
        raise InputError(_first_of(problems, onnx_path))
    return model


def structure_problems(onnx_path: Path, model: onnx.ModelProto,
                       records_broken: bool = False) -> list:
    """Every structural problem of a parsed ONNX, as messages. onnx.checker runs only when the
    checks before it passed: they say the same things more precisely. records_broken: the
    caller found a broken external-data record and reported it; neither the record check nor
    the checker (which stats the same files) says it again."""
    problems = []
    checks = (unique_initializers, dataflow, known_ops, finite_constants) if records_broken \
        else (unique_initializers, external_data_records, dataflow, known_ops, finite_constants)
    for check in checks:
        try:
            check(onnx_path, model)
        except HexbundleError as exc:
            problems.append(str(exc))
    if not problems and not records_broken:
        try:
            onnx_checker(onnx_path)
        except HexbundleError as exc:
            problems.append(str(exc))
    return problems


def unique_initializers(onnx_path: Path, model: onnx.ModelProto) -> None:
    """Two initializers of one name: which values a node reads would be a guess."""
    seen = set()
    for init in model.graph.initializer:
        if init.name in seen:
            count = sum(1 for i in model.graph.initializer if i.name == init.name)
            raise InputError(f"{onnx_path}: initializer '{init.name}' is defined {count} times; "
                             "a tensor has one definition: re-export the model")
        seen.add(init.name)


def external_data_records(onnx_path: Path, model: onnx.ModelProto) -> None:
    """Each tensor kept in external data (initializers, Constant values) points at a window
    that exists, in a data file (not the ONNX nor an encodings file), and no two tensors' windows
    share a byte; nothing is read."""
    windows = []
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            windows.append(initializer_values(init, onnx_path))
    for node in model.graph.node:
        for attribute in node.attribute:
            if (attribute.type == onnx.AttributeProto.TENSOR
                    and attribute.t.data_location == onnx.TensorProto.EXTERNAL):
                windows.append(initializer_values(attribute.t, onnx_path))
    no_aliases(onnx_path, windows)


# The files of a graph that hold something else than weights: external data read there would
# be the graph's structure or its encodings taken for weights.
NOT_DATA_SUFFIXES = (".onnx", ".encodings")


def no_aliases(onnx_path: Path, windows: list) -> None:
    """Refuse external data that aliases: a window in the ONNX itself or in an encodings file,
    or two tensors reading one window or overlapping ones (the second would be a copy of the
    first, or half of it). Inspect and convert both run this (structure_problems)."""
    this = onnx_path.resolve()
    by_file: dict = {}
    for values in windows:
        data = values.data_path.resolve()
        if data == this or data.suffix in NOT_DATA_SUFFIXES:
            what = "the ONNX itself" if data == this else "a graph's encodings file"
            raise InputError(f"{onnx_path}: tensor '{values.name}' keeps its values in {data}, "
                             f"{what}, not a data file: re-export the model (its external "
                             "data goes in a .data file of its own)")
        if values.nbytes:
            by_file.setdefault(data, []).append((values.offset, values.offset + values.nbytes,
                                                 values.name))
    for data, spans in by_file.items():
        spans.sort()
        for (start, end, name), (next_start, next_end, next_name) in zip(spans, spans[1:]):
            if next_start < end:
                same = (start, end) == (next_start, next_end)
                raise InputError(
                    f"{onnx_path}: tensors '{name}' (bytes {start}..{end}) and '{next_name}' "
                    f"(bytes {next_start}..{next_end}) of {data} "
                    + ("read the same window" if same else "read overlapping windows")
                    + ": each weight has bytes of its own in an export; re-export the model")


FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
               onnx.TensorProto.BFLOAT16)


def _constants(graph: onnx.GraphProto, where: str):
    """(where, tensor or float list) of every constant a graph holds outside its weights'
    external data: inline initializers, Constant / ConstantOfShape (any node's) tensor and float
    attributes, and the same inside every subgraph (If, Loop, Scan bodies)."""
    for init in graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            yield f"{where}initializer '{init.name}'", init
    for node in graph.node:
        label = f"{where}node '{node.name or node.output[0]}' ({node.op_type}) attribute"
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield f"{label} '{a.name}'", a.t
            elif a.type == onnx.AttributeProto.TENSORS:
                yield from ((f"{label} '{a.name}'[{i}]", t) for i, t in enumerate(a.tensors))
            elif a.type == onnx.AttributeProto.FLOAT:
                yield f"{label} '{a.name}'", [a.f]
            elif a.type == onnx.AttributeProto.FLOATS:
                yield f"{label} '{a.name}'", list(a.floats)
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from _constants(a.g, f"{label} '{a.name}' (subgraph): ")
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _constants(g, f"{label} '{a.name}' (subgraph): ")


def _non_finite(values: np.ndarray) -> Optional[tuple]:
    """(what, flat index) of the first NaN or infinity, or None."""
    bad = ~np.isfinite(values.astype(np.float32).reshape(-1))
    if not bad.any():
        return None
    index = int(np.argmax(bad))
    return ("NaN" if np.isnan(values.reshape(-1)[index]) else "infinity"), index


def finite_constants(onnx_path: Path, model: onnx.ModelProto) -> None:
    """Every float constant outside the weights' external data is finite (those are streamed
    by check_weight_values): inline initializers in any field (raw_data, float_data, ...),
    Constant / ConstantOfShape values, float attributes, in subgraphs and functions too. One
    NaN poisons every output it reaches, and the reference backend would carry it into the bin."""
    sources = [("", model.graph)] + [(f"function '{f.name}': ", onnx.helper.make_graph(
        f.node, f.name, [], [])) for f in model.functions]
    for where, graph in sources:
        for label, constant in _constants(graph, where):
            if isinstance(constant, list):
                values = np.asarray(constant, np.float32)
            elif constant.data_type not in FLOAT_TYPES:
                continue
            elif constant.data_location == onnx.TensorProto.EXTERNAL:
                tensor = initializer_values(constant, onnx_path)
                found = next(((what, rows.start * tensor.row_elements + index)
                              for rows, block in tensor.rows()
                              for what, index in filter(None, [_non_finite(block)])), None)
                values = None
            else:
                try:
                    values = onnx.numpy_helper.to_array(constant)
                except Exception:   # a malformed inline tensor: onnx.checker names it
                    continue
            if values is not None:
                found = _non_finite(values)
            if found:
                what, index = found
                raise InputError(f"{onnx_path}: {label} holds {what} (element {index}): a "
                                 "non-finite constant poisons every output it reaches; "
                                 "re-export the model")


def dataflow(onnx_path: Path, model: onnx.ModelProto) -> None:
    """Every node input is a graph input, an initializer or an earlier node's output; every
    tensor is produced once; every graph output is produced (top-level graph)."""
    graph = model.graph
    available = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    for index, node in enumerate(graph.node):
        label = f"node {node.name or index!r} ({node.op_type})"
        for name in node.input:
            if name and name not in available:
                raise InputError(f"{onnx_path}: {label} reads '{name}', which no graph input, "
                                 "initializer or earlier node produces; the graph is broken or "
                                 "its nodes are out of order: re-export the model")
        for name in node.output:
            if name and name in available:
                raise InputError(f"{onnx_path}: {label} writes '{name}', which is already "
                                 "produced (a graph input, an initializer or an earlier node); a "
                                 "tensor has one producer: re-export the model")
            available.add(name)
    for output in graph.output:
        if output.name not in available:
            raise InputError(f"{onnx_path}: graph output '{output.name}' is produced by no node, "
                             "input or initializer; re-export the model")


def known_ops(onnx_path: Path, model: onnx.ModelProto) -> None:
    """Every opset is one this ONNX knows, and every node an op ONNX defines at its domain's
    opset. An op no converter knows (a custom domain, a typo) would be converted into nothing
    sensible, or fail deep inside the SDK."""
    newest = onnx.defs.onnx_opset_version()
    opsets = {}
    for entry in model.opset_import:
        domain = "" if entry.domain in DEFAULT_DOMAINS else entry.domain
        opsets[domain] = int(entry.version)
        if domain == "" and not 1 <= entry.version <= newest:
            raise InputError(f"{onnx_path}: imports ONNX opset {entry.version}, which ONNX "
                             f"{onnx.__version__} does not know (it defines opsets 1 to "
                             f"{newest}); re-export the model at a released opset (qai-hub-models "
                             "uses 17)")
    for index, node in enumerate(model.graph.node):
        domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
        label = f"node {node.name or index!r}"
        if domain not in opsets:
            raise InputError(f"{onnx_path}: {label} is op '{node.op_type}' of domain "
                             f"'{node.domain}', which the model imports no opset of; re-export "
                             "the model")
        try:
            onnx.defs.get_schema(node.op_type, opsets[domain], domain)
        except onnx.defs.SchemaError:
            where = f"domain '{domain}'" if domain else "ONNX"
            raise InputError(f"{onnx_path}: {label} is op '{node.op_type}', which {where} does "
                             f"not define at opset {opsets[domain]}; no backend converts it: "
                             "re-export the model with standard ONNX ops") from None


def onnx_checker(onnx_path: Path) -> None:
    """onnx.checker's full check, by path: the checker reads the .onnx file itself (never the
    external data) and runs strict shape inference, which refuses declared shapes and types
    that contradict what the ops compute."""
    try:
        onnx.checker.check_model(str(onnx_path), full_check=True)
    except Exception as exc:   # ValidationError, InferenceError, and whatever a damaged file gives
        text = " ".join(str(exc).split())
        raise InputError(f"{onnx_path}: the ONNX checker refuses it: {text[:600]}; re-export "
                         "the model") from None


# ============================================================================ inputs and outputs

@dataclass(frozen=True)
class Slot:
    """One input or output a graph must declare. name None: any name (the hidden state between
    parts is named by the exporter, e.g. /model/model/layers.1/Add_1_output_0)."""

    name: Optional[str]
    dtypes: tuple
    shape: tuple
    role: str             # how a message names it when the name is free

    def label(self, found_name: str = "") -> str:
        """'name', or for a free name the one found with the role: 'x' (hidden-state input)."""
        if self.name:
            return f"'{self.name}'"
        return f"'{found_name}' ({self.role})" if found_name else f"the {self.role}"


def whole_model_part(model: Model) -> Part:
    """The part an unsplit graph is: every layer, the embedding and the head."""
    return Part(index=1, count=1, layers=tuple(range(model.architecture.num_layers)),
                has_embedding=True, has_head=True)


def expected_io(model: Model, graph: Graph) -> tuple:
    """(inputs, outputs): the Slots a graph of this kind, AR, context length and part declares,
    as the runtime conventions (runtime/conventions.py) feed and read them."""
    return graph_slots(model.architecture, graph)


def graph_slots(a: Architecture, graph: Graph) -> tuple:
    """expected_io of a graph of a model with this architecture: all it depends on."""
    part, ar, cl = graph.part, graph.ar, graph.context_length
    past = past_slots(ar, cl)
    floats = ("float32",)
    inputs = [Slot("input_ids", ("int32", "int64"), (1, ar), "token ids") if part.has_embedding
              else Slot(None, floats, (1, ar, a.hidden_size), "hidden-state input")]
    outputs = []
    if part.layers:
        inputs += [Slot(ATTENTION_MASK, floats, mask_shape(ar, cl), "mask"),
                   Slot(POSITION_COS, floats, rope_shape(ar, a.pos_id_dim), "RoPE cos"),
                   Slot(POSITION_SIN, floats, rope_shape(ar, a.pos_id_dim), "RoPE sin")]
    for layer in part.layers:
        for side, slots, width in (("in", inputs, past), ("out", outputs, ar)):
            key, value = kv_names(layer, side)
            slots += [Slot(key, floats, key_shape(a.num_kv_heads, a.head_dim, width), "key"),
                      Slot(value, floats, value_shape(a.num_kv_heads, a.head_dim, width), "value")]
    outputs.append(Slot(None, floats, (1, ar, a.vocab_size), "logits") if part.has_head
                   else Slot(None, floats, (1, ar, a.hidden_size), "hidden-state output"))
    return inputs, outputs


def describe_graph(graph: Graph) -> str:
    part = graph.part
    geometry = f"AR {graph.ar}, context length {graph.context_length}"
    if part.count == 1:
        return f"the unsplit {graph.kind} graph ({geometry}, the whole model)"
    pieces = (["embedding"] if part.has_embedding else []) + (
        [f"layers {part.layers[0]}-{part.layers[-1]}" if len(part.layers) > 1
         else f"layer {part.layers[0]}"] if part.layers else []) + (
        ["norm + LM head"] if part.has_head else [])
    return (f"the {graph.kind} graph {graph.name} ({geometry}, part {part.index} of "
            f"{part.count}: {', '.join(pieces)})")


def io_problem(onnx_path: Path, proto: onnx.ModelProto, architecture: Architecture,
               graph: Graph, config: Optional[Path]) -> Optional[str]:
    """How the ONNX's declared inputs and outputs differ from what `graph` must have, as one
    message naming the file, each input or output, the shape found and the shape needed; None
    when they agree. `config`: the model config file, to name it."""
    found = graph_io(proto)
    expected_inputs, expected_outputs = graph_slots(architecture, graph)
    problems = (_side_problems("input", found.inputs, expected_inputs)
                + _side_problems("output", found.outputs, expected_outputs))
    if not problems:
        return None
    lines = [f"{what} (needed: {needed})" for what, needed in problems[:SHOWN_PROBLEMS]]
    if len(problems) > SHOWN_PROBLEMS:
        lines.append(f"... and {len(problems) - SHOWN_PROBLEMS} more")
    listed = "".join(f"\n  {line}" for line in lines)
    source = config or "the model config"
    return (f"{onnx_path}: its inputs and outputs are not those of {describe_graph(graph)}"
            f" as {source} describes it:{listed}\nthis ONNX is not that graph: put the "
            f"{graph.kind} graph (AR {graph.ar}) there, or fix [graphs] / [architecture] in "
            f"{config.name if config else 'the model config'}")


def check_graph_io(onnx_path: Path, proto: onnx.ModelProto, architecture: Architecture,
                   graph: Graph, config: Optional[Path] = None) -> None:
    problem = io_problem(onnx_path, proto, architecture, graph, config)
    if problem:
        raise InputError(problem)


def _side_problems(side: str, found: dict, slots: list) -> list:
    """(what is wrong, what is needed) pairs for one side (inputs or outputs)."""
    problems = []
    free = [s for s in slots if s.name is None]
    named = {s.name for s in slots if s.name}
    for slot in slots:
        if slot.name and slot.name not in found:
            problems.append((f"no {side} '{slot.name}'", _spec(slot)))
        elif slot.name:
            problems += _compare(side, slot, slot.name, found[slot.name])
    others = [n for n in found if n not in named]   # at most one: the free-named slot
    if len(others) == len(free) == 1:
        problems += _compare(side, free[0], others[0], found[others[0]])
    elif len(others) > len(free):
        problems.append((f"{side}(s) {', '.join(repr(n) for n in others)} besides those the "
                         "runtime feeds or reads",
                         f"{len(slots)} {side}s: " + ", ".join(s.label() for s in slots)))
    elif len(others) < len(free):
        problems.append((f"no {free[0].role}", _spec(free[0])))
    return problems


def _compare(side: str, slot: Slot, name: str, found: tuple) -> list:
    dtype, shape = found
    if dtype in slot.dtypes and tuple(shape) == tuple(slot.shape):
        return []
    return [(f"{side} {slot.label(name)} is {dtype} {_shape(shape)}", _spec(slot))]


def _spec(slot: Slot) -> str:
    return f"{' or '.join(slot.dtypes)} {_shape(slot.shape)}"


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) if d else "?" for d in shape) + "]"


# ============================================================================ weight values

class WeightValueCheck:
    """One weight's values, block by block as a streaming reader sees them: NaN and infinity
    refused, and a value beyond float16's range when the weight is stored as float16.

    Two reductions per block (max and min; both propagate NaN), no temporaries; the element is
    located only once something is wrong."""

    def __init__(self, onnx_path: Path, name: str, shape: tuple, stored_dtype: str,
                 data_path: Optional[Path] = None, offset: int = 0):
        self.onnx_path, self.name = onnx_path, name
        self.data_path, self.offset = data_path, offset   # where the bytes are, for the message
        self.shape = tuple(shape) if shape else (1,)
        self.stored_dtype = stored_dtype
        self.limit = FLOAT16_MAX if stored_dtype == "float16" else None

    def __call__(self, block: np.ndarray, first_row: int) -> None:
        if block.size == 0:
            return
        high, low = float(block.max()), float(block.min())
        if np.isnan(high) or np.isnan(low):
            self._refuse(block, first_row, np.isnan(block), "NaN")
        if np.isinf(high) or np.isinf(low):
            self._refuse(block, first_row, np.isinf(block), "infinity")
        if self.limit is not None and (high > self.limit or low < -self.limit):
            self._refuse(block, first_row, np.abs(block) > self.limit, "beyond float16")

    def _refuse(self, block: np.ndarray, first_row: int, bad: np.ndarray, what: str) -> None:
        count = int(np.count_nonzero(bad))
        flat = int(np.flatnonzero(bad.reshape(-1))[0])
        value = float(block.reshape(-1)[flat])
        row_elements = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        index = np.unravel_index(first_row * row_elements + flat, self.shape)
        at = "[" + ", ".join(str(int(i)) for i in index) + "]"
        where = f"{self.onnx_path}: weight '{self.name}'"
        if self.data_path is not None:   # the bytes to look at are in the .data, not the ONNX
            element = int(np.ravel_multi_index(tuple(int(i) for i in index), self.shape))
            at += f" (in {self.data_path} at byte {self.offset + element * block.itemsize})"
        if what == "beyond float16":
            raise InputError(
                f"{where} holds {value:g} at {at} ({count} value(s) in this block beyond "
                f"+-{FLOAT16_MAX:g}), and it is stored as float16 (no int encoding): it would "
                "become infinity. Quantize it (give it an encoding), or set [compile] "
                "float_bitwidth = 32 in configs/build.toml")
        raise InputError(f"{where} holds {what} at {at} ({count} in this block); the export is "
                         "broken (a non-finite weight poisons every output it reaches): "
                         "re-export the model")


def check_weight_values(onnx_path: Path, proto: onnx.ModelProto, stored: dict,
                        block_elements: Optional[int] = None, seen: Optional[set] = None) -> int:
    """Stream every weight named in `stored` (name -> the dtype the backend stores it as)
    through a WeightValueCheck, one tensor and one block at a time. Returns the bytes read.
    seen: windows of external data already checked (graphs sharing a .data), skipped and added
    to."""
    read = 0
    for init in proto.graph.initializer:
        if init.name not in stored:
            continue
        values = initializer_values(init, onnx_path)
        if seen is not None and values.data_path is not None:
            window = (values.data_path.resolve(), values.offset, values.nbytes, stored[init.name])
            if window in seen:
                continue
            seen.add(window)
        check = WeightValueCheck(onnx_path, init.name, values.shape, stored[init.name],
                                 values.data_path, values.offset)
        for rows, block in values.rows(block_elements):
            check(block, rows.start)
        read += values.nbytes
    return read


# ============================================================================ a build's graphs

def check_graph(path: Path, architecture: Architecture, graph: Graph,
                config: Path) -> onnx.ModelProto:
    """The convert step's checks of one graph's ONNX (`path`) before a backend reads it: its
    structure, then its inputs and outputs as a graph of this architecture must have them
    (`config`: the model config, named in the message). Returns the proto (no weights)."""
    proto = check_onnx(path)
    check_graph_io(path, proto, architecture, graph, config)
    return proto


# ============================================================================ helpers

def _first_of(problems: list, onnx_path: Path) -> str:
    if len(problems) == 1:
        return problems[0]
    return (f"{problems[0]}\n({len(problems) - 1} more problem(s) in this file: "
            f"`doit inspect --path {onnx_path}` lists them all)")
