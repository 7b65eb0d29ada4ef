"""Ctrl-C and SIGTERM end a run with one line, not a traceback.

SIGTERM (kill, systemd, a CI runner's timeout) is raised as Ctrl-C is (Terminated, a
KeyboardInterrupt): every writer's temp file is removed on the way out, the step containers
too, and the run exits 143 (128 + SIGTERM). Installed by graph.runguard.guard_run.
"""
from __future__ import annotations

import os
import signal
import sys


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: it unwinds the run, so every temp file is removed."""


def _terminate(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # once: the clean-up is not cut short
    raise Terminated()


def report_interrupts_cleanly() -> None:
    if getattr(sys.excepthook, "hexbundle", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        if issubclass(kind, Terminated):
            print("\nhexbundle: terminated (SIGTERM); temporary files removed, the steps that "
                  "finished are saved and the next `doit bundle` carries on from there",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(128 + signal.SIGTERM)   # as a process killed by it reports (143)
        if issubclass(kind, KeyboardInterrupt):
            print("\nhexbundle: interrupted; the steps that finished are saved and the next "
                  "`doit bundle` carries on from there", file=sys.stderr, flush=True)
            return
        previous(kind, value, tb)

    hook.hexbundle = True
    sys.excepthook = hook
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:   # not one a caller set
        signal.signal(signal.SIGTERM, _terminate)
