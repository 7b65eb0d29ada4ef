"""doit's task loader for hexbundle: doit's own dodo.py loader, named in pyproject.toml
([tool.doit] loader, [tool.doit.plugins.loader]) because doit makes its loader before it reads
the command line's `name=value` settings, and that is where an empty argument has to be caught.

Why: doit 0.36-0.37 reads `arg[0]` of every command-line argument (DoitMain.process_args, and
again when it loads the tasks), so an empty one (`doit import_export --name ""`) raised
IndexError: a traceback before any task code ran. The loader refuses it by name first (exit 3).
Nothing else differs from doit's DodoTaskLoader.
"""
from __future__ import annotations

import sys

from doit.cmd_base import DodoTaskLoader


def refuse_empty_arguments(args: list) -> None:
    for index, arg in enumerate(args):
        if arg == "":
            after = args[index - 1] if index and args[index - 1].startswith("-") else ""
            sys.stderr.write(f"hexbundle: an empty argument{f' after {after}' if after else ''}: "
                             f"give it a value{f', e.g. {after} VALUE' if after else ''}\n")
            raise SystemExit(3)


class Loader(DodoTaskLoader):
    """doit's dodo.py loader; made by doit before it parses the command line (doit's own run
    of `python3 -m doit ...`: sys.argv), which is checked here."""

    def __init__(self):
        super().__init__()
        refuse_empty_arguments(sys.argv[1:])
