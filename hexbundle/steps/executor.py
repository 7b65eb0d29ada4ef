"""Executors run one build step (a `hexbundle.steps.runner` spec) and capture its log.

local:  `hexbundle.steps.runner.run(spec)` in this Python process, logging to the step's file (a
        subprocess would pay ~1 s of onnx/ml_dtypes imports per step: 12 s of an 18 s tiny build).
docker: the same step runner inside the pinned toolchain image (hexbundle.steps.docker_executor).

The step's output goes to build/<model>/<device>/<plan>/<backend>/logs/<task>.log; on failure its
tail is shown. While it runs, its monitor shows the bytes its work reports (support.progress):
the status line on a terminal, else a line every HEXBUNDLE_PROGRESS_EVERY seconds (default 15) with the
part, bytes done / total, rate and ETA; a step that reports nothing says it is still running.
"""
from __future__ import annotations

import time
from pathlib import Path

from hexbundle.config import resolved
from hexbundle.config.layout import Layout
from hexbundle.support.console import counter, say
from hexbundle.support.errors import StepFailed
from hexbundle.support.files import open_in_place
from hexbundle.support.monitor import monitored

TAIL_LINES = 40
ERROR_PREFIX = "error: "   # how a step logs its HexbundleError (runner, docker_executor)


def described_spec(layout: Layout, description: dict) -> dict:
    """What the step runner needs: the step's description (steps.description), which is all
    the step reads, and where this build keeps its file digests (so a file doit has hashed is
    not read again to make the step's output key)."""
    return {"step": description["step"], "description": description,
            "digest_cache": resolved.dump(layout.digest_cache)}


def _tail(path: Path, n: int = TAIL_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _step_error(tail: str) -> str:
    """The step's own error message: the runner (steps/runner.py) and the docker executor log
    a HexbundleError as one "error: <message>" line; the step may run in a container, so its
    log is the one channel it has. "" when it logged none (a crash, a kill)."""
    errors = [ln for ln in tail.splitlines() if ln.startswith(ERROR_PREFIX)]
    return errors[-1][len(ERROR_PREFIX):] if errors else ""


def run_local(spec: dict, log_path: Path) -> int:
    from hexbundle.steps.runner import run
    with open_in_place(log_path) as fh:   # never through a symbolic link
        def log(msg: str) -> None:
            fh.write(msg + "\n")
            fh.flush()
        return run(spec, log)


def run_step(layout: Layout, task: str, step: str, description=None, **extra) -> None:
    """Run the step, report it; StepFailed (with the log's last lines) on failure. The step
    (graph.stepdesc) gets its description alone, not the config; `extra` (its arguments) are
    in the description already."""
    cfg = layout.cfg
    layout.logs_dir.mkdir(parents=True, exist_ok=True)
    log_path = layout.log(task)
    spec = described_spec(layout, description)
    label = f"{task} [{cfg.backend}/{cfg.executor}]"
    started = time.monotonic()
    with monitored(task, label) as monitor:
        if cfg.executor == "docker":
            from hexbundle.steps.docker_executor import run_in_container
            code = run_in_container(layout, spec, log_path, task=task,
                                    on_progress=monitor.relayed)
        else:
            code = run_local(spec, log_path)
    elapsed = time.monotonic() - started
    if code != 0:
        tail = _tail(log_path)
        raise StepFailed(f"{label} failed (exit {code}) after {elapsed:.1f}s; log: "
                          f"{layout.rel(log_path)}\n--- last lines ---\n{tail}",
                          error=_step_error(tail))
    if counter(task) is None:   # a task the reporter numbers gets its line there (graph.reporter)
        say(f"  ok {label} {elapsed:.1f}s  (log: {layout.rel(log_path)})")
