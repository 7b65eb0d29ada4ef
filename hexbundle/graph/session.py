"""What dodo.py needs from doit: the resolved config, the checker, the reporter, uptodate keys.

Kept out of dodo.py so that dodo.py reads as the task graph and nothing else.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from doit import doit_cmd
from doit.reporter import ConsoleReporter

from hexbundle import __version__
from hexbundle.support import hashing
from hexbundle.graph import runguard
from hexbundle.checks import sizes
from hexbundle.config.build import BuildConfig, load_build
from hexbundle.support.console import say
from hexbundle.support.errors import HexbundleError
from hexbundle.config.layout import Layout
from hexbundle.graph.checker import XXH3Checker, comparison_checker

_banner = ""
# Benchmark only: "md5" runs the same task graph with doit's stock MD5 checker and a DB of its
# own (scripts/bench.py compares the two). Builds never set it.
BENCH_CHECKER_ENV = "HEXBUNDLE_BENCH_CHECKER"


def command_line_overrides() -> dict:
    """Every `key=value` given to doit (typos included: load_build rejects unknown keys)."""
    return dict(doit_cmd._CMDLINE_VARS or {})


def load(root: Path):
    """Resolve the build for this doit run, or exit with a clean message (no traceback)."""
    global _banner
    overrides = command_line_overrides()
    try:
        cfg = load_build(root, overrides)
    except HexbundleError as exc:
        print(f"hexbundle: {exc}", file=sys.stderr)
        sys.exit(3)
    layout = Layout(cfg)
    try:   # for commands that run tasks: the build lock, clean-up after a killed run, a crash-safe dependency DB
        runguard.guard_run(layout, sys.argv)
    except HexbundleError as exc:
        print(f"hexbundle: {exc}", file=sys.stderr)
        sys.exit(3)
    if runguard.command_writes(sys.argv):   # list, help, info: digests stay in memory
        hashing.use_cache(layout.digest_cache)
    _banner = banner(cfg)
    return cfg, layout, overrides


def banner(cfg: BuildConfig) -> str:
    from hexbundle.backends import describe
    version, deployable = describe(cfg.backend)
    note = "" if deployable else "  [reference backend: open formats, NOT deployable]"
    d = cfg.device
    return (f"hexbundle {__version__}: {cfg.model.name}, plan {cfg.plan.name} "
            f"({len(cfg.plan.layers_per_part)} parts) for {d.name} (soc_model {d.soc_model}, "
            f"{d.dsp_arch})\n  backend {cfg.backend} ({version}), executor "
            f"{cfg.executor}, weights_packing {cfg.compile['weights_packing']}, weight_sharing "
            f"{cfg.compile['weight_sharing']}{note}\n  output: "
            f"{Layout(cfg).rel(cfg.build_dir)}")


class Reporter(ConsoleReporter):
    """doit's console reporter, plus the banner saying what is built and how, first thing."""

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)
        if _banner:
            self.outstream.write(_banner + "\n")

    def add_success(self, task):
        super().add_success(task)
        runguard.save_progress()   # a run killed later keeps this task's record


def doit_config(layout: Layout) -> dict:
    checker, db = XXH3Checker, "doit-db.json"
    if os.environ.get(BENCH_CHECKER_ENV):   # scripts/bench.py only: the stock checker to compare
        checker, db = comparison_checker(os.environ[BENCH_CHECKER_ENV])
    return {
        "default_tasks": ["bundle"],
        "check_file_uptodate": checker,
        "dep_file": str(layout.state_dir / db),
        "backend": "json",
        "par_type": "thread",      # steps are subprocesses or containers: threads suffice
        "reporter": Reporter,
        "verbosity": 2,            # show the steps' progress lines as they happen
    }


def check_sizes(cfg: BuildConfig, layout: Layout):
    """Size every part's context binary against the size model; a failure explains itself."""
    from doit.exceptions import TaskFailed
    parts = cfg.plan.parts()
    actual = {p.index: (layout.bin(p).stat().st_size if layout.bin(p).is_file() else None)
              for p in parts}
    rows = sizes.judge(cfg.model, cfg.plan, actual, cfg.compile["float_bitwidth"])
    table = sizes.format_table(cfg.model, cfg.plan, rows)
    try:
        sizes.raise_on_failure(cfg.model, cfg.plan, rows, table)
    except HexbundleError as exc:
        return TaskFailed(str(exc))
    say(table)
    return True
