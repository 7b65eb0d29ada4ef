"""doit's console reporter, as ninja shows a build: the banner first (what is built, with which
backend, executor, device); on a terminal one status line that rewrites itself (`[5/18]
compile:part_3_of_4 DLC weights 42% 1.2 GiB/s`, support.console and support.monitor; the steps
on a remote executor with their stage, `[3/18] remote: convert:part_1_of_4 executing,
convert:part_2_of_4 queued`, support.inflight), else one line a step when it is done (`[5/18] compile:part_3_of_4 [reference/local] 0.4s`; nothing for
a step up to date; a tool's line when it starts, so that its verdict is its last line); what tasks print (the size table, verify's table); one summary line last
(what was built or checked, where, how many steps were built, fetched from the remote cache,
run remotely and up to date, how long; on failure which task failed and where its log is).

The banner is only for runs that build or check a variant (VARIANT_TASKS): `doit inspect`,
`doit import_export`, `doit image`... do not build the default model, so they don't name it.
Those tools end with their own verdict (inspect's counts, the image's ID...): the summary line
follows it only when they fail or are stopped.
"""
from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Optional

from doit.reporter import ConsoleReporter

from hexbundle import __version__
from hexbundle.backends import describe
from hexbundle.config.layout import Layout
from hexbundle.graph import db
from hexbundle.support import console, inflight
from hexbundle.support.jsondoc import read_state_json

# The tasks that build or check the variant the configs and the command line resolve to.
VARIANT_TASKS = {"inputs", "convert", "compile", "check_sizes", "bundle", "verify", "release"}
# The build steps (steps/executor.py): their output is in the variant's logs/<task>.log.
STEP_TASKS = {"inputs", "convert", "compile", "bundle"}

# How a step that ran got its outputs, from the record it left (formats.origins: "origin"):
# built here unless the record says otherwise. The hook for a remote executor: a step it ran
# records its own origin, mapped here to RUN_REMOTELY, and the summary counts it.
BUILT, FETCHED, RUN_REMOTELY = "built", "fetched", "run remotely"
ORIGIN_OUTCOMES = {"remote-cache": FETCHED, "remote-execution": RUN_REMOTELY}

_layout: Optional[Layout] = None


def set_banner(layout: Layout) -> None:
    """The run's variant: its banner is shown first (when a selected task builds it), its
    outputs named in the summary line."""
    global _layout
    _layout = layout


def banner(layout: Layout) -> str:
    cfg = layout.cfg
    version, deployable = describe(cfg.backend)
    note = "" if deployable else (
        "  [reference backend: open formats, NOT deployable]" if cfg.backend == "reference" else
        f"  [{cfg.backend} backend: NOT deployable yet: the manifest's runtime.deployment says "
        "why]")
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
        report = read_state_json(path)   # never through a symbolic link
    except (OSError, ValueError):
        return f"verify: no report ({layout.rel(path)} is missing or unreadable)"
    verdict = "PASSED" if report.get("ok") else "FAILED"
    return f"verify: {verdict} ({layout.rel(path)})"


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{int(s // 60)} min {s % 60:.0f} s"


def _shown(task) -> bool:
    """A step of the run (doit's rule: a task with actions, not a hidden `_name`)."""
    return bool(task.actions) and not task.name.startswith("_")


def reached_steps(tasks: dict, selected: list) -> set:
    """The steps the run reaches: the selected tasks and what they depend on (the N of
    `[n/N]`). A name doit takes as a target or a pattern is not counted until it runs."""
    seen, todo = set(), [n for n in selected if n in tasks]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        task = tasks[name]
        todo += [d for d in list(task.task_dep) + list(task.setup_tasks) if d in tasks]
    return {n for n in seen if _shown(tasks[n])}


def step_outcome(layout: Optional[Layout], name: str) -> str:
    """BUILT, FETCHED or RUN_REMOTELY: the origin record the step that just ran left
    (formats.origins; graph.remote_steps writes it for the cacheable steps)."""
    if layout is None or name.split(":")[0] not in STEP_TASKS:
        return BUILT
    try:
        origin = read_state_json(layout.step_origin(name)).get("origin")
    except (OSError, ValueError, AttributeError):
        return BUILT
    return ORIGIN_OUTCOMES.get(origin, BUILT)


def counts(outcomes: Counter, uptodate: int) -> str:
    """`3 built, 15 fetched, 0 up to date`: fetched and run remotely only when some were."""
    parts = [f"{outcomes[BUILT]} built"]
    parts += [f"{outcomes[k]} {k}" for k in (FETCHED, RUN_REMOTELY) if outcomes[k]]
    return ", ".join(parts + [f"{uptodate} up to date"])


def _explainer():
    """graph.explain's active explainer (`--explain`), or None; explain and what it imports are
    loaded only by a run that asked for it (graph.commands)."""
    explain = sys.modules.get("hexbundle.graph.explain")
    return explain.active() if explain is not None else None


def _explained(task) -> bool:
    return _explainer() is not None and bool(task.actions) and not task.name.startswith("_")


class Reporter(ConsoleReporter):
    """doit's console reporter, plus the banner first, ninja's step lines and the summary line
    last (see the module)."""

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)
        self.started = time.monotonic()
        self.selected = list(selected_tasks or [])
        self.ran, self.skipped, self.failed, self.succeeded = [], [], [], []
        self.tasks, self.executed, self.lines = tasks, False, []
        self.total = len(reached_steps(tasks, self.selected))
        self.number, self.began, self.outcomes = {}, {}, Counter()
        self.terminal = console.terminal()
        if self.terminal:   # else remote/executed.py says a line per stage
            inflight.listen(self._remote_stages)
        # a tool (inspect, image, ...) ends with its own verdict: its line comes first
        self.lines_first = not builds_variant(self.selected)
        if _layout is not None and builds_variant(self.selected) and not console.quiet():
            self.lines.append(banner(_layout))
            self.outstream.write(self.lines[-1] + "\n")

    def execute_task(self, task):
        self.executed = True   # not a no-op run: no stamp (graph.noopstamp)
        if _explained(task):   # before it runs: the DB still holds its last run's record
            _explainer().running(task)
        if _shown(task):   # (not doit's `.  name` line: the step's line says it when done)
            self.ran.append(task.name)
            self.number[task.name] = len(self.number) + 1
            self.total = max(self.total, len(self.number))   # a target named: found late
            self.began[task.name] = time.monotonic()
            console.set_counter(task.name, self._counter(task.name))
            console.status(f"{self._counter(task.name)} {task.name}")
            if self.lines_first and not self.terminal:
                self.write(f"{self._counter(task.name)} {task.name}\n")
                self.outstream.flush()

    def _counter(self, name: str) -> str:
        return f"[{self.number[name]}/{self.total}]"

    def _remote_stages(self, stages: dict) -> None:
        """support.inflight's steps on a remote executor changed (any thread, under its lock):
        the status line shows each with its stage; none left, the next step line takes over."""
        if stages:
            console.status(f"[{len(self.number)}/{self.total}] remote: " +
                           ", ".join(f"{task} {stage}" for task, stage in stages.items()))

    def write(self, text):
        """doit's lines (failures, aborts), below the status line (support.console)."""
        if self.terminal:
            console.clear_status()
        super().write(text)

    def skip_uptodate(self, task):
        # nothing on the console (ninja): the summary line counts it
        if _shown(task):
            self.skipped.append(task.name)
        self._explain(task, "up to date")

    def add_failure(self, task, fail):
        self._step_line(task, "FAILED ")
        super().add_failure(task, fail)
        self.failed.append(task.name)
        message = str(getattr(fail, "message", "") or "").strip()
        self._explain(task, "failed", message.splitlines()[:1])

    def add_success(self, task):
        super().add_success(task)
        self.succeeded.append(task.name)
        if _shown(task):
            outcome = step_outcome(_layout, task.name)
            self.outcomes[outcome] += 1
            self._step_line(task, "", outcome)
        self._explain(task, "success")
        db.save_progress()   # a run killed later keeps this task's record

    def _step_line(self, task, prefix: str, outcome: str = "") -> None:
        """The step is done: one line off a terminal (`[5/18] compile:part_1_of_4
        [reference/local] 0.4s`, `fetched`, `FAILED ...`); on a terminal the status line."""
        if task.name not in self.number:
            return
        counter = self._counter(task.name)
        console.set_counter(task.name, None)
        elapsed = time.monotonic() - self.began.get(task.name, time.monotonic())
        how = ""
        if outcome in (FETCHED, RUN_REMOTELY):
            how = f" {outcome}"
        elif outcome == BUILT and _layout is not None and task.name.split(":")[0] in STEP_TASKS:
            how = f" [{_layout.cfg.backend}/{_layout.cfg.executor}]"
        line = f"{counter} {prefix}{task.name}{how} {elapsed:.1f}s"
        if self.lines_first and not prefix:
            return   # said when it started
        if self.terminal and not prefix:
            console.status(line)
            return
        self.write(line + "\n")
        self.outstream.flush()

    def _explain(self, task, outcome: str, failure=()) -> None:
        """--explain's line for the step (graph.explain), asked for: shown at any verbosity."""
        if _explained(task):
            self.write(_explainer().line(task, outcome, "".join(failure)) + "\n")
            self.outstream.flush()

    def complete_run(self):
        super().complete_run()
        if self.terminal:
            inflight.listen(None)
            console.clear_status()
        if _layout is None or not hasattr(self, "started"):
            return
        stopped = isinstance(sys.exc_info()[1], KeyboardInterrupt)
        if builds_variant(self.selected) or self.failed or self.runtime_errors or stopped:
            summary = self.summary()
            self.write(summary + "\n")
            if not (self.executed or self.failed or self.runtime_errors or stopped
                    or sys.exc_info()[1] is not None):
                from hexbundle.graph import noopstamp
                noopstamp.record(_layout, self.tasks.values(), sys.argv, self.lines,
                                 noopstamp.summary_prefix(summary))
        self.outstream.flush()

    def summary(self) -> str:
        """One line: what, where, how many steps were built, fetched, run remotely and up to
        date, how long."""
        layout, cfg = _layout, _layout.cfg
        elapsed = _seconds(time.monotonic() - self.started)
        done = counts(self.outcomes, len(self.skipped))
        stopped = sys.exc_info()[1]   # complete_run runs in doit's `finally`: Ctrl-C, SIGTERM
        if isinstance(stopped, KeyboardInterrupt):
            running = [n for n in self.ran if n not in self.succeeded and n not in self.failed]
            how = "SIGTERM" if type(stopped).__name__ == "Terminated" else "Ctrl-C"
            finished = len(self.succeeded)
            return (f"hexbundle: stopped by {how} during {', '.join(running) or 'the run'}: "
                    f"{finished} step{'s' if finished != 1 else ''} finished, {len(self.skipped)} up "
                    f"to date, {elapsed}")
        if self.failed:
            name = self.failed[0]
            base = name.split(":")[0]
            where = (f"log: {layout.rel(layout.log(name))}" if base in STEP_TASKS
                     else f"report: {layout.rel(layout.verify_report)}" if base == "verify"
                     else "its message is above")
            more = f" (and {len(self.failed) - 1} more)" if len(self.failed) > 1 else ""
            return (f"hexbundle: FAILED: task {name}{more} ({where}); {done}, {elapsed}")
        if self.runtime_errors:
            return f"hexbundle: aborted: {done}, {elapsed}"
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
        return f"hexbundle: {head} ({backend}): {done}, {elapsed}"
