"""What a context binary says about itself, checked against what was asked for, after compile.

The compile step's logs are not the only judge: a generator that drops an option prints at most
one line, and a binary can still hold the wrong graphs, one weight copy per graph, or code for
another SoC. Both backends read the binary they wrote into BinFacts -- the qairt backend through
the SDK's `qnn-context-binary-utility --context_binary BIN --json_file OUT`
(facts_from_utility_json), the reference backend through its own reader (facts_from_ctxbin) --
and check_bin_facts refuses it unless
  - every expected graph is there, under its name, and no other;
  - with weight_sharing on, the prompt and token graphs share one copy of the weights;
  - the device (soc_model, dsp_arch) is the configured one.
What the metadata does not state is said in the log, never passed silently: weight packing is
not in either reader's facts, so the size check (checks/sizes.py) stays the judge of it, and of
weight sharing when the metadata is silent about the weight buffers.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from hexbundle.support.errors import BackendError


@dataclass(frozen=True)
class BinFacts:
    source: str                       # what read them, for messages
    graphs: tuple                     # graph names, in the binary's order
    soc_model: Optional[int]          # None: the metadata does not say
    dsp_arch: Optional[str]           # "v73"; None: the metadata does not say
    weight_copies: Optional[int]      # copies of the weights across graphs; None: not said
    # what else the utility says (the manifest records it): buildId (the SDK build that made
    # it, "v2.42.0.251225135753_193295"), contextBlobVersion, coreApiVersion,
    # backendApiVersion, socVersion
    info: tuple = ()                  # (key, value) pairs; () for the reference reader

    @property
    def build_id(self) -> Optional[str]:
        return dict(self.info).get("buildId")


def check_bin_facts(path: Path, facts: BinFacts, graphs: tuple, soc_model: int, dsp_arch: str,
                    weight_sharing: bool, log: Callable[[str], None]) -> None:
    problems = []
    missing = [g for g in graphs if g not in facts.graphs]
    extra = [g for g in facts.graphs if g not in graphs]
    if missing or extra:
        problems.append(f"holds graph(s) {list(facts.graphs)}, expected {list(graphs)}"
                        + (f" (missing: {', '.join(missing)})" if missing else "")
                        + (f" (unexpected: {', '.join(extra)})" if extra else ""))
    if facts.soc_model is None:
        problems.append("does not state its soc_model, so the device cannot be confirmed")
    elif facts.soc_model != soc_model:
        problems.append(f"is built for soc_model {facts.soc_model}, not the configured "
                        f"{soc_model} (device config)")
    if facts.dsp_arch is None:
        problems.append("does not state its dsp_arch, so the device cannot be confirmed")
    elif facts.dsp_arch.lower() != dsp_arch.lower():
        problems.append(f"is built for dsp_arch {facts.dsp_arch}, not the configured {dsp_arch}")
    if weight_sharing:
        if facts.weight_copies is None:
            log(f"{path.name}: {facts.source} does not say how many copies of the weights it "
                "holds; the size check judges weight sharing")
        elif facts.weight_copies != 1:
            problems.append(f"holds {facts.weight_copies} copies of the weights although "
                            "weight_sharing is on: the prompt and token graphs must share one "
                            "(was weight_sharing_enabled dropped by the generator?)")
    if problems:
        raise BackendError(f"{path}: the compiled context binary, as {facts.source} reads it, "
                           + "; ".join(problems) + ". The output was not kept; fix the compile "
                           "options or the device config ([compile] in configs/build.toml, "
                           "configs/devices) and compile again")
    log(f"{path.name}: checked by {facts.source}: graphs {', '.join(facts.graphs)}; soc_model "
        f"{facts.soc_model} {facts.dsp_arch}; "
        + (f"{facts.weight_copies} weight cop{'y' if facts.weight_copies == 1 else 'ies'}"
           if facts.weight_copies is not None else "weight copies not stated")
        + "; weight packing is not stated by the binary: the size check judges it")


# ---------------------------------------------------------------------------------------------
# readers

def facts_from_utility_json(doc, where: str) -> BinFacts:
    """The JSON of `qnn-context-binary-utility`: info.graphs[].info.graphName; the device in
    info.contextMetadata.info (dspArch a number, 73 for v73; socModel); each graph's weight
    buffer as graphBlobInfo[].weightsBufferId. Only the graph list is known for certain from
    public uses of the tool; where the device or buffers are absent, the facts say None and the
    check says so (the device is then refused as unconfirmed)."""
    def bad(what):
        return BackendError(f"{where}: {what}; is this the JSON of qnn-context-binary-utility "
                            "from the pinned SDK?")
    info = doc.get("info") if isinstance(doc, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("graphs"), list):
        raise bad("no info.graphs list")
    names, buffers = [], []
    for n, entry in enumerate(info["graphs"]):
        g = entry.get("info") if isinstance(entry, dict) else None
        if not isinstance(g, dict) or not isinstance(g.get("graphName"), str):
            raise bad(f"info.graphs[{n}] has no info.graphName")
        names.append(g["graphName"])
        blob = g.get("graphBlobInfo")
        ids = [b.get("weightsBufferId") for b in blob if isinstance(b, dict)] \
            if isinstance(blob, list) else []
        buffers.append(ids[0] if ids and ids[0] is not None else None)
    meta = info.get("contextMetadata", {})
    meta = meta.get("info", meta) if isinstance(meta, dict) else {}
    soc = meta.get("socModel", info.get("socModel"))
    arch = meta.get("dspArch", info.get("dspArch"))
    if isinstance(arch, int):
        arch = f"v{arch}"
    copies = None if not buffers or None in buffers else len(set(buffers))
    said = {k: info[k] for k in UTILITY_INFO_KEYS if isinstance(info.get(k), (str, int))}
    return BinFacts("qnn-context-binary-utility", tuple(names),
                    soc if isinstance(soc, int) else None,
                    arch if isinstance(arch, str) and arch else None, copies,
                    tuple(sorted(said.items())))


UTILITY_INFO_KEYS = ("backendId", "buildId", "contextBlobVersion", "coreApiVersion",
                     "backendApiVersion", "socVersion")


def bin_record(facts: BinFacts) -> dict:
    """What the bundle manifest records of one bin."""
    return {**dict(facts.info), "socModel": facts.soc_model, "dspArch": facts.dsp_arch,
            "graphs": list(facts.graphs)}


def facts_from_ctxbin(reader) -> BinFacts:
    """The reference backend's binary (formats.ctxbin.CtxBinReader): the weight copies are the
    most blobs any one tensor name is stored in across the graphs."""
    blobs = {}
    for graph in reader.graphs:
        for name in graph.weights:
            blobs.setdefault(name, set()).add(reader.record(graph.name, name).blob)
    copies = max((len(b) for b in blobs.values()), default=1)
    device = reader.device
    return BinFacts("hexbundle's context-binary reader", tuple(reader.graph_names),
                    device.get("soc_model"), device.get("dsp_arch"), copies)
