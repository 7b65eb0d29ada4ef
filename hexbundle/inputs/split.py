"""Split an unsplit LLM graph into the plan's parts, as qai-hub-models' splitter cuts it.

The cut: part 1 the embedding | groups of decoder layers | the last group + final norm + LM
head, at the embedding output and at each layer's residual output. Which node belongs where is
read from the node names (`.../layers.<L>/...`, as exported from the PyTorch module tree):
  * a node that depends on input_ids ("pipeline") belongs to its layer; one with no layer in its
    name belongs to the embedding when it comes before layer 0, else to the head;
  * a node that does not depend on input_ids (Constants, the processing of attention_mask or
    cos/sin) is copied into every part that reads it.
Between two parts exactly one pipeline tensor may cross (the hidden state); anything else is an
error naming the tensors, not a part that silently reads garbage.

Streamed: the ONNX is read without its weights; each part's weights are copied once, in chunks,
from the unsplit .data into the part's one .data file (shared by its graphs: prompt and token,
per context length), so memory stays bounded by a chunk whatever the model's size. Tensors the
unsplit graphs share (the same bytes in the same file, or equal digests) are written once; each
is located by formats/onnxfile.py, the one reader of ONNX external data.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hexbundle.config.layout import GraphInputs
from hexbundle.config.model import Model, Part
from hexbundle.formats.encodings import (adapt_checkpoint_encodings, fill_cut_encodings,
                                         read_encodings_json, subset_encodings)
from hexbundle.formats.onnxfile import initializer_values
from hexbundle.formats.qaihm import recorded_data_files
from hexbundle.inputs import validate
from hexbundle.support import hashing, progress
from hexbundle.support.atomic import atomic_output
from hexbundle.support.errors import InputError

LAYER = re.compile(r"layers\.(\d+)[./]")
INPUT_IDS = "input_ids"
CHUNK_BYTES = 64 << 20
ALIGNMENT = 4096          # each weight page-aligned in the part's .data (mmap-friendly)
EMBEDDING, HEAD = "embedding", "head"


# ============================================================================ the cut

@dataclass
class Cut:
    """One graph's nodes assigned to segments: 0 the embedding, L+1 layer L, N+1 the head."""

    proto: object
    num_layers: int
    segment: dict = field(default_factory=dict)     # node index -> segment (pipeline nodes)
    producer: dict = field(default_factory=dict)    # tensor -> node index

    def part_segments(self, part: Part) -> set:
        segs = {layer + 1 for layer in part.layers}
        if part.has_embedding:
            segs.add(0)
        if part.has_head:
            segs.add(self.num_layers + 1)
        return segs


def cut_graph(proto, num_layers: int, where: Path) -> Cut:
    graph = proto.graph
    cut = Cut(proto, num_layers)
    pipeline = {INPUT_IDS}
    for index, node in enumerate(graph.node):   # ONNX nodes are topologically sorted
        for out in node.output:
            cut.producer[out] = index
        if not any(i in pipeline for i in node.input):
            continue
        pipeline.update(node.output)
        cut.segment[index] = _segment(node, cut, num_layers, where)
    if INPUT_IDS not in {i.name for i in graph.input}:
        raise InputError(f"{where}: no input 'input_ids'; this is not an unsplit LLM graph")
    _mark_head(cut, num_layers)
    return cut


def _mark_head(cut: Cut, num_layers: int) -> None:
    """The final norm and the LM head: the unnamed pipeline nodes on the way to `logits` after
    the last layer (walking back from logits, stopping at layer nodes)."""
    graph = cut.proto.graph
    stack = [cut.producer[o.name] for o in graph.output if o.name == "logits" and o.name in cut.producer]
    seen = set()
    while stack:
        index = stack.pop()
        if index in seen or index not in cut.segment or _named_layer(graph.node[index]):
            continue
        seen.add(index)
        cut.segment[index] = num_layers + 1
        stack += [cut.producer[i] for i in graph.node[index].input if i in cut.producer]


def _named_layer(node):
    return LAYER.search(node.name) or next(
        (LAYER.search(o) for o in node.output if LAYER.search(o)), None)


def _segment(node, cut: Cut, num_layers: int, where: Path) -> int:
    """A layer's node goes with its layer; an unnamed one with what it reads (the embedding
    before layer 0, a KV output's concat with its layer); the head is marked afterwards."""
    m = _named_layer(node)
    if m:
        layer = int(m[1])
        if layer >= num_layers:
            raise InputError(f"{where}: node {node.name!r} names layer {layer}, but the model "
                             f"has {num_layers} layers")
        return layer + 1
    producers = [cut.segment[cut.producer[i]] for i in node.input
                 if i in cut.producer and cut.producer[i] in cut.segment]
    return max(producers, default=0)


@dataclass
class PartGraph:
    nodes: list
    inputs: list        # ValueInfoProtos
    outputs: list
    initializers: list  # TensorProtos (metadata; external data still the unsplit graph's)
    cut_tensors: Optional[list] = None   # a qai-hub-models cut: its encodings rule, these filled


def part_graph(cut: Cut, part: Part, where: Path) -> PartGraph:
    """The nodes, I/O and initializers of one part of the cut graph."""
    graph = cut.proto.graph
    segs = cut.part_segments(part)
    mine = {i for i, s in cut.segment.items() if s in segs}
    initializers = {t.name: t for t in graph.initializer}
    graph_inputs = {v.name: v for v in graph.input}
    crossing_in: list = []
    stack = list(mine)
    while stack:   # pull in the non-pipeline nodes the part reads (duplicated per part)
        index = stack.pop()
        for name in graph.node[index].input:
            if not name or name in initializers or name in graph_inputs:
                continue
            src = cut.producer.get(name)
            if src is None:
                raise InputError(f"{where}: node {graph.node[index].name!r} reads {name!r}, "
                                 "which no node produces; the graph is broken, re-export it")
            if src in cut.segment:
                if src not in mine and name not in crossing_in:
                    crossing_in.append(name)
            elif src not in mine:
                mine.add(src)
                stack.append(src)
    nodes = [graph.node[i] for i in sorted(mine)]
    read = {n for node in nodes for n in node.input if n}
    produced = {o for node in nodes for o in node.output}
    later = _read_by_later_parts(cut, segs)
    crossing_out = [o for node in nodes for o in node.output
                    if o in later and cut.producer[o] in cut.segment]
    _check_one_crossing(crossing_in, crossing_out, part, where)
    infos = _value_infos(cut.proto, crossing_in + crossing_out, where)
    inputs = [infos[n] for n in crossing_in] + [v for v in graph.input if v.name in read
                                                  and v.name not in initializers]
    outputs = [infos[n] for n in crossing_out] + [v for v in graph.output if v.name in produced]
    inits = [initializers[n] for n in initializers if n in read]
    return PartGraph(nodes, inputs, outputs, inits)


def _read_by_later_parts(cut: Cut, segs: set) -> set:
    last = max(segs)
    return {name for i, s in cut.segment.items() if s > last for name in cut.proto.graph.node[i].input}


def _check_one_crossing(crossing_in: list, crossing_out: list, part: Part, where: Path) -> None:
    for side, names in (("into", crossing_in), ("out of", crossing_out)):
        if len(names) > 1:
            raise InputError(
                f"{where}: {len(names)} tensors cross {side} part {part.index} of {part.count} "
                f"({', '.join(names[:4])}); a cut may only pass the hidden state. The layer "
                "names of the nodes (`layers.<L>`) do not separate the layers; split with "
                "qai-hub-models' own splitter instead")
    if not part.has_embedding and not crossing_in:
        raise InputError(f"{where}: nothing flows into part {part.index} of {part.count}; the "
                         "plan does not match the graph's layers")


def _value_infos(proto, names: list, where: Path) -> dict:
    import onnx
    known = {v.name: v for v in list(proto.graph.value_info) + list(proto.graph.output)}
    if not all(n in known for n in names):
        inferred = onnx.shape_inference.infer_shapes(proto)
        known.update({v.name: v for v in inferred.graph.value_info})
    missing = [n for n in names if n not in known]
    if missing:
        raise InputError(f"{where}: the type of {missing[0]!r} (a tensor between parts) is not "
                         "known and cannot be inferred; re-export with value_info")
    return known


# ============================================================================ writing a part

@dataclass
class DataWriter:
    """The part's one .data: each distinct tensor once, page-aligned, copied in chunks."""

    file: object
    written: dict = field(default_factory=dict)    # (source file, offset, length) -> offset
    digests: dict = field(default_factory=dict)    # (digest, length) -> offset
    copied: int = 0

    def add(self, source: Path, offset: int, length: int, match_content: bool) -> int:
        """The tensor's offset in the part's .data: where the same bytes already are, or where
        they are copied now. match_content: look for equal bytes from another file first (the
        token graph's weights, in a tree whose unsplit graphs each have their own .data)."""
        key = (str(source.resolve()), offset, length)
        if key in self.written:
            progress.advance(length)   # done: the bytes are there already
            return self.written[key]
        if match_content:
            same = self.digests.get((_range_digest(source, offset, length), length))
            if same is not None:
                self.written[key] = same
                progress.advance(length)
                return same
        start = -(-self.file.tell() // ALIGNMENT) * ALIGNMENT
        self.file.write(bytes(start - self.file.tell()))
        digest = _copy_range(source, offset, length, self.file)
        self.copied += length
        self.written[key] = self.digests[(digest, length)] = start
        return start


def _blocks(path: Path, offset: int, length: int):
    """Bytes [offset, offset + length) of `path`, in chunks of at most CHUNK_BYTES."""
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            block = f.read(min(CHUNK_BYTES, left))
            if not block:
                raise InputError(f"{path}: ends before byte {offset + length}; the data file is "
                                 "truncated, re-export it")
            yield block
            left -= len(block)


def _range_digest(path: Path, offset: int, length: int) -> str:
    h = hashing.new_hasher()
    for block in _blocks(path, offset, length):
        h.update(block)
    return h.hexdigest()


def _copy_range(path: Path, offset: int, length: int, out) -> str:
    """Copy bytes [offset, offset + length) of `path` to `out`; their digest."""
    h = hashing.new_hasher()
    for block in _blocks(path, offset, length):
        out.write(block)
        h.update(block)
        progress.advance(len(block))
    return h.hexdigest()


def _relocated(init, data_name: str, offset: int, length: int):
    import onnx
    out = onnx.TensorProto()
    out.CopyFrom(init)
    del out.external_data[:]
    for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(length))):
        entry = out.external_data.add()
        entry.key, entry.value = key, value
    return out


def _model_proto(source, pg: PartGraph, name: str, initializers: list):
    import onnx
    graph = onnx.helper.make_graph(pg.nodes, name, pg.inputs, pg.outputs, initializers)
    model = onnx.helper.make_model(graph, opset_imports=list(source.opset_import),
                                   producer_name="hexbundle.inputs.split")
    model.ir_version = source.ir_version
    return model


def split_graphs(model: Model, part: Part, unsplit: dict, out: dict, log,
                 config: Optional[Path] = None, qaihm_plan: tuple = ()) -> list:
    """Cut `part` out of the unsplit graphs (Graph.slot -> GraphInputs) into `out` (slot ->
    GraphInputs; every slot names the same .data). Each unsplit graph is validated first
    (inputs/validate.py: its structure, and its inputs and outputs as the whole model's graph of
    that slot in the model config `config`)."""
    started = time.monotonic()
    graphs = model.graphs(part)
    data_path = out[graphs[0].slot].data[0]
    pieces = cut_sources(model, part, unsplit, config, qaihm_plan)
    total = sum(initializer_values(init, pieces[g.slot][0].onnx).nbytes for g in graphs
                for init in pieces[g.slot][2].initializers if init.data_location == init.EXTERNAL)
    with atomic_output(data_path) as f, progress.meter(f"{data_path.name}", total):
        writer = DataWriter(f)
        protos = {}
        for graph in graphs:
            src, proto, pg = pieces[graph.slot]
            inits = []
            for init in pg.initializers:
                if init.data_location == init.EXTERNAL:
                    # located and checked by the one reader of ONNX external data
                    values = initializer_values(init, src.onnx)
                    where = writer.add(values.data_path, values.offset, values.nbytes,
                                       graph != graphs[0])
                    inits.append(_relocated(init, data_path.name, where, values.nbytes))
                else:
                    inits.append(init)
            protos[graph.slot] = _model_proto(proto, pg, graph.name, inits)
    for graph in graphs:
        src, proto, pg = pieces[graph.slot]
        _write_onnx(out[graph.slot].onnx, protos[graph.slot])
        _write_encodings(src, out[graph.slot], pg, proto)
        log(f"split {graph.name}: {len(pg.nodes)} nodes, {len(pg.initializers)} initializers "
            f"from {src.onnx.name}")
    size = data_path.stat().st_size
    log(f"wrote {data_path.name}: {writer.copied / 2**20:.1f} MiB of weights copied "
        f"({size / 2**20:.1f} MiB file) in {time.monotonic() - started:.1f}s")
    return [p for g in graphs for p in out[g.slot].all]


def cut_sources(model: Model, part: Part, unsplit: dict, config: Optional[Path] = None,
                qaihm_plan: tuple = ()) -> dict:
    """slot -> (its unsplit GraphInputs, proto, the part's PartGraph), each unsplit graph
    validated first (its structure; its inputs and outputs as the whole model's graph).
    qaihm_plan (layers per part): cut by qai-hub-models 0.65's rule, the graph's dynamic dims
    first pinned to the slot's shapes (a quantize checkpoint's one dynamic graph serves every
    slot); else by the nodes' layer names."""
    pieces = {}
    whole = model.graphs(validate.whole_model_part(model))
    for graph, whole_graph in zip(model.graphs(part), whole):
        src = unsplit[graph.slot]
        recorded_data_files(src.onnx)   # a broken .data record is named before any work
        proto = validate.check_onnx(src.onnx)
        if qaihm_plan:
            pin_shapes(proto, model, whole_graph, src.onnx)
        validate.check_graph_io(src.onnx, proto, model.architecture, whole_graph, config)
        if qaihm_plan:
            hidden = (1, graph.ar, model.architecture.hidden_size)
            pg = qaihm_part_graph(proto, part, qaihm_plan, hidden, src.onnx)
        else:
            pg = part_graph(cut_graph(proto, model.architecture.num_layers, src.onnx), part,
                            src.onnx)
        pieces[graph.slot] = (src, proto, pg)
    return pieces


def validate_part_sources(model: Model, part: Part, unsplit: dict,
                          config: Optional[Path] = None, qaihm_plan: tuple = ()) -> int:
    """What the split of `part` reads of the export, checked as convert will check the split:
    the unsplit graphs' structure and the values of the part's own float weights (NaN,
    infinity), streamed; a window of .data shared by the graphs read once. Run before a remote
    cache is asked for the split (graph/remote_steps.py): a cache that answers with an older
    split must not hide a broken export. Returns the bytes read."""
    pieces = cut_sources(model, part, unsplit, config, qaihm_plan)
    read, seen = 0, set()
    for src, proto, pg in pieces.values():
        floats = {init.name: "float32" for init in pg.initializers
                  if init.data_type in validate.FLOAT_TYPES}
        read += validate.check_weight_values(src.onnx, proto, floats, seen=seen)
    return read


def _write_onnx(path: Path, proto) -> None:
    with atomic_output(path) as f:
        f.write(proto.SerializeToString(deterministic=True))


def _write_encodings(src: GraphInputs, out: GraphInputs, pg: PartGraph, proto) -> None:
    try:
        data = read_encodings_json(src.encodings)
    except OSError as exc:
        raise InputError(f"{src.encodings}: cannot read the encodings ({exc}); re-export") from None
    if pg.cut_tensors is not None:   # as qai-hub-models writes a part's (sorted, indent 4)
        part = qaihm_part_encodings(data, proto, pg, pg.cut_tensors)
        text = json.dumps(part, indent=4, sort_keys=True)
    else:
        params = {i.name for i in pg.initializers}
        tensors = {n for node in pg.nodes for n in (*node.input, *node.output) if n}
        tensors |= {v.name for v in pg.inputs}
        text = json.dumps(subset_encodings(data, params, tensors - params), indent=1)
    with atomic_output(out.encodings) as f:
        f.write(text.encode())


# ============================================================================ a checkpoint's graph

def pin_shapes(proto, model: Model, graph, where: Path) -> None:
    """Give a dynamic graph (a quantize checkpoint's model_dynamic.onnx) the fixed shapes of
    `graph` (the whole model's graph of one AR and context length), in place: what Qualcomm's
    cloud compile does with its input specs. Only the axes that depend on the AR or the context
    length (and batch axes of 1) may be symbolic; a symbolic hidden size, head count, head_dim
    or vocabulary is refused, naming the input or output. The symbolic dims' names are never
    read: they differ between Qualcomm's templates."""
    import dataclasses
    other = dataclasses.replace(graph, ar=graph.ar + 3, context_length=graph.context_length + 7)
    expected = [validate.expected_io(model, g) for g in (graph, other)]
    for side, values in ((0, proto.graph.input), (1, proto.graph.output)):
        slots = {_slot_name(s): (s, t) for s, t in zip(expected[0][side], expected[1][side])}
        for value in values:
            if value.name not in slots:
                continue
            here, there = slots[value.name]
            dims = value.type.tensor_type.shape.dim
            if len(dims) != len(here.shape):
                continue   # check_graph_io names the rank that differs
            for axis, (dim, want, alt) in enumerate(zip(dims, here.shape, there.shape)):
                if dim.HasField("dim_value"):
                    continue
                if want != alt or want == 1:
                    dim.Clear()
                    dim.dim_value = want
                    continue
                raise InputError(
                    f"{where}: {'input' if side == 0 else 'output'} {value.name!r} axis {axis} "
                    f"is dynamic ({dim.dim_param or 'no size'}), where a model's fixed size "
                    f"belongs ({want}); qai-hub-models leaves only the sequence and context "
                    "dims dynamic: re-run its quantize, or give a graph with this dim fixed")


def _slot_name(slot) -> str:
    """The graph input or output a whole-model Slot is (the unsplit graph names its logits)."""
    return slot.name or ("logits" if slot.role == "logits" else "")


def residual_cuts(proto, where: Path, include_first_input: bool = True) -> list:
    """The tensors qai-hub-models 0.65 cuts a decoder at (templates/llm/split_onnx_utils/
    utils.py, get_split_tensors): the embedding output (include_first_input) and the output of
    every second residual Add, i.e. each layer's residual output. A residual Add is an Add whose
    later operand reaches its earlier one (through the sublayer) and whose earlier operand is
    itself an Add; the first layer's input Add reads the embedding, so an odd count gets it
    prepended. Nodes are taken by index (Qualcomm keys them by name: equal for unique names)."""
    nodes = list(proto.graph.node)
    producer = {}
    for index, node in enumerate(nodes):
        for out in node.output:
            producer.setdefault(out, index)

    def skip_cast(index: int) -> int:
        if nodes[index].op_type == "Cast":
            source = producer.get(nodes[index].input[0])
            return index if source is None else source
        return index

    def reaches(src: int, dst: int) -> bool:
        if src < dst:
            return False
        stack, seen = [src], set()
        while stack:
            cur = stack.pop()
            if cur == dst:
                return True
            seen.add(cur)
            stack += [p for t in nodes[cur].input if (p := producer.get(t)) is not None
                      and p not in seen and p >= dst]
        return False

    def operands(index: int):
        node = nodes[index]
        if len(node.input) != 2:
            return None
        a, b = (producer.get(t) for t in node.input)
        return None if a is None or b is None else (skip_cast(a), skip_cast(b))

    def residual(index: int, strict: bool) -> bool:
        if nodes[index].op_type != "Add" or (pair := operands(index)) is None:
            return False
        begin, end = sorted(pair)
        if strict and nodes[begin].op_type != "Add":
            return False
        return reaches(end, begin)

    adds = [i for i in range(len(nodes)) if residual(i, strict=True)]
    if not adds:
        raise InputError(f"{where}: no residual Add (an Add whose input reaches its other input "
                         "through a sublayer): qai-hub-models' splitter finds no layer boundary "
                         "in this graph; it is not a decoder graph qai-hub-models writes")
    if len(adds) % 2 == 1:
        adds.insert(0, min(operands(adds[0])))
    cuts = []
    if include_first_input:
        pair = operands(adds[0])
        if pair is None:
            raise InputError(f"{where}: the first residual Add {nodes[adds[0]].name!r} does not "
                             "read two computed tensors; no embedding output to cut at")
        cuts.append(nodes[skip_cast(min(pair))].output[0])
    return cuts + [nodes[index].output[0] for n, index in enumerate(adds) if n % 2 == 1]


CACHE_OUTPUT = r"(?:past|swa)_(nativekvcache__)?(key|value)_{layer}_"


def qaihm_part_outputs(proto, plan_layers: tuple, where: Path) -> list:
    """Per part but the last, the tensors it outputs as qai-hub-models 0.65's split_onnx lists
    them: the embedding output for part 1; for a block, its last layer's residual output, then
    every past_key/value output of its layers (graph order). The last part takes what is left."""
    cuts = residual_cuts(proto, where)
    layer_outputs = cuts[1:]
    if len(layer_outputs) != sum(plan_layers):
        raise InputError(f"{where}: {len(layer_outputs)} layer boundaries (residual Adds) but "
                         f"the model has {sum(plan_layers)} layers; the config.json or the "
                         "graph is of another model")
    outputs = [o.name for o in proto.graph.output]
    lists, end = [[cuts[0]]], 0
    for count in plan_layers[1:-1]:
        start, end = end, end + count
        kv = [o for layer in range(start, end) for o in outputs
              if re.search(CACHE_OUTPUT.format(layer=layer), o)]
        lists.append([layer_outputs[end - 1]] + kv)
    return lists


def qaihm_part_graph(proto, part: Part, plan_layers: tuple, hidden: tuple, where: Path) -> PartGraph:
    """One part as qai-hub-models 0.65's OnnxSplitter.partition_subgraph makes it: the nodes
    needed for the part's outputs, walking back to the graph inputs, the initializers and the
    earlier parts' cut tensors (the leaves); inputs the cut tensors it reads, then the graph
    inputs it reads (graph order); outputs its listed ones, then graph outputs it computes.
    `hidden`: the shape of a cut tensor (1, AR, hidden size)."""
    import onnx
    graph = proto.graph
    lists = qaihm_part_outputs(proto, plan_layers, where)
    earlier = [t for lst in lists[:part.index - 1] for t in lst]
    graph_outputs = {o.name for o in graph.output}
    if part.index <= len(lists):
        wanted = lists[part.index - 1]
    else:
        covered = set(earlier)
        wanted = [o.name for o in graph.output if o.name not in covered]
    additional = [t for t in earlier if t not in graph_outputs]
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output}
    leaves = {v.name for v in graph.input} | {t.name for t in graph.initializer} | set(additional)
    missing = [t for t in wanted if t not in producer]
    if missing:
        raise InputError(f"{where}: no node computes {missing[0]!r}; the graph is broken")
    queue, visited = [producer[t] for t in wanted], set()
    while queue:
        index = queue.pop()
        if index in visited:
            continue
        visited.add(index)
        for name in graph.node[index].input:
            if name and name not in leaves:
                if name not in producer:
                    raise InputError(f"{where}: node {graph.node[index].name!r} reads {name!r}, "
                                     "which no node produces; the graph is broken, re-export it")
                queue.append(producer[name])
    nodes = [graph.node[i] for i in sorted(visited)]
    used = {n for node in nodes for n in (*node.input, *node.output)}
    made = {o for node in nodes for o in node.output}
    cut_info = {t: onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, list(hidden))
                for t in set(additional) | set(wanted) if t not in graph_outputs}
    known = {o.name: o for o in graph.output} | cut_info
    inputs = [cut_info[t] for t in additional if t in used] + [
        v for v in graph.input if v.name in used]
    outputs = [known[t] for t in wanted] + [
        o for o in graph.output if o.name in made and o.name not in wanted]
    inits = [t for t in graph.initializer if t.name in used]
    return PartGraph(nodes, inputs, outputs, inits, cut_tensors=lists[0])


def qaihm_part_encodings(data: dict, proto, pg: PartGraph, cut_tensors: list,
                         adapt: bool = True) -> dict:
    """A part's encodings as qai-hub-models 0.65 writes them for a checkpoint: the whole
    model's, adapted as its Qwen3 and Llama 3 classes adapt them before splitting (adapt:
    formats/encodings.adapt_checkpoint_encodings), then as split_onnx_by_names subsets them:
    less activation encodings of tensors the part neither computes nor takes nor gives, less
    param encodings of initializers it lacks, less Gather outputs (AISW-152612); the embedding
    cut (fill_input_encodings_of_split) first given its producer's input encoding when it has
    none."""
    if adapt:
        gather = next(((n.output[0], n.input[0]) for n in proto.graph.node
                       if n.op_type == "Gather"), None)
        data = adapt_checkpoint_encodings(
            data, gather, [(n.op_type, list(n.input), list(n.output)) for n in proto.graph.node])
    first_input = {out: node.input[0] for node in proto.graph.node if node.input
                   for out in node.output}
    filled = fill_cut_encodings(data, first_input, cut_tensors)
    activations = ({o for node in pg.nodes for o in node.output}
                   | {v.name for v in pg.inputs} | {v.name for v in pg.outputs})
    activations -= {node.output[0] for node in pg.nodes if node.op_type == "Gather"}
    return subset_encodings(filled, {t.name for t in pg.initializers}, activations)
