"""Step `check`: outputs a remote cache handed back, checked as the step that makes them checks
its own (graph/remote_steps.py runs it between the download and the rename into place).

First the key: an output the backend marks (the reference backend's DLC and context binary)
must record this step's output key (steps/outputkey.py), computed here from the local inputs
and options: another build's output with the same names, graphs and sizes (other weights,
other options) is refused. An output the backend cannot mark (a real SDK's, qairt) is believed
under remote_cache_trust = "trusted"; under "verify" it is refused (built here), since the
exact checks below read only the reference backend's formats.

Under remote_cache_trust = "verify", a marked output then also gets `doit verify`'s exact
checks (checks/exact.py) against the export it was made from: topology, encodings and every
weight integer-exact -- what stops a server that writes a matching key into a forged file.

The files are still temp files beside their targets; the step runs through the configured
executor, so a backend that needs the SDK to read its outputs (qairt) checks them where the SDK
is. A convert's DLC: the backend's check_dlc (the reference backend: every blob's digest and the
graph it holds). A compile's context binary: check_bin (every blob's digest, then the graphs,
weight sharing and device a compile here ends with). The inputs step's outputs are checked by
the convert step that reads them, which validates its inputs whether or not the cache has it.
"""
from __future__ import annotations

from pathlib import Path

from hexbundle.backends.registry import get_backend
from hexbundle.checks.exact import PartGraph, exact_checks
from hexbundle.config.step_options import CheckStepOptions
from hexbundle.formats.ctxbin import read_ctxbin
from hexbundle.formats.dlc import read_dlc
from hexbundle.steps.description import Description
from hexbundle.steps.outputkey import output_key
from hexbundle.support.errors import BackendError, HexbundleError


def check_fetched(described: Description, log) -> None:
    """The fetched outputs (role "fetched") of the step `of` its options name, checked against
    that step's inputs and options, all in the description (graph.remote_steps.check_description)."""
    o: CheckStepOptions = described.options
    checked = o.checked
    backend = get_backend(checked.backend)
    fetched = described.input_paths("fetched")
    targets = [Path(name) for name in described.arguments["targets"]]
    arguments = {k: v for k, v in described.arguments.items() if k != "targets"}
    if o.of == "convert":
        dlc, target = fetched[0], targets[0]
        backend.check_dlc(dlc, checked.graph.name, log)
        inputs = [described.input("onnx"), *described.input_paths("data"),
                  described.input("encodings")]
        check_key(backend, dlc, target, output_key("convert", arguments, checked.convert, inputs),
                  o.verify, log)
        if o.verify:
            with read_dlc(dlc) as reader:
                exact(DlcAsPart(reader), [PartGraph(checked.graph.name, described.input("onnx"),
                                                    described.input("encodings"))], target, log)
    elif o.of == "compile":
        binary, target = fetched[0], targets[0]
        options = checked.compile
        backend.check_bin(binary, options, log)
        check_key(backend, binary, target, output_key("compile", arguments, options,
                                                      described.input_paths("dlc")),
                  o.verify, log)
        if o.verify:
            graphs = [PartGraph(name, onnx, encodings) for name, onnx, encodings in
                      zip(options.graph_names, described.input_paths("source_onnx"),
                          described.input_paths("source_encodings"))]
            with read_ctxbin(binary) as reader:
                exact(reader, graphs, target, log)
    else:
        raise HexbundleError(f"check: no checks for outputs of step {o.of!r}")


def check_key(backend, path: Path, target: Path, expected: str, verify: bool, log) -> None:
    """The output records the key it was made for, and it is this step's (module docstring)."""
    recorded = backend.made_for(path)
    if recorded is None and not backend.marks_outputs:
        if verify:
            raise FetchRefused(
                f"{target.name}: a {backend.name} output records no key (the SDK's format has "
                "no place for one) and the exact checks cannot read it; refused under "
                "remote_cache_trust = verify (built here instead)")
        log(f"{target.name}: records no key ({backend.name} outputs cannot); believed: "
            "remote_cache_trust = trusted")
        return
    if recorded != expected:
        raise FetchRefused(
            f"{target.name}: made for key {recorded or '(none)'}, not this step's "
            f"{expected}: another build's output (other inputs or options); refused")
    log(f"{target.name}: made for this step's key {expected}")


def exact(reader, graphs: list, path: Path, log) -> None:
    """checks/exact.py's three checks; any difference refuses the file (`path`: its target)."""
    for result in exact_checks(reader, graphs):
        if result.problems:
            raise FetchRefused(f"{path.name}: {result.check}: "
                               + "; ".join(result.problems[:3]) + "; refused")
        log(f"{path.name}: {result.check}: {result.summary()}")


class FetchRefused(BackendError):
    """A fetched output that is not this step's, or that its checks refuse."""


class DlcAsPart:
    """A DLC seen as a part holding its one graph: what checks/exact.py reads of a bin."""

    def __init__(self, reader):
        self.reader = reader
        self.graph_names = [reader.graph_name]

    def graph(self, name: str):
        return self.reader.graph

    def topology(self, name: str):
        return self.reader.topology()

    def record(self, graph_name: str, tensor_name: str):
        return self.reader.record(tensor_name)

    def quant_params(self, graph_name: str, tensor_name: str):
        return self.reader.quant_params(tensor_name)

    def weight_blocks(self, graph_name: str, tensor_name: str, block_elements: int):
        return self.reader.weight_blocks(tensor_name, block_elements)
