"""Ctrl-C and SIGTERM end a run with one line, not a traceback.

SIGTERM (kill, systemd, a CI runner's timeout) is raised as Ctrl-C is (Terminated, a
KeyboardInterrupt): every writer's temp file is removed on the way out, the step containers
too, and the run exits 143 (128 + SIGTERM). Installed by graph.runguard.guard_run.

Start-up (doit reading dodo.py, its imports, the configs, the run guard) is guarded from the
moment doit imports hexbundle's plugins (graph/__init__.py, guard_start_up) until doit has its
tasks (graph.loader, start_up_over): an
interrupt there ends the run with one line and exit 130, and every further Ctrl-C is ignored
while it exits (a second one used to print a KeyboardInterrupt traceback from wherever the
first one's unwinding was). Before hexbundle's loader is imported, Python is still importing doit
itself: an interrupt there is Python's own.

Work in flight elsewhere (a remote executor's operations, support.inflight) is stopped first,
whichever thread waits on it: under `doit -n N` the interrupt lands in doit's main thread, which
waits for results, not in the steps' threads that wait on the server.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Optional

from hexbundle.support import inflight


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: it unwinds the run, so every temp file is removed."""


def _terminate(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # once: the clean-up is not cut short
    raise Terminated()


START_UP_LINE = "hexbundle: interrupted while starting up; nothing was run"


def _start_up_interrupt(signum, frame) -> None:
    """Ctrl-C during start-up: once. Every later one is ignored while the run exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt()


def running_doit() -> bool:
    """This process is `python3 -m doit` (or doit's own script): its start-up is guarded. A
    test or a tool that imports hexbundle keeps its own Ctrl-C."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", "") == "doit.__main__" or \
        os.path.basename(sys.argv[0] if sys.argv else "") == "doit"


def guard_start_up() -> None:
    """From here until start_up_over(): a Ctrl-C raises KeyboardInterrupt once (the loader's
    steps turn it into START_UP_LINE and exit 130), and one that reaches the top level between
    them is the same line, not a traceback."""
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _start_up_interrupt)
    except ValueError:   # not the main thread (doit run in-process by a caller): theirs
        return
    if getattr(sys.excepthook, "hexbundle", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            previous(kind, value, tb)
            return
        ignore_further_interrupts()
        print(f"\n{START_UP_LINE}", file=sys.stderr, flush=True)

    hook.hexbundle = True
    sys.excepthook = hook


def ignore_further_interrupts() -> None:
    """The run is ending after an interrupt: another Ctrl-C must not cut its exit short with a
    traceback."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        pass


def start_up_over() -> None:
    """doit has its tasks: Ctrl-C is the run's again (report_interrupts_cleanly)."""
    try:
        if signal.getsignal(signal.SIGINT) is _start_up_interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:
        pass


# What the run was asked to do (graph.loader: the command line's task names and variables),
# for the line that says what happens next; None: `doit` with its default tasks.
_command: Optional[list] = None


def remember_command(arguments) -> None:
    global _command
    _command = list(arguments or [])


def what_next() -> str:
    """What an interrupted run leaves and how to go on, true for the command that ran: the
    steps that finished are kept, and the same command carries on from there; verify keeps no
    partial result (its report is written whole at its end, the last one left as it was)."""
    command = "`doit " + " ".join(_command or ["bundle"]) + "`"
    tasks = {a.split(":")[0] for a in (_command or []) if "=" not in a and not a.startswith("-")}
    if "verify" in tasks:
        return ("the steps that finished are saved; verify itself keeps no partial result (the "
                "last report, if any, is as it was): " + command + " runs it again from the "
                "start")
    return f"the steps that finished are saved and the next {command} carries on from there"


def report_interrupts_cleanly() -> None:
    if getattr(sys.excepthook, "hexbundle_run", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            previous(kind, value, tb)
            return
        stopped = stop_in_flight()   # the run has unwound: this thread holds no lock
        ignore_further_interrupts()   # the run is exiting: no traceback from another Ctrl-C
        if issubclass(kind, Terminated):
            print("\n" + "\n".join(stopped + [
                f"hexbundle: terminated (SIGTERM); temporary files removed, {what_next()}"]),
                file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(128 + signal.SIGTERM)   # as a process killed by it reports (143)
        print("\n" + "\n".join(stopped + [f"hexbundle: interrupted; {what_next()}"]),
              file=sys.stderr, flush=True)

    hook.hexbundle = hook.hexbundle_run = True
    sys.excepthook = hook
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:   # not one a caller set
        signal.signal(signal.SIGTERM, _terminate)


def stop_in_flight() -> list:
    """Cancel what the run has in flight elsewhere (support.inflight); the lines saying what."""
    try:
        return inflight.interrupt()
    except KeyboardInterrupt:   # a second Ctrl-C while it waits for the steps' threads
        return ["hexbundle: interrupted again: stopped waiting for the remote steps to unwind"]
    except Exception as exc:   # the run still stops with its line, not a traceback
        return [f"hexbundle: could not stop the remote work in flight ({exc})"]
