"""Test hook: hold a build step at a chosen point, so a test can kill or interrupt it there.

Interrupted-build tests must hit the step while it is writing, every time, on any machine;
a sleep-and-hope kill would be flaky. Each step has one pause point:

  convert, compile   in the middle of writing the DLC / context binary (the first two blobs,
                     the topology and a weight, are in the temp file, the header is not): a kill
                     here leaves a partial temp file, and the step's progress meter has bytes
  bundle             the staging directory is complete, the swap into bundle/ has not happened
  start-up           (not a step) doit's loader, before dodo.py's tasks are read
  plugins            (not a step) the first hexbundle code doit runs: its import of
                     hexbundle.graph (the plugins), dodo.py not read yet

    HEXBUNDLE_TEST_PAUSE_AT=compile HEXBUNDLE_TEST_PAUSE_DIR=/tmp/p python3 -m doit bundle

When a step reaches its point it writes <DIR>/paused (pid, step) and waits until <DIR>/release
exists (then carries on; it pauses once per process). A test kills (SIGKILL), interrupts
(SIGINT) or releases it. Unset (always, outside tests): a no-op. The local executor honours it
in the doit process; the docker executor passes both variables into the step's container and
mounts the directory there (it must be writable by the step's uid).
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

PAUSE_AT_ENV = "HEXBUNDLE_TEST_PAUSE_AT"
PAUSE_DIR_ENV = "HEXBUNDLE_TEST_PAUSE_DIR"
START_UP = "start-up"
PLUGINS = "plugins"

_step = threading.local()      # steps of a parallel run (doit -n 2) run in separate threads
_paused_once = threading.Event()


def set_step(step: str) -> None:
    """Called by the step runner: which step this thread is running."""
    _step.name = step


def pause_point() -> None:
    """Wait here if HEXBUNDLE_TEST_PAUSE_AT names the step this thread is running."""
    wanted = os.environ.get(PAUSE_AT_ENV)
    if not wanted or wanted != getattr(_step, "name", None) or _paused_once.is_set():
        return
    _paused_once.set()
    directory = Path(os.environ.get(PAUSE_DIR_ENV) or ".")
    (directory / "paused").write_text(f"{os.getpid()} {wanted}\n")
    while not (directory / "release").exists():
        time.sleep(0.02)   # SIGINT lands here as KeyboardInterrupt, as it would mid-write
