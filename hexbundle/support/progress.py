"""Progress of a long step in bytes: which part of the step, bytes done of the total, rate, ETA.

The step's work reports bytes into a meter; something else shows them:

    with progress.meter("weights", total_bytes):      # in a step (convert, compile, inputs...)
        ... progress.advance(block.nbytes) ...         # deep in the streaming loop; a no-op
                                                       # when no meter is open in this thread
The meter belongs to the thread that opened it (steps run in threads under `doit -n 2`) and
goes to that thread's sink (`set_sink`):
  - in the doit process, the step's monitor (steps/executor.py): the status line on a terminal,
    else a plain line every HEXBUNDLE_PROGRESS_EVERY seconds (default 15);
  - in a step container, `line_sink`: `##hexbundle-progress {json}` lines on stdout, at most one
    a second, which the docker executor takes out of the log and hands to the step's monitor.
A meter opened inside another one (a helper that meters itself, called from a metered step) is
counted in the outer one: the outer total already holds its bytes.
"""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Optional

from hexbundle.support.jsondoc import parse_json

LINE_PREFIX = "##hexbundle-progress "
LINE_EVERY_S = 1.0

_here = threading.local()   # .sink, .meter: this thread's


@dataclass
class Snapshot:
    what: str
    done: int
    total: int
    seconds: float      # since the meter was opened

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta(self) -> Optional[float]:
        left = max(0, self.total - self.done)
        return left / self.rate if self.rate > 0 else None

    def describe(self) -> str:
        """`weights 1.2 GiB / 7.0 GiB (17%), 310 MiB/s, ETA 19s`"""
        done = min(self.done, self.total) if self.total else self.done
        pct = f" ({100 * done / self.total:.0f}%)" if self.total else ""
        eta = "?" if self.eta is None else duration(self.eta)
        return (f"{self.what} {size(done)} / {size(self.total)}{pct}, {size(self.rate)}/s, "
                f"ETA {eta}")

    def to_line(self) -> str:
        return LINE_PREFIX + json.dumps({"what": self.what, "done": self.done,
                                         "total": self.total, "seconds": self.seconds})

    @classmethod
    def from_line(cls, line: str) -> Optional["Snapshot"]:
        if not line.startswith(LINE_PREFIX):
            return None
        try:
            d = parse_json(line[len(LINE_PREFIX):], "progress line", max_bytes=64 << 10)
            return cls(str(d["what"]), int(d["done"]), int(d["total"]), float(d["seconds"]))
        except (ValueError, KeyError, TypeError):
            return None


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def duration(s: float) -> str:
    s = int(round(s))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else \
        f"{s // 3600}h{s % 3600 // 60:02d}m"


class Meter:
    def __init__(self, what: str, total: int, sink):
        self.what, self.total, self.done = what, int(total), 0
        self.started = time.monotonic()
        self.sink = sink

    def snapshot(self) -> Snapshot:
        return Snapshot(self.what, self.done, self.total, time.monotonic() - self.started)

    def add(self, n: int) -> None:
        self.done += int(n)     # one writer (the step's thread); readers take snapshots
        if self.sink is not None:
            self.sink.advanced(self)


def set_sink(sink) -> None:
    """Where this thread's meters go: an object with opened(meter), advanced(meter),
    closed(meter); None: nowhere."""
    _here.sink = sink


@contextmanager
def meter(what: str, total: int):
    """A meter of `total` bytes for the work in the block (see the module's doc)."""
    if getattr(_here, "meter", None) is not None:   # inside another: counted there
        yield _here.meter
        return
    sink = getattr(_here, "sink", None)
    m = Meter(what, total, sink)
    _here.meter = m
    if sink is not None:
        sink.opened(m)
    try:
        yield m
    finally:
        _here.meter = None
        if sink is not None:
            sink.closed(m)


def advance(n: int) -> None:
    """`n` more bytes done by this thread's open meter, if any."""
    m = getattr(_here, "meter", None)
    if m is not None:
        m.add(n)


class LineSink:
    """A step in a container: its meters as `##hexbundle-progress` lines, at most one a second
    (and one when a meter opens and closes), for the executor to relay."""

    def __init__(self, write: Callable[[str], None] = None, every: float = LINE_EVERY_S):
        self.write = write or (lambda line: print(line, flush=True))
        self.every, self.last = every, 0.0

    def opened(self, m: Meter) -> None:
        self.last = time.monotonic()
        self.write(m.snapshot().to_line())

    def advanced(self, m: Meter) -> None:
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self.write(m.snapshot().to_line())

    def closed(self, m: Meter) -> None:
        snap = m.snapshot()
        self.write(LINE_PREFIX + json.dumps({"what": snap.what, "done": snap.done,
                                             "total": snap.total, "seconds": snap.seconds,
                                             "closed": True}))


def is_closed_line(line: str) -> bool:
    return line.startswith(LINE_PREFIX) and '"closed": true' in line
