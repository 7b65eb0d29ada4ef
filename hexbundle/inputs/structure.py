"""A decoder's sizes from its graph's structure: which node feeds which, never which width a
weight happens to have.

A width alone cannot say what a weight is: in a Qwen3-8B-class model the MLP's width equals the
query projection's (2 heads x head_dim 128 = 256 = intermediate), and a rule that sets aside the
attention widths finds no MLP at all. So each size is read from the role a weight plays:

  * a **linear** is a MatMul, Gemm or 1x1 Conv whose weight is an initializer (its widths from the
    weight's layout: MatMul [in, out], Gemm and Conv [out, in, ...]);
  * the **MLP** is a Mul of two linears' outputs that read the same tensor (up, and gate through
    its activation), feeding a linear (down) whose output is added to the residual: the
    intermediate size is their width;
  * **attention** is a MatMul of two computed tensors that feeds a Softmax: its key side reaches
    `past_key_<L>_in` (the layer), its query side the query linears (one per head in Qualcomm's
    split-head graphs, one for all heads elsewhere): heads x head_dim is their summed width; the
    key side's linears give the KV width;
  * the **LM head** is the linear `logits` is computed with.

The import (inputs/import_export.py) checks what is found here against config.json; a size the
graph does not show is a reason, never a guess.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

LINEAR_OPS = ("MatMul", "Gemm", "Conv")
# Ops that move or relabel a tensor without computing on it: between a linear and what reads it
LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Cast", "Identity", "Flatten")
# How far a walk back from an operand may go before it is taken as leaving the sublayer: a
# query's walk crosses its norm and RoPE (~25 nodes), a gate's its activation (<= 10)
QUERY_WALK_NODES = 400
MLP_WALK_NODES = 24
SOFTMAX_HOPS = 4           # score MatMul -> scale -> mask -> Softmax, a Cast or two between
PAST_KEY_PREFIX, PAST_KEY_SUFFIX = "past_key_", "_in"


@dataclass(frozen=True)
class Linear:
    index: int               # the node's index in its graph
    weight: str              # the initializer
    in_width: int
    out_width: int
    reads: str               # the tensor it reads
    writes: str
    out_in: bool             # weight stored [out, in, ...] (Gemm transB, Conv), else [in, out]


@dataclass
class Structure:
    """What one model's graphs show, per role; a role not found has a reason instead."""

    query_widths: dict = field(default_factory=dict)     # layer -> summed query linear width
    key_widths: dict = field(default_factory=dict)       # layer -> summed key linear width
    attention_graph: dict = field(default_factory=dict)  # layer -> the file holding it
    mlp_widths: list = field(default_factory=list)       # (file, gate, up, down in) per MLP
    head: Optional[Linear] = None                        # the LM head
    head_graph: object = None                            # the file holding it
    reasons: dict = field(default_factory=dict)          # role -> why it was not found


class GraphView:
    """One ONNX graph's nodes, who produces and who reads each tensor, its weights."""

    def __init__(self, proto):
        graph = proto.graph
        self.nodes = list(graph.node)
        self.weights = {t.name: tuple(t.dims) for t in graph.initializer}
        self.inputs = {v.name for v in graph.input} - set(self.weights)
        self.producer, self.readers = {}, defaultdict(list)
        for index, node in enumerate(self.nodes):
            for out in node.output:
                self.producer.setdefault(out, index)
            for name in node.input:
                if name:
                    self.readers[name].append(index)
        self._constant = {}
        self._linear = {}

    def constant(self, tensor: str) -> bool:
        """A weight, a Constant's output, or computed from those alone (iterative: a deep
        chain of shape arithmetic must not exhaust Python's stack)."""
        stack = [tensor]
        while stack:
            name = stack[-1]
            if name in self._constant:
                stack.pop()
                continue
            if name in self.weights or not name:
                self._constant[name] = True
            elif name in self.inputs or name not in self.producer:
                self._constant[name] = name not in self.inputs
            else:
                node = self.nodes[self.producer[name]]
                pending = [i for i in node.input if i and i not in self._constant]
                if pending:
                    stack += pending
                    continue
                self._constant[name] = node.op_type == "Constant" or all(
                    self._constant[i] for i in node.input if i)
            stack.pop()
        return self._constant[tensor]

    def linear(self, index: int) -> Optional[Linear]:
        if index not in self._linear:
            self._linear[index] = self._read_linear(index)
        return self._linear[index]

    def _read_linear(self, index: int) -> Optional[Linear]:
        node = self.nodes[index]
        if node.op_type not in LINEAR_OPS or len(node.input) < 2 \
                or node.input[1] not in self.weights:
            return None
        dims = self.weights[node.input[1]]
        if node.op_type == "MatMul" and len(dims) == 2:
            in_width, out_width, out_in = dims[0], dims[1], False
        elif node.op_type == "Gemm" and len(dims) == 2:
            trans = next((a.i for a in node.attribute if a.name == "transB"), 0)
            out_in = bool(trans)
            in_width, out_width = (dims[1], dims[0]) if out_in else dims
        elif node.op_type == "Conv" and len(dims) == 4 and dims[2:] == (1, 1):
            in_width, out_width, out_in = dims[1], dims[0], True
        else:
            return None
        return Linear(index, node.input[1], int(in_width), int(out_width), node.input[0],
                      node.output[0], out_in)

    def walk_back(self, tensor: str, budget: int) -> Optional[tuple]:
        """(linears, graph inputs) reached walking back from `tensor`, stopping at each linear,
        constant and graph input; None when the walk visits more than `budget` nodes."""
        linears, inputs, seen, stack = {}, set(), set(), [tensor]
        while stack:
            name = stack.pop()
            if name in inputs or self.constant(name):
                continue
            if name in self.inputs:
                inputs.add(name)
                continue
            index = self.producer[name]
            if index in seen:
                continue
            seen.add(index)
            if len(seen) > budget:
                return None
            found = self.linear(index)
            if found is not None:
                linears[index] = found
                continue
            stack += [i for i in self.nodes[index].input if i]
        return linears, inputs

    def through_layout(self, tensor: str) -> list:
        """The nodes that read `tensor`, looking through layout ops (Transpose, Reshape, ...)."""
        out, stack, seen = [], [tensor], set()
        while stack:
            for index in self.readers.get(stack.pop(), []):
                if index in seen:
                    continue
                seen.add(index)
                node = self.nodes[index]
                if node.op_type in LAYOUT_OPS:
                    stack.append(node.output[0])
                else:
                    out.append(index)
        return out

    def back_through_layout(self, tensor: str) -> Optional[int]:
        """The node that computes `tensor`, looking back through layout ops."""
        while tensor in self.producer:
            index = self.producer[tensor]
            node = self.nodes[index]
            if node.op_type not in LAYOUT_OPS:
                return index
            tensor = node.input[0]
        return None


def read_structure(protos: list, graphs: list) -> Structure:
    """The attention, MLP and LM head of every graph (the parts of one model, or its one
    unsplit graph)."""
    out = Structure()
    for proto, graph in zip(protos, graphs):
        view = GraphView(proto)
        _attention(view, graph.onnx, out)
        _mlps(view, graph.onnx, out)
        if out.head is None:
            head = _lm_head(view)
            if head is not None:
                out.head, out.head_graph = head, graph.onnx
    if not out.query_widths:
        out.reasons["attention"] = ("no attention found (a MatMul of two computed tensors feeding "
                                    "a Softmax, its key side reaching past_key_<L>_in and its "
                                    "query side a query projection of its own, not one "
                                    "fused with the keys)")
    if not out.mlp_widths:
        out.reasons["mlp"] = ("no MLP found (a Mul of two projections of the same tensor, one "
                              "through its activation, feeding a down projection whose output "
                              "is added to the residual; a fused gate-up projection has "
                              "no width of its own)")
    return out


def _attention(view: GraphView, where, out: Structure) -> None:
    """Per layer, the summed widths of the query and the key linears its score MatMuls read."""
    queries, keys = defaultdict(dict), defaultdict(dict)
    for index, node in enumerate(view.nodes):
        if node.op_type != "MatMul" or len(node.input) != 2 \
                or any(view.constant(i) for i in node.input) or not _feeds_softmax(view, index):
            continue
        walks = [view.walk_back(i, QUERY_WALK_NODES) for i in node.input]
        if any(w is None for w in walks):
            continue
        layers = [_past_key_layers(inputs) for _, inputs in walks]
        key_sides = [n for n, found in enumerate(layers) if len(found) == 1]
        if len(key_sides) != 1 or layers[1 - key_sides[0]]:
            continue
        key_side = key_sides[0]
        if set(walks[0][0]) & set(walks[1][0]):
            continue   # one projection for queries and keys (fused q/k/v): no width of its own
        layer = next(iter(layers[key_side]))
        queries[layer].update(walks[1 - key_side][0])
        keys[layer].update(walks[key_side][0])
    for layer, linears in queries.items():
        if linears:
            out.query_widths[layer] = sum(lin.out_width for lin in linears.values())
            out.key_widths[layer] = sum(lin.out_width for lin in keys[layer].values())
            out.attention_graph[layer] = where


def _past_key_layers(inputs: set) -> set:
    layers = set()
    for name in inputs:
        middle = name[len(PAST_KEY_PREFIX):-len(PAST_KEY_SUFFIX)]
        if name.startswith(PAST_KEY_PREFIX) and name.endswith(PAST_KEY_SUFFIX) \
                and middle.isdigit():
            layers.add(int(middle))
    return layers


def _feeds_softmax(view: GraphView, index: int) -> bool:
    frontier = [index]
    for _ in range(SOFTMAX_HOPS):
        nxt = []
        for i in frontier:
            for reader in view.readers.get(view.nodes[i].output[0], []):
                op = view.nodes[reader].op_type
                if op == "Softmax":
                    return True
                if op not in LINEAR_OPS:
                    nxt.append(reader)
        frontier = nxt
    return False


def _mlps(view: GraphView, where, out: Structure) -> None:
    """Each gated MLP: Mul(act(gate(x)), up(x)) -> down -> residual Add."""
    for index, node in enumerate(view.nodes):
        if node.op_type != "Mul" or len(node.input) != 2 \
                or any(view.constant(i) for i in node.input):
            continue
        sides = [view.walk_back(i, MLP_WALK_NODES) for i in node.input]
        if any(s is None or s[1] or len(s[0]) != 1 for s in sides):
            continue
        gate, up = (next(iter(s[0].values())) for s in sides)
        if gate.index == up.index or gate.reads != up.reads:
            continue
        downs = [view.linear(i) for i in view.through_layout(node.output[0])]
        if len(downs) != 1 or downs[0] is None:
            continue
        down = downs[0]
        if not any(view.nodes[i].op_type == "Add" for i in view.through_layout(down.writes)):
            continue
        out.mlp_widths.append((where, gate.out_width, up.out_width, down.in_width))


def _lm_head(view: GraphView) -> Optional[Linear]:
    """The linear `logits` is computed with (through layout ops)."""
    if "logits" not in view.producer:
        return None
    index = view.back_through_layout("logits")
    return None if index is None else view.linear(index)
