"""A running step on the console: the bytes its work reports (support.progress), on the one
status line on a terminal (support.console), else a line every HEXBUNDLE_PROGRESS_EVERY seconds (default 15) with the part,
bytes done / total, rate and ETA; a step that reports nothing says it is still running.

Used by the build steps' executor (steps/executor.py) and by `doit gen_inputs`
(inputs/generate.py); fed by this process's meters or by the docker executor's relay of the
container's progress lines.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Optional

from hexbundle.support import console, progress
from hexbundle.support.console import say
from hexbundle.support.errors import HexbundleError

PROGRESS_EVERY_S = 15.0
PROGRESS_ENV = "HEXBUNDLE_PROGRESS_EVERY"
BAR_REFRESH_S = 0.25


def progress_every() -> float:
    """Seconds between progress lines when stdout is not a TTY: HEXBUNDLE_PROGRESS_EVERY."""
    text = os.environ.get(PROGRESS_ENV, "").strip()
    if not text:
        return PROGRESS_EVERY_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise HexbundleError(f"environment variable {PROGRESS_ENV}={text!r}: expected a number of "
                             f"seconds above 0; unset it for the default ({PROGRESS_EVERY_S:.0f})")
    return value


class Monitor:
    """One step on the console while it runs. A progress sink (support.progress) for a step in
    this process; fed by the docker executor's relay (`relayed`) for a step in a container."""

    def __init__(self, task: str, label: str, started: float, every: float):
        self.task, self.label, self.started, self.every = task, label, started, every
        self.meter: Optional[progress.Meter] = None
        self.remote: Optional[progress.Snapshot] = None
        self.remote_at = 0.0

    # the sink of the step's thread (local executor)
    def opened(self, m: progress.Meter) -> None:
        self.meter = m

    def advanced(self, m: progress.Meter) -> None:
        pass

    def closed(self, m: progress.Meter) -> None:
        self.meter = None

    # the docker executor's relay
    def relayed(self, snap: progress.Snapshot, closed: bool) -> None:
        self.remote, self.remote_at = (None if closed else snap), time.monotonic()

    def current(self) -> Optional[progress.Snapshot]:
        m = self.meter
        if m is not None:
            return m.snapshot()
        snap = self.remote
        if snap is not None:   # as the container saw it, aged to now
            snap = progress.Snapshot(snap.what, snap.done, snap.total,
                                     snap.seconds + time.monotonic() - self.remote_at)
        return snap

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        snap = self.current()
        if snap is None:
            return f"  .. {self.label}: still running, {elapsed:.0f}s"
        return f"  .. {self.label}: {snap.describe()}, {elapsed:.0f}s elapsed"

    def run(self, done: threading.Event) -> None:
        if console.terminal():
            self._status_line(done)
        else:
            while not done.wait(self.every):
                say(self.line())

    def status(self) -> str:
        """The status line: `[5/18] compile:part_3_of_4 DLC weights 42% 1.2 GiB/s`, or the
        time it has run when it reports no bytes."""
        head = " ".join(filter(None, (console.counter(self.task), self.task)))
        snap = self.current()
        if snap is None:
            return f"{head} {time.monotonic() - self.started:.0f}s"
        pct = f" {100 * min(snap.done, snap.total) / snap.total:.0f}%" if snap.total else ""
        return f"{head} {snap.what}{pct} {progress.size(snap.rate)}/s"

    def _status_line(self, done: threading.Event) -> None:
        """On a terminal: the one status line (support.console), rewritten as the step goes."""
        while not done.wait(BAR_REFRESH_S):
            console.status(self.status())


@contextmanager
def monitored(task: str, label: str):
    """Show the work in the block on the console (Monitor), this thread's meters included."""
    monitor = Monitor(task, label, time.monotonic(), progress_every())
    done = threading.Event()
    shows = threading.Thread(target=monitor.run, args=(done,), daemon=True)
    shows.start()
    progress.set_sink(monitor)
    try:
        yield monitor
    finally:
        progress.set_sink(None)
        done.set()
        shows.join(timeout=2)   # its last status is drawn before the next line
        if console.counter(task) is None:   # no reporter takes the line over (gen_inputs)
            console.clear_status()
