"""A running step on the console: the bytes its work reports (support.progress), as a live bar
on a TTY (tqdm), else a line every HEXBUNDLE_PROGRESS_EVERY seconds (default 15) with the part,
bytes done / total, rate and ETA; a step that reports nothing says it is still running.

Used by the build steps' executor (steps/executor.py) and by `doit gen_inputs`
(inputs/generate.py); fed by this process's meters or by the docker executor's relay of the
container's progress lines.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Optional

from hexbundle.support import progress
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
        if progress.stdout_is_tty():
            self._bars(done)
        else:
            while not done.wait(self.every):
                say(self.line())

    def _bars(self, done: threading.Event) -> None:
        """A live bar per metered part of the step; the heartbeat line when nothing is metered."""
        from tqdm import tqdm
        bar, shown, last_line = None, None, time.monotonic()
        try:
            while not done.wait(BAR_REFRESH_S):
                snap = self.current()
                if snap is not None and (bar is None or snap.what != shown):
                    if bar is not None:
                        bar.close()
                    shown = snap.what
                    bar = tqdm(total=snap.total, desc=f"  {self.task} {snap.what}", unit="B",
                               unit_scale=True, unit_divisor=1024, file=sys.__stdout__,
                               leave=False, dynamic_ncols=True, mininterval=BAR_REFRESH_S)
                if snap is not None:
                    bar.update(min(snap.done, snap.total) - bar.n)
                elif bar is not None:
                    bar.close()
                    bar, shown = None, None
                if bar is None and time.monotonic() - last_line >= self.every:
                    last_line = time.monotonic()
                    say(self.line())
        finally:
            if bar is not None:
                bar.close()


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
        shows.join(timeout=2)   # its bar is cleared before the next line
