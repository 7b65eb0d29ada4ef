"""hexbundle's dependency DB: doit's JSON backend, written atomically and after every task.

A doit DB backend plugin (pyproject.toml, [tool.doit.plugins.backend]: `hexbundle`), chosen by
DOIT_CONFIG's `backend` (graph.session.doit_config): doit makes its Dependency manager with this
class, on the variant's `dep_file`. What it adds to doit's JsonDB (doit 0.37 opens the file with
'w' and writes it in place, once, when the run ends):

- every save is temp + fsync + rename (support.atomic): a kill never leaves half a DB; a save
  of the bytes the file already holds (a no-op run, the final save after the last task's) writes
  nothing;
- the DB is never read through a symbolic link (O_NOFOLLOW, support.files.read_state): a run has
  set such a link aside before doit opens the DB (graph.recovery); a read-only command (`doit
  list`, `doit info`, a dry run) takes it as empty, saying so;
- a save after each task that succeeds (save_progress, from graph.reporter), so a killed run
  keeps the work it finished;
- a variant's DB writes the model's steps' records back to the model's DB when they changed
  (graph.variants; dbstate.seed_variant_db pairs the two before doit opens the variant's);
- a full disk (or quota, or file-size limit) is one message, not a traceback: the run goes on
  after a failed save_progress, and the final save (doit's Dependency.close, which calls dump)
  ends the run with exit code 3.

Imported by doit for every command that reads the DB (`doit list` too, when it gathers its
backends): only light modules here.
"""
from __future__ import annotations

import copy
import errno
import os
import shutil
import sys
from pathlib import Path
from typing import Optional

from doit.dependency import DatabaseException, JsonDB

from hexbundle.graph.variants import split_records
from hexbundle.support.atomic import atomic_output
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import LinkedStateError, link_target, read_state
from hexbundle.support.jsondoc import parse_json

# The name DOIT_CONFIG's `backend` selects it by, as pyproject.toml registers it.
BACKEND = "hexbundle"


class DbSaveError(HexbundleError):
    """The dependency DB could not be saved (full disk, quota, file-size limit)."""


# the variant's DB -> (the model's DB, the model's records as last saved there); set by
# dbstate.seed_variant_db, so a save writes the model's DB only when they change
_model_dbs: dict = {}
# the DB this run's doit opened (the last made): what save_progress saves
_current: Optional["DurableJsonDB"] = None
# a read-only command (graph.loader): it opened the DB to read it; nothing is ever saved
_saves_held = False


def hold_saves() -> None:
    """This process only reads the DB (`doit list`, `doit check_bundle`, a dry run...): no save,
    so a read-only command beside a running build never writes over the build's DB."""
    global _saves_held
    _saves_held = True


def pair_with_model(variant_db: Path, model_db: Path, model_records: dict) -> None:
    """The variant's DB keeps the model's steps' records in `model_db` (graph.variants);
    `model_records`: theirs as that file holds them now."""
    _model_dbs[os.path.abspath(variant_db)] = (Path(model_db), copy.deepcopy(model_records))


class DurableJsonDB(JsonDB):
    """doit's JsonDB (same file format, same reads), saved atomically: see the module."""

    desc = "hexbundle's JSON DB: atomic saves, one after every task (hexbundle.graph.db)"

    def __init__(self, name, codec, *, module_name=None):
        global _current
        super().__init__(name, codec, module_name=module_name)
        _current = self

    def _load(self) -> dict:
        """doit's read of the DB file, never through a symbolic link."""
        try:
            data = read_state(self.name)
        except LinkedStateError:
            print(f"hexbundle: {self.name}: a symbolic link (to {link_target(self.name)}), not "
                  "hexbundle's DB: not read (every task counts as not run); a build sets it "
                  "aside", file=sys.stderr, flush=True)
            return {}
        try:   # doit's codec is json's decoder: decoded within bounds instead
            records = parse_json(data, os.path.abspath(self.name))
        except ValueError as error:   # as doit's JsonDB says it
            raise DatabaseException(f"{error.args[0]}\nInvalid JSON data in "
                                    f"{os.path.abspath(self.name)}\nTo fix this problem, you can "
                                    "just remove the corrupted file, a new one will be "
                                    "generated.\n") from None
        return records

    def save(self) -> None:
        """Write the DB (temp + fsync + rename); DbSaveError on a full disk. A variant's DB
        saves the model's steps' records to the model's DB first, when they changed."""
        if _saves_held:
            return
        key = os.path.abspath(self.name)
        if key in _model_dbs:
            model_db, saved = _model_dbs[key]
            model, _ = split_records(self._db)
            if model != saved:
                save_file(model_db, lambda: self.codec.encode(model))
                _model_dbs[key] = (model_db, copy.deepcopy(model))
        save_file(Path(self.name), lambda: self.codec.encode(self._db))

    def dump(self) -> None:
        """doit's last save (Dependency.close, when the run or command ends): a failure ends the
        run with the message and exit code 3, not a traceback from doit."""
        try:
            self.save()
        except DbSaveError as exc:
            report_db_failure(exc)
            sys.stdout.flush()
            raise SystemExit(3) from None


def _holds(path: Path, text: str) -> bool:
    """True if the file holds exactly `text` already (a no-op run; the final save after the
    last task's): nothing to write, no fsync. Reading it back costs far less than a rewrite."""
    try:
        return read_state(path) == text.encode()
    except OSError:   # none, a link, unreadable: written as ever
        return False


def save_progress() -> None:
    """Persist the run's DB now (after each successful task): a killed run keeps its finished
    work. A failure is reported (once); the run goes on (steps fail cleanly on their own writes)
    and the final save, failing too, ends it with exit code 3."""
    if _current is None:
        return
    try:
        _current.save()
    except DbSaveError as exc:
        report_db_failure(exc)


def save_file(path: Path, encode) -> None:
    """Write encode()'s text to `path` atomically, unless the file holds exactly that text
    already; a full disk (in the encoding or the write) is a DbSaveError."""
    try:
        text = encode()
        if _holds(path, text):
            return
        with atomic_output(path, "w", user_errors=False) as fh:
            fh.write(text)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        raise DbSaveError(_db_save_message(path, exc)) from None


def _db_save_message(path: Path, exc: OSError) -> str:
    try:
        free = f"{shutil.disk_usage(path.parent).free / 1024:.0f} KiB free"
    except OSError:
        free = "free space unknown"
    return (f"cannot save the dependency DB {path} ({exc.strerror or exc}; {free} on its file "
            "system): free some disk space (or raise the quota / ulimit -f) and run the build "
            "again; the steps that finished before the last save are kept, the others run again")


_reported_db_failure = False


def report_db_failure(exc: DbSaveError) -> None:
    global _reported_db_failure
    if not _reported_db_failure:
        _reported_db_failure = True
        print(f"hexbundle: {exc}", file=sys.stderr, flush=True)
