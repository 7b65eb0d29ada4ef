"""Work a run has in flight elsewhere (a remote executor's operations), told to the layers above
without importing them: the stage of each remote step, for the status line, and how to stop
them all, for Ctrl-C and SIGTERM.

    inflight.set_stage("convert:part_1_of_4", "queued")   # remote/executed.py, any thread
    inflight.done("convert:part_1_of_4")
    inflight.listen(draw)       # graph.reporter on a terminal: draw(stages) on every change
    inflight.on_interrupt(stop) # remote/executed.py: stop() cancels its operations
    inflight.interrupt()        # graph.interrupts, once the interrupt has unwound the run

The stages are kept under one lock and a listener is called under it, so two threads' changes
are drawn in the order they happened, never interleaved.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

_lock = threading.RLock()
_stages: dict = {}          # task -> stage, in the order the tasks first reported one
_listener: Optional[Callable[[dict], None]] = None
_stoppers: list = []        # callables -> lines saying what they stopped


def set_stage(task: str, stage: str) -> bool:
    """`task`'s remote stage is now `stage`; True if a listener shows it (else the caller says
    its own line)."""
    with _lock:
        _stages[task] = stage
        return _notify()


def done(task: str) -> None:
    """`task` has nothing in flight any more."""
    with _lock:
        if _stages.pop(task, None) is not None:
            _notify()


def stages() -> dict:
    """task -> stage of every step in flight now, oldest first."""
    with _lock:
        return dict(_stages)


def listen(listener: Optional[Callable[[dict], None]]) -> None:
    """`listener(stages)` is called on every change (under the lock: keep it short); None: no
    listener any more."""
    global _listener
    with _lock:
        _listener = listener


def _notify() -> bool:
    if _listener is None:
        return False
    _listener(dict(_stages))
    return True


def on_interrupt(stopper: Callable[[], list]) -> None:
    """`stopper()` is called once when the run is interrupted; it returns lines for the user."""
    with _lock:
        if stopper not in _stoppers:
            _stoppers.append(stopper)


def interrupt() -> list:
    """Stop everything in flight (each stopper once); the lines they return."""
    with _lock:
        stoppers = list(_stoppers)
        _stoppers.clear()
    lines: list = []
    for stop in stoppers:   # not under the lock: a stopper waits for the steps' threads
        lines += stop()
    return lines
