"""doit's console reporter: the banner first (what is built, with which backend, executor,
device), one summary line last (what was built or checked, where, how many steps ran and how
many were up to date, how long; on failure which task failed and where its log is).

The banner is only for runs that build or check a variant (VARIANT_TASKS): `doit inspect`,
`doit import_export`, `doit image`... do not build the default model, so they don't name it.
Those tools end with their own verdict (inspect's counts, the image's ID...): the summary line
follows it only when they fail or are stopped.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Optional

from doit.reporter import ConsoleReporter

from hexbundle import __version__
from hexbundle.backends import describe
from hexbundle.config.layout import Layout
from hexbundle.graph import db, explain
from hexbundle.support import console
from hexbundle.support.files import read_state

# The tasks that build or check the variant the configs and the command line resolve to.
VARIANT_TASKS = {"inputs", "convert", "compile", "check_sizes", "bundle", "verify", "release"}
# The build steps (steps/executor.py): their output is in the variant's logs/<task>.log.
STEP_TASKS = {"inputs", "convert", "compile", "bundle"}

_layout: Optional[Layout] = None


def set_banner(layout: Layout) -> None:
    """The run's variant: its banner is shown first (when a selected task builds it), its
    outputs named in the summary line."""
    global _layout
    _layout = layout


def banner(layout: Layout) -> str:
    cfg = layout.cfg
    version, deployable = describe(cfg.backend)
    note = "" if deployable else "  [reference backend: open formats, NOT deployable]"
    return (f"hexbundle {__version__}: {cfg.model.name}, plan {cfg.plan.name} "
            f"({len(cfg.plan.layers_per_part)} parts) for {cfg.device.banner()}\n  backend "
            f"{cfg.backend} ({version}), executor {cfg.executor}, weights_packing "
            f"{cfg.compile.weights_packing}, weight_sharing "
            f"{cfg.compile.weight_sharing}{note}\n  convert: float_precision "
            f"{cfg.compile.float_bitwidth}, truncate_64bit_io "
            f"{cfg.compile.truncate_64bit_io}, quantize_io {cfg.compile.quantize_io}, "
            f"quantize_full_type {cfg.compile.quantize_full_type or '(not passed)'}\n  output: "
            f"{layout.rel(layout.build_dir)}")


def builds_variant(selected: list) -> bool:
    """True if a selected task (`convert`, `convert:part_1_...`) builds or checks the variant."""
    return any(name.split(":")[0] in VARIANT_TASKS for name in selected)


def verify_verdict(layout: Layout) -> str:
    """`verify: PASSED (build/.../verify/report.json)`, read from the report on disk."""
    path = layout.verify_report
    try:
        report = json.loads(read_state(path))   # never through a symbolic link
    except (OSError, ValueError):
        return f"verify: no report ({layout.rel(path)} is missing or unreadable)"
    verdict = "PASSED" if report.get("ok") else "FAILED"
    return f"verify: {verdict} ({layout.rel(path)})"


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{int(s // 60)} min {s % 60:.0f} s"


def _explained(task) -> bool:
    return explain.active() is not None and bool(task.actions) and not task.name.startswith("_")


class Reporter(ConsoleReporter):
    """doit's console reporter, plus the banner first and the summary line last."""

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)
        self.started = time.monotonic()
        self.selected = list(selected_tasks or [])
        self.ran, self.skipped, self.failed, self.succeeded = [], [], [], []
        if _layout is not None and builds_variant(self.selected) and not console.quiet():
            self.outstream.write(banner(_layout) + "\n")

    def execute_task(self, task):
        if _explained(task):   # before it runs: the DB still holds its last run's record
            explain.active().running(task)
        super().execute_task(task)
        if task.actions and not task.name.startswith("_"):
            self.ran.append(task.name)

    def skip_uptodate(self, task):
        super().skip_uptodate(task)
        if task.actions and not task.name.startswith("_"):
            self.skipped.append(task.name)
        self._explain(task, "up to date")

    def add_failure(self, task, fail):
        super().add_failure(task, fail)
        self.failed.append(task.name)
        message = str(getattr(fail, "message", "") or "").strip()
        self._explain(task, "failed", message.splitlines()[:1])

    def add_success(self, task):
        super().add_success(task)
        self.succeeded.append(task.name)
        self._explain(task, "success")
        db.save_progress()   # a run killed later keeps this task's record

    def _explain(self, task, outcome: str, failure=()) -> None:
        """--explain's line for the step (graph.explain), asked for: shown at any verbosity."""
        if _explained(task):
            self.write(explain.active().line(task, outcome, "".join(failure)) + "\n")
            self.outstream.flush()

    def complete_run(self):
        super().complete_run()
        if _layout is None or not hasattr(self, "started"):
            return
        stopped = isinstance(sys.exc_info()[1], KeyboardInterrupt)
        if builds_variant(self.selected) or self.failed or self.runtime_errors or stopped:
            self.write(self.summary() + "\n")
        self.outstream.flush()

    def summary(self) -> str:
        """One line: what, where, how many steps ran / were up to date, how long."""
        layout, cfg = _layout, _layout.cfg
        elapsed = _seconds(time.monotonic() - self.started)
        ran = len(self.ran) - len(self.failed)
        counts = f"{ran} step{'s' if ran != 1 else ''} ran, {len(self.skipped)} up to date"
        stopped = sys.exc_info()[1]   # complete_run runs in doit's `finally`: Ctrl-C, SIGTERM
        if isinstance(stopped, KeyboardInterrupt):
            running = [n for n in self.ran if n not in self.succeeded and n not in self.failed]
            how = "SIGTERM" if type(stopped).__name__ == "Terminated" else "Ctrl-C"
            done = len(self.succeeded)
            return (f"hexbundle: stopped by {how} during {', '.join(running) or 'the run'}: "
                    f"{done} step{'s' if done != 1 else ''} finished, {len(self.skipped)} up "
                    f"to date, {elapsed}")
        if self.failed:
            name = self.failed[0]
            base = name.split(":")[0]
            where = (f"log: {layout.rel(layout.log(name))}" if base in STEP_TASKS
                     else f"report: {layout.rel(layout.verify_report)}" if base == "verify"
                     else "its message is above")
            more = f" (and {len(self.failed) - 1} more)" if len(self.failed) > 1 else ""
            return (f"hexbundle: FAILED: task {name}{more} ({where}); {counts}, {elapsed}")
        if self.runtime_errors:
            return f"hexbundle: aborted: {counts}, {elapsed}"
        names = {n.split(":")[0] for n in self.selected}
        _, deployable = describe(cfg.backend)
        backend = f"{cfg.backend} backend" + ("" if deployable else ", NOT deployable")
        if "verify" in names:   # the verdict, read from the report, even when up to date
            head = f"{verify_verdict(layout)}, bundle {layout.rel(layout.bundle_dir)}"
        elif "release" in names:
            head = f"release {layout.rel(layout.release_dir)}"
        elif "bundle" in names:
            head = f"bundle {layout.rel(layout.bundle_dir)}"
        else:
            head = " ".join(self.selected) + f" of {layout.rel(layout.build_dir)}"
        return f"hexbundle: {head} ({backend}): {counts}, {elapsed}"
