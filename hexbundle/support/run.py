"""This process's run: one `doit` process is one run, named by a random id; and, in a step
container, the lifeline that ends the step with the run.

The run guard records the id beside its pid in the build lock (hexbundle.graph.runguard); the
docker executor names and labels each step's container with it (hexbundle.steps.docker_executor),
so the next run can tell the containers of a run that is gone, killed with kill -9, from its own.
"""
from __future__ import annotations

import os
import secrets
import threading

_RUN_ID = secrets.token_hex(6)   # 12 hex digits: a container name's part, unique enough

# Set by the docker executor in a step container whose stdin it holds open (attached) for as long
# as its doit process lives; the engine closes that stdin when the process ends, kill -9 included.
LIFELINE_ENV = "HEXBUNDLE_LIFELINE"
LIFELINE_EXIT = 4   # the step's exit code when its run ended first


def run_id() -> str:
    return _RUN_ID


def end_with_the_run() -> None:
    """In a step container with a lifeline: when stdin closes, the run that started the step is
    gone; stop the step at once (os._exit: the whole container stops with it), so nothing of a
    dead run goes on writing into the build root. Its temp files are the next run's to sweep."""
    if os.environ.get(LIFELINE_ENV) != "stdin":
        return

    def watch() -> None:
        try:   # the raw descriptor: a thread blocked in sys.stdin's buffered read holds its
            while os.read(0, 1 << 16):   # lock, and the interpreter cannot exit past it
                pass
        except OSError:
            pass
        print("hexbundle: the run that started this step has ended (its doit process is "
              "gone): the step stops here", flush=True)
        os._exit(LIFELINE_EXIT)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
