"""A bundle's parts as the runtime opens them: the bins of ctx-bins, checked against the plan,
and a part session over each -- through the bin's graphs or through the part's float ONNX.

Heavy imports (onnx, via the ctxbin reader and the interpreter) happen inside the functions:
dodo.py imports `doit verify`'s module, which imports this one, and a no-op `doit` must stay fast.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hexbundle.config.build import BuildConfig
from hexbundle.config.model import Model
from hexbundle.formats.genie import GenieSettings
from hexbundle.runtime.onnx_graph import OnnxGraph
from hexbundle.runtime.sessions import PartSession, RopeSettings
from hexbundle.support.errors import FormatError, VerifyError


def part_label(part) -> str:
    return f"part {part.index} of {part.count}"


@dataclass
class BundlePart:
    part: object                  # hexbundle.config.model.Part
    path: Path
    reader: object                # CtxBinReader

    @property
    def label(self) -> str:
        return f"{part_label(self.part)} ({self.path.name})"


def open_bundle_parts(cfg: BuildConfig, genie: GenieSettings) -> list:
    """The bins of ctx-bins, checked to hold the plan's parts in pipeline order.

    A bin is identified by the graphs it holds (not by its file name), so a renamed or
    swapped file is caught as well as a misordered list."""
    from hexbundle.formats.ctxbin import read_ctxbin
    parts = cfg.plan.parts()
    n = len(parts)
    wanted = {tuple(g.name for g in cfg.model.graphs(p)): p for p in parts}
    key = "'dialog.engine.model.binary.ctx-bins'"
    opened = []
    try:
        for position, name in enumerate(genie.ctx_bins, start=1):
            path = genie.path.parent / name
            if Path(name).name != name or not path.is_file():
                raise VerifyError(
                    f"{genie.path}: {key}[{position - 1}] is {name!r}, but {genie.path.parent} has "
                    f"no such file: part {position} of {n} is missing from the bundle; rebuild it "
                    f"with `doit bundle`")
            try:
                reader = read_ctxbin(path)
            except FormatError as exc:
                raise VerifyError(f"part {position} of {n} ({name}) cannot be read: {exc}") from None
            held = wanted.get(tuple(reader.graph_names))
            opened.append(BundlePart(held, path, reader))
            if held is None:
                raise VerifyError(
                    f"{path}: {key}[{position - 1}] holds graphs {reader.graph_names}, which are no "
                    f"part of plan {cfg.plan.name!r} of {cfg.model.name} (at position {position} "
                    f"the pipeline needs part {position} of {n}); rebuild with `doit bundle`")
        present = {bp.part.index for bp in opened}
        for part in parts:
            if part.index not in present:
                names = ", ".join(g.name for g in cfg.model.graphs(part))
                raise VerifyError(f"{genie.path}: {part_label(part)} is missing: no bin listed in "
                                  f"{key} holds its graphs ({names}); rebuild with `doit bundle`")
        for position, bp in enumerate(opened, start=1):
            if bp.part.index != position:
                raise VerifyError(
                    f"{genie.path}: {key} is out of order: entry {position - 1} is {bp.path.name}, "
                    f"which holds {part_label(bp.part)}, but Genie feeds position {position} "
                    f"with the output of position {position - 1}, so it must be part {position} of "
                    f"{n} there; list the bins in pipeline order (rebuild with `doit bundle`)")
        if len(opened) != n:
            raise VerifyError(f"{genie.path}: {key} lists {len(opened)} bins for the {n} parts of "
                              f"plan {cfg.plan.name!r}; rebuild with `doit bundle`")
    except BaseException:
        for bp in opened:
            bp.reader.close()
        raise
    return opened


def rope_settings(genie: GenieSettings) -> RopeSettings:
    return RopeSettings(genie.rope_theta, genie.pos_id_dim, genie.rope_scaling)


def bundle_session(bp: BundlePart, cfg: BuildConfig, rope: RopeSettings,
                   context_length: Optional[int] = None) -> PartSession:
    """A part through its bin's prompt and token graphs of one context length (default: the
    largest, Genie's context size)."""
    from hexbundle.runtime.interpreter import GraphRunner
    cl = context_length or cfg.model.context_length
    graphs = {g.kind: GraphRunner(bp.reader, g.name) for g in cfg.model.graphs(bp.part, cl)}
    return PartSession(bp.label, graphs, rope)


def onnx_session(part, model: Model, files: dict,
                 context_length: Optional[int] = None) -> PartSession:
    """The float reference of a part at one context length (default: the largest), from its
    graphs' files (`files`: graph name -> GraphInputs). Its RoPE settings come from the model
    config (what the ONNX was exported for), not from genie_config.json: a wrong rope-theta
    there must show."""
    a = model.architecture
    cl = context_length or model.context_length
    graphs = {g.kind: OnnxGraph(files[g.name].onnx) for g in model.graphs(part, cl)}
    return PartSession(f"{part_label(part)} (float ONNX)", graphs,
                       RopeSettings(a.rope_theta, a.pos_id_dim, a.rope_scaling))


def reference_graphs(part, model: Model, files: dict, context_length: int, scratch: Path,
                     rounding: str = "half-even", float_bitwidth: int = 32,
                     derived: Optional[dict] = None) -> dict:
    """The export's quantized reference of a part's graphs at one context length (runtime.qdq:
    its ONNX with its encodings applied, with `rounding`; `files`: graph name -> GraphInputs),
    written under scratch/cl<C>-<rounding>/ (one weights file). `derived` (an ortqnn bundle's:
    graph name -> the activation encodings its convert adds): the graphs in the form that
    backend compiles, integer weights and every float weight and activation encoded
    (backends/ortqnn.py)."""
    from hexbundle.runtime.qdq import WeightStore, qdq_graph
    directory = scratch / f"cl{context_length}-{rounding}"
    store = WeightStore(directory)   # the part's graphs share their weights: written once
    try:
        return {g.kind: qdq_graph(files[g.name].onnx, files[g.name].encodings, directory, store,
                                  g.kind, rounding, float_bitwidth, derived is not None,
                                  (derived or {}).get(g.name))
                for g in model.graphs(part, context_length)}
    finally:
        store.close()


def reference_session(part, cfg: BuildConfig, graphs: dict) -> PartSession:
    """A part session over the reference graphs (RoPE from the model config, as the float's)."""
    a = cfg.model.architecture
    return PartSession(f"{part_label(part)} (reference)", graphs,
                       RopeSettings(a.rope_theta, a.pos_id_dim, a.rope_scaling))
