"""`doit verify` of an ortqnn bundle: its parts run on Qualcomm's x64 HTP simulator
(backends/ortqnn_sim.py) instead of hexbundle's interpreter, judged by the same gates.

  parts, rows = open_simulated_parts(layout, options, genie, directory, log)
  session = simulated_session(sp, cfg, rope, cl, scratch)   # a runtime PartSession

What is exact here: each bin of ctx-bins must be the bytes the compile makes from its part's
QDQ models (the compile is deterministic), row `bin vs its QDQ models (recompiled)`. A bin
that is another part's is refused as out of order, as for the reference backend's bins. What
runs: each graph's own unshared bin, compiled from the same QDQ model (a shared bin does not
run on the simulator), so its numbers are the bundle's graph's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from pathlib import Path
from typing import Callable

from hexbundle.config.layout import Layout
from hexbundle.formats.genie import GenieSettings
from hexbundle.runtime.parts import part_label
from hexbundle.runtime.sessions import PartSession, RopeSettings
from hexbundle.support.errors import VerifyError

RECOMPILED = "bin vs its QDQ models (recompiled)"
REBUILT = "QDQ models vs the export's (rebuilt)"
SIMULATED_REFERENCE = "simulated reference vs reference"


class _NoPages:
    """What verify asks of a part's reader (release_pages, close): a QNN bin is not mapped."""

    def release_pages(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class SimulatedPart:
    part: object                  # hexbundle.config.model.Part
    path: Path                    # the bundle's bin
    compile: object               # the part's CompileOptions (the compile step's)
    directory: Path               # where its graphs' own bins are
    reader: object = field(default_factory=_NoPages)
    seconds: dict = field(default_factory=dict)   # what took how long (the timing line)
    used: set = field(default_factory=set)         # the own bins' directories it ran

    @property
    def label(self) -> str:
        return f"{part_label(self.part)} ({self.path.name})"


def _first_difference(a: bytes, b: bytes) -> str:
    n = min(len(a), len(b))
    at = next((i for i in range(n) if a[i] != b[i]), n)
    return (f"first difference at byte {at} of {len(a)} (0x{a[at]:02x} vs 0x{b[at]:02x})"
            if at < n else f"{len(a)} B vs {len(b)} B")


def open_simulated_parts(layout: Layout, options, genie: GenieSettings, directory: Path,
                         scratch: Path, log: Callable[[str], None]) -> tuple:
    """([SimulatedPart in ctx-bins order], {part index: (problems, note)}): each part's bin
    recompiled from its QDQ models and compared byte for byte. A bin that is another part's
    compile is out of order (refused, naming both); a missing bin is refused."""
    from hexbundle.backends.ortqnn_sim import recompiled
    cfg = layout.cfg
    parts = cfg.plan.parts()
    key = "'dialog.engine.model.binary.ctx-bins'"
    if len(genie.ctx_bins) != len(parts):
        raise VerifyError(f"{genie.path}: {key} lists {len(genie.ctx_bins)} bins for the "
                          f"{len(parts)} parts of plan {cfg.plan.name!r}; rebuild with "
                          "`doit bundle`")
    made, seconds = {}, {}
    for part, compile_options in zip(parts, options.compile):
        started = time.monotonic()
        dlcs = [layout.dlc(g) for g in cfg.model.graphs(part)]
        made[part.index] = recompiled(dlcs, compile_options, scratch / f"part{part.index}", log) \
            .read_bytes()
        seconds[part.index] = time.monotonic() - started
    opened, exact = [], {}
    for position, (name, part, compile_options) in enumerate(
            zip(genie.ctx_bins, parts, options.compile), start=1):
        path = genie.path.parent / name
        if Path(name).name != name or not path.is_file():
            raise VerifyError(f"{genie.path}: {key}[{position - 1}] is {name!r}, but "
                              f"{genie.path.parent} has no such file: {part_label(part)} is "
                              "missing from the bundle; rebuild it with `doit bundle`")
        data = path.read_bytes()
        other = [p for p in parts if p.index != part.index and made[p.index] == data]
        if other:
            raise VerifyError(
                f"{genie.path}: {key} is out of order: entry {position - 1} is {name}, which "
                f"is the compile of {part_label(other[0])}'s QDQ models, but Genie feeds "
                f"position {position} with the output of position {position - 1}, so it must "
                f"be {part_label(part)} there; list the bins in pipeline order (rebuild with "
                "`doit bundle`)")
        problems = [] if data == made[part.index] else [
            f"{name} is not the bin the compile makes from {part_label(part)}'s QDQ models "
            f"({', '.join(layout.rel(layout.dlc(g)) for g in cfg.model.graphs(part))}): "
            f"{_first_difference(data, made[part.index])}; rebuild with `doit bundle`"]
        exact[part.index] = (problems, f"{len(data)} B compared with the recompile")
        sp = SimulatedPart(part, path, compile_options, directory)
        sp.seconds["recompile"] = seconds[part.index]
        opened.append(sp)
    return opened, exact


def simulated_session(sp: SimulatedPart, layout: Layout, rope: RopeSettings, cl: int,
                      scratch: Path, log: Callable[[str], None]) -> PartSession:
    """The part's prompt and token graphs of one context length, each its own bin on the
    simulator (compiled now, or reused from an earlier verify)."""
    from hexbundle.backends.ortqnn_kit import ensure_kit
    from hexbundle.backends.ortqnn_sim import SimulatedGraph, own_bins
    from hexbundle.config.toolchain import project_root
    cfg = layout.cfg
    graphs = cfg.model.graphs(sp.part, cl)
    started = time.monotonic()
    own = own_bins({g.name: layout.dlc(g) for g in graphs}, sp.compile, sp.directory, log)
    sp.used |= {o.model.parent for o in own.values()}
    sp.seconds["own bins"] = sp.seconds.get("own bins", 0.0) + time.monotonic() - started
    kit = ensure_kit(project_root())
    executors = {g.kind: SimulatedGraph(kit, own[g.name], layout.dlc(g), scratch / g.name, log)
                 for g in graphs}
    return PartSession(sp.label, executors, rope)


def derived_for(layout: Layout, part, cl: int, float_bitwidth: int, scratch: Path) -> dict:
    """{graph name: the activation encodings the ortqnn convert gives it}, derived again here
    from the export's files of all the part's graphs, as the convert derives them
    (backends/ortqnn.derived_activations: seeded, so the convert's ranges), for the references
    of an ortqnn bundle."""
    from hexbundle.backends.ortqnn import derived_activations
    graphs = layout.cfg.model.graphs(part)
    derived = derived_activations([(layout.onnx(g), layout.encodings(g)) for g in graphs],
                                  scratch, float_bitwidth)
    return {g.name: derived for g in layout.cfg.model.graphs(part, cl)}


def simulated_reference(sp: SimulatedPart, graphs: dict, rope: RopeSettings, scratch: Path,
                        log: Callable[[str], None]) -> PartSession:
    """The part's reference graphs (runtime.qdq, made from the export's files: the form ortqnn
    compiles) compiled, each alone, and run on the simulator: what the simulator makes of a
    correct graph of this part, the simulator's share of the noise floor."""
    import onnx
    from hexbundle.backends.ortqnn_kit import ensure_kit
    from hexbundle.backends.ortqnn_sim import SimulatedGraph, own_bins
    from hexbundle.config.toolchain import project_root
    scratch.mkdir(parents=True, exist_ok=True)
    whole = {}
    for kind, graph in graphs.items():   # one file each: the compile takes one model
        whole[kind] = scratch / f"reference-part{sp.part.index}-{kind}.onnx"
        onnx.save(onnx.load(str(graph.path), load_external_data=True), str(whole[kind]))
    started = time.monotonic()
    own = own_bins({p.stem: p for p in whole.values()}, sp.compile, sp.directory, log)
    sp.used |= {o.model.parent for o in own.values()}
    sp.seconds["own bins"] = sp.seconds.get("own bins", 0.0) + time.monotonic() - started
    kit = ensure_kit(project_root())
    executors = {kind: SimulatedGraph(kit, own[path.stem], path, scratch / path.stem, log)
                 for kind, path in whole.items()}
    session = PartSession(f"{sp.label} (reference on the simulator)", executors, rope)
    session.whole = whole     # the rebuilt QDQ models (rebuilt_problems)
    return session


def rebuilt_problems(layout: Layout, part, cl: int, whole: dict) -> tuple:
    """(problems, note): each of the part's QDQ models (dlc/) against the same graph rebuilt
    by verify from the export's files (`whole`: kind -> the reference in the form ortqnn
    compiles, one file, made by the convert's own writer with the same arguments): the same
    bytes, or the first tensor that differs is named."""
    problems, compared = [], 0
    for g in layout.cfg.model.graphs(part, cl):
        dlc, rebuilt = layout.dlc(g), whole[g.kind]
        compared += 1
        if dlc.read_bytes() != rebuilt.read_bytes():
            problems.append(f"{layout.rel(dlc)}: {_first_tensor_difference(dlc, rebuilt)}, "
                            "not what the convert makes from the export's files; rebuild it "
                            "with `doit convert`")
    return problems, f"{compared} QDQ models compared byte for byte with their rebuild"


def _first_tensor_difference(ours: Path, rebuilt: Path) -> str:
    """The first initializer (or else node, or else the file's other bytes) that differs."""
    import onnx
    from onnx import numpy_helper
    a, b = onnx.load(str(ours)), onnx.load(str(rebuilt))
    theirs = {i.name: i for i in b.graph.initializer}
    for init in a.graph.initializer:
        other = theirs.get(init.name)
        if other is None:
            return f"initializer {init.name} is not in the rebuild"
        x, y = numpy_helper.to_array(init), numpy_helper.to_array(other)
        if x.shape != y.shape or x.dtype != y.dtype or not np.array_equal(x, y):
            if x.shape != y.shape or x.dtype != y.dtype:
                return f"initializer {init.name} is {x.dtype}{list(x.shape)}, rebuilt " \
                       f"{y.dtype}{list(y.shape)}"
            at = int(np.flatnonzero((x != y).reshape(-1))[0])
            return (f"initializer {init.name} element {at} is {x.reshape(-1)[at]!r}, rebuilt "
                    f"{y.reshape(-1)[at]!r}")
    for n, (x, y) in enumerate(zip(a.graph.node, b.graph.node)):
        if x != y:
            return f"node {n} ({x.op_type} -> {', '.join(x.output)}) differs"
    return "the files differ outside their tensors and nodes"


def close_session(session: PartSession, sp: SimulatedPart, what: str = "") -> None:
    """Stop the part's driver processes; for the bundle's own run (`what` empty), add up what
    the simulator took: its start (Wine, the session, the bin loaded), its runs and how many."""
    for graph in session.graphs.values():
        graph.close()
        if not what:
            sp.seconds["simulator start"] = sp.seconds.get("simulator start", 0.0) \
                + graph.start_seconds
            sp.seconds["simulator runs"] = sp.seconds.get("simulator runs", 0.0) \
                + graph.run_seconds
            sp.seconds["runs"] = sp.seconds.get("runs", 0) + graph.runs


def executor_text(session: PartSession) -> str:
    """What produced the part's outputs, read from the bin's and the DLL's bytes."""
    from hexbundle.backends.ortqnn_sim import describe_executor
    graph = session.graphs["prompt"]
    return describe_executor(graph.kit, graph.own, graph.ort_version)
