"""`doit dumpdb` for hexbundle's dependency DB.

doit's own dumpdb reads a dbm file (default `.doit.db`), and does not load dodo.py, so it never
learns where hexbundle keeps its DB nor that it is JSON: it always ended in a traceback. This
command replaces it (pyproject.toml, [tool.doit.plugins.command]): it prints the JSON DB of the
build root (<project>/build, or $HEXBUNDLE_BUILD_ROOT), one task per entry, or says why not.
Read-only: no lock, nothing written.
"""
from __future__ import annotations

import json
import pprint
import sys
from pathlib import Path

from doit.cmd_base import Command

from hexbundle.support.errors import HexbundleError

opt_db = {
    "section": "DB",
    "name": "db_file",
    "short": "",
    "long": "db-file",
    "type": str,
    "default": "",
    "help": "the DB to print [default: <build root>/.hexbundle/doit-db.json]",
}


class DumpDB(Command):
    """print hexbundle's dependency DB"""

    name = "dumpdb"
    doc_purpose = "print the dependency DB (hexbundle's JSON DB)"
    doc_usage = ""
    doc_description = None
    cmd_options = (opt_db,)

    def execute(self, opt_values, pos_args):
        try:
            path = Path(opt_values.get("db_file") or default_db())
            return dump(path)
        except HexbundleError as exc:
            print(f"hexbundle: {exc}", file=sys.stderr)
            return 3


def default_db() -> Path:
    from hexbundle.config.layout import ProjectLayout
    layout = ProjectLayout(Path.cwd())
    layout.check_build_root()
    return layout.doit_db()


def dump(path: Path, out=None) -> int:
    out = out or sys.stdout
    if not (path.exists() or path.is_symlink()):
        print(f"hexbundle: no dependency DB at {path} yet (nothing was built there)",
              file=sys.stderr)
        return 0
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise HexbundleError(f"{path}: cannot read the dependency DB ({exc}); the next "
                             "`doit bundle` sets it aside and runs every task again") from None
    if not isinstance(data, dict):
        raise HexbundleError(f"{path}: not a dependency DB (a JSON {type(data).__name__}, not "
                             "an object); the next `doit bundle` sets it aside")
    print(f"dependency DB {path}: {len(data)} task(s)", file=out)
    for task in sorted(data):
        print(f"{task} -> {pprint.pformat(data[task], indent=4, width=100)}", file=out)
    return 0
