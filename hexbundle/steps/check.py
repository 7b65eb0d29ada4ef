"""Step `check`: outputs a remote cache handed back, checked as the step that makes them checks
its own (graph/remote_steps.py runs it between the download and the rename into place).

The files are still temp files beside their targets; the step runs through the configured
executor, so a backend that needs the SDK to read its outputs (qairt) checks them where the SDK
is. A convert's DLC: the backend's check_dlc (the reference backend: every blob's digest and the
graph it holds). A compile's context binary: check_bin (every blob's digest, then the graphs,
weight sharing and device a compile here ends with). The inputs step's outputs are checked by
the convert step that reads them, which validates its inputs whether or not the cache has it.
"""
from __future__ import annotations

from pathlib import Path

from hexbundle.backends import get_backend
from hexbundle.config.layout import Layout
from hexbundle.steps.options import compile_options
from hexbundle.support.errors import HexbundleError


def check_fetched(layout: Layout, spec: dict, log) -> None:
    cfg = layout.cfg
    backend = get_backend(cfg.backend)
    files = {Path(target): Path(tmp) for target, tmp in spec["files"].items()}
    if spec["of"] == "convert":
        graph = cfg.graph(spec["part"], spec["graph"])
        backend.check_dlc(files[layout.dlc(graph)], graph.name, log)
    elif spec["of"] == "compile":
        part = cfg.part(spec["part"])
        backend.check_bin(files[layout.bin(part)], compile_options(cfg, part), log)
    else:
        raise HexbundleError(f"check: no checks for outputs of step {spec['of']!r}")
