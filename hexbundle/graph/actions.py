"""The one doit action wrapper: the library raises HexbundleError, doit shows TaskFailed.

Library functions know nothing of doit: they return on success and raise a HexbundleError whose
message names the file, the key and what to do. `action(fn, *args)` makes a doit python-action
of such a function: the error becomes doit's TaskFailed (its message shown, no traceback, exit
non-zero); anything else is a bug and doit shows its traceback.
"""
from __future__ import annotations

from doit.exceptions import TaskFailed

from hexbundle.support.errors import HexbundleError


def action(fn, *args, **kwargs) -> tuple:
    """A doit python-action running fn(*args, **kwargs). Task params and pos_arg reach fn as
    keyword arguments (doit passes them to a callable that takes **kwargs)."""
    return (_run, [fn, *args], kwargs)


def _run(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except HexbundleError as exc:
        return TaskFailed(str(exc))
    return True
