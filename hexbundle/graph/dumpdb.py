"""`doit dumpdb` for hexbundle's dependency DB.

doit's own dumpdb reads a dbm file (default `.doit.db`), and does not load dodo.py, so it never
learns where hexbundle keeps its DBs nor that they are JSON: it always ended in a traceback.
This command replaces it (pyproject.toml, [tool.doit.plugins.command]): it prints every JSON DB
of the build root (<project>/build, or $HEXBUNDLE_BUILD_ROOT) -- each model's (its inputs
steps) and each variant's (model, device, plan, backend; graph.variants) --, one task per entry,
or says why not. Read-only: no lock, nothing written.
"""
from __future__ import annotations

import pprint
import sys
from pathlib import Path

from doit.cmd_base import Command

from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import LinkedStateError, link_target
from hexbundle.support.jsondoc import read_state_json

opt_db = {
    "section": "DB",
    "name": "db_file",
    "short": "",
    "long": "db-file",
    "type": str,
    "default": "",
    "help": "the DB to print [default: every DB under <build root>/.hexbundle/db/]",
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
            if opt_values.get("db_file"):
                return dump(Path(opt_values["db_file"]))
            return dump_all(build_root_dbs())
        except HexbundleError as exc:
            print(f"hexbundle: {exc}", file=sys.stderr)
            return 3


def build_root_dbs() -> tuple:
    """(where the DBs are kept, every DB there)."""
    from hexbundle.config.layout import ProjectLayout
    layout = ProjectLayout(Path.cwd())
    layout.check_build_root()
    return layout.db_dir, layout.doit_dbs()


def dump_all(found: tuple, out=None) -> int:
    """Print each DB; one that cannot be read is named (exit 3), the others still printed."""
    where, dbs = found
    if not dbs:
        print(f"hexbundle: no dependency DB under {where} yet (nothing was built there)",
              file=sys.stderr)
        return 0
    failed = 0
    for path in dbs:
        try:
            dump(path, out)
        except HexbundleError as exc:
            print(f"hexbundle: {exc}", file=sys.stderr)
            failed = 3
    return failed


def dump(path: Path, out=None) -> int:
    out = out or sys.stdout
    if not (path.exists() or path.is_symlink()):
        print(f"hexbundle: no dependency DB at {path} yet (nothing was built there)",
              file=sys.stderr)
        return 0
    try:
        data = read_state_json(path)   # never through a symbolic link
    except LinkedStateError:
        raise HexbundleError(f"{path}: a symbolic link (to {link_target(path)}), not "
                             "hexbundle's DB: not read; the next build that uses it sets it "
                             "aside and runs its tasks again") from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise HexbundleError(f"{path}: cannot read the dependency DB ({exc}); the next "
                             "build that uses it sets it aside and runs its tasks again") from None
    if not isinstance(data, dict):
        raise HexbundleError(f"{path}: not a dependency DB (a JSON {type(data).__name__}, not "
                             "an object); the next build that uses it sets it aside")
    print(f"dependency DB {path}: {len(data)} task(s)", file=out)
    for task in sorted(data):
        print(f"{task} -> {pprint.pformat(data[task], indent=4, width=100)}", file=out)
    return 0
