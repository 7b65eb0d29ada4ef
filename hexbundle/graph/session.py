"""A doit run's session: the resolved config, its guard (lock, recovery, DB state: started by
the command that writes, graph.loader) and doit's settings.

Kept out of dodo.py so that dodo.py reads as the task graph and nothing else.
"""
from __future__ import annotations

import functools
import getopt
import os
import sys
from pathlib import Path
from typing import Optional

import doit

from hexbundle.config.layout import BUILD_ROOT_ENV, DOIT_DB, Layout, ProjectLayout
from hexbundle.graph.db import BACKEND
from hexbundle.support.errors import HexbundleError

# The config's schemas, the checker and the reporter are imported by what resolves the build
# (load, doit_config): a plain `doit list` resolves nothing, so it imports none of them.

# Benchmark only: "md5" runs the same task graph with doit's stock MD5 checker and a DB of its
# own (scripts/bench.py compares the two). Builds never set it.
BENCH_CHECKER_ENV = "HEXBUNDLE_BENCH_CHECKER"


# doit commands that neither run tasks nor write the DB. Only for the refusal of a run started
# outside the project, before doit has read which command it is; the run guard itself is
# started by the command (graph.loader, graph.commands.ReadOnly), never from argv.
READ_ONLY_COMMANDS = {"list", "help", "info", "dumpdb", "tabcompletion", "--help", "--version"}
RUN_READ_ONLY_FLAGS = {"--dry-run", "--help", "-h"}   # graph.commands.Run
RUN_FLAGS = RUN_READ_ONLY_FLAGS | {"--explain", "--json"}   # every flag graph.commands.Run adds


def command_name(argv: list) -> str:
    """The argument doit takes its command from (doit 0.37, DoitMain.run): the first one after
    the dodo-finding options (-f FILE, -d DIR, -k, which may come first) and the `key=value`
    variables; "" if none. Not one of doit's commands means `run`."""
    try:
        _, args = getopt.getopt(argv[1:], "f:d:k", ["file=", "dir=", "seek-file"])
    except getopt.GetoptError:   # doit then looks at the arguments as given
        args = argv[1:]
    args = split_settings(args)[0]
    return args[0] if args else ""


def command_writes(argv: list) -> bool:
    """Anything but a read-only command means a run (or a command that writes the DB). A run
    with --dry-run or a task's --help (graph.commands) runs nothing and writes nothing."""
    if any(arg in RUN_READ_ONLY_FLAGS for arg in argv[1:]):
        return False
    return command_name(argv) not in READ_ONLY_COMMANDS


# The tasks' options that take no value (dodo.py's boolean params and their inverses): the
# argument after any other task option is that option's value. test_cli_conventions checks that
# every boolean param dodo.py declares is here (a new one must join).
TASK_FLAGS = frozenset({"--push", "--no-push", "--small", "--keep"})


@functools.lru_cache(maxsize=None)
def _doit_options() -> tuple:
    """(long options that take no value, short options that take one), of doit's own commands
    and of hexbundle's (RUN_FLAGS): read from doit's option tables, not copied."""
    from doit.cmd_base import DoitCmdBase, DodoTaskLoader
    from doit.doit_cmd import DoitMain
    options = [opt for cmd in DoitMain.DOIT_CMDS for opt in getattr(cmd, "cmd_options", ())]
    options += list(DoitCmdBase.base_options) + list(DodoTaskLoader.cmd_options)
    flags = set(RUN_FLAGS) | set(TASK_FLAGS) | {"--version"}
    value_shorts = set()
    for opt in options:
        if opt.get("type") is bool:
            flags.update(f"--{opt[key]}" for key in ("long", "inverse") if opt.get(key))
        elif opt.get("short"):
            value_shorts.add(f"-{opt['short']}")
    return frozenset(flags), frozenset(value_shorts)


def takes_value(arg: str) -> bool:
    """True if the argument after `arg` is `arg`'s value (getopt's reading: `--to X`, `-n 2`)."""
    flags, value_shorts = _doit_options()
    if arg.startswith("--"):
        return arg != "--" and "=" not in arg and arg not in flags
    return arg in value_shorts


def split_settings(args: list) -> tuple:
    """(the other arguments, {key: value}): doit's reading of `key=value` settings
    (DoitMain.process_args: not an option, holding a '='), except that an option's value is
    never a setting: `--run "what is x=1+1"` is a prompt. The one place the command line is split
    (graph.commands.Run gives its arguments back to the options through with_option_values;
    command_line_overrides reads the settings from it)."""
    rest, settings = [], {}
    value_next = False
    for arg in args:
        if value_next:
            rest.append(arg)
            value_next = False
        elif arg[:1] not in ("", "-") and "=" in arg:
            name, value = arg.split("=", 1)
            settings[name] = value
        else:
            rest.append(arg)
            value_next = takes_value(arg)
    return rest, settings


def with_option_values(doit_args: list, argv=None) -> list:
    """The arguments doit hands a command (after its loader options, the command name and
    what it took for settings: DoitMain.process_args, which takes an option's value holding a
    '=' for a setting too), with those values back where they were: split_settings' reading of
    the same command line. doit's own record of the settings (doit.get_var) is set to
    split_settings' as well."""
    from doit.doit_cmd import reset_vars, set_var
    argv = sys.argv[1:] if argv is None else argv
    ours, settings = split_settings(list(argv))
    reset_vars()
    for name, value in settings.items():
        set_var(name, value)
    # doit's list is ours without the values it took: match it from the end; what comes before
    # its first argument (loader options, the command's name) is not the command's
    start, at = len(ours), len(ours) - 1
    for arg in reversed(doit_args):
        while at >= 0 and ours[at] != arg:
            at -= 1
        if at < 0:
            return list(doit_args)      # not this command line's (a call from the API)
        start, at = at, at - 1
    return ours[start:] if doit_args else list(doit_args)


def command_line_overrides(argv=None) -> dict:
    """Every `key=value` given to doit (typos included: load_build rejects unknown keys), as
    split_settings reads them."""
    argv = sys.argv[1:] if argv is None else argv
    return split_settings(list(argv))[1]


def started_in_project(root: Path) -> bool:
    """True if doit was started in the project directory, so it read our pyproject.toml (doit
    reads its config, and so its plugins, only from the directory it is started in)."""
    started_in = doit.get_initial_workdir()
    return started_in is None or Path(started_in).resolve() == root.resolve()


def outside_project_problem(root: Path, argv: list, started_in: Path):
    """doit reads its plugins (pyproject.toml: graph.commands, and graph.db, the dependency DB
    backend) from the directory it is started in. Run from elsewhere (a subdirectory, with -k or
    DOIT_SEEK_FILE=1), a flag only our commands know would end in doit's 'option not
    recognized', and a command that writes the DB would have doit's own in-place JSON DB: say
    what to do instead. Read-only commands (list, info, help) still work from there."""
    if started_in.resolve() == root.resolve():
        return None
    flags = [a for a in argv[1:] if a in RUN_FLAGS]
    if flags:
        return (f"{flags[0]} is hexbundle's (pyproject.toml), which doit reads only when "
                f"started in the project directory: run it from {root}")
    if command_writes(argv):
        return ("doit was started outside the project directory, so it did not read "
                "pyproject.toml, which registers hexbundle's dependency DB (graph/db.py: saved "
                f"atomically, after every step, one per variant): run it from {root}")
    return None


def load(root: Path):
    """Resolve the build for this doit run, or exit with a clean message (no traceback)."""
    # dodo.py imported outside doit (a script, a REPL): where this process started
    started_in = Path(doit.get_initial_workdir() or os.getcwd())
    problem = outside_project_problem(root, sys.argv, started_in)
    if problem:
        print(f"hexbundle: {problem}", file=sys.stderr)
        sys.exit(3)
    overrides = command_line_overrides()
    try:
        ProjectLayout(root).check_build_root()   # not /, $HOME, the source tree: before any use
        from hexbundle.config.build import load_build
        cfg = load_build(root, overrides)
    except HexbundleError as exc:
        print(f"hexbundle: {exc}", file=sys.stderr)
        sys.exit(3)
    layout = Layout(cfg)
    from hexbundle.graph.reporter import set_banner
    set_banner(layout)
    return cfg, layout, overrides


class Build:
    """The build a doit run resolves (configs/build.toml and the command line's key=value), on
    first use: dodo.py declares its tasks with it, and a plain `doit list`, which calls no task
    creator (graph.loader), never resolves it."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._resolved = None
        self.doit_config = DoitConfig(self)   # dodo.py's DOIT_CONFIG

    def _get(self) -> tuple:
        if self._resolved is None:
            self._resolved = load(self.root)
        return self._resolved

    @property
    def cfg(self):
        return self._get()[0]

    @property
    def layout(self) -> Layout:
        return self._get()[1]

    @property
    def resolved_layout(self) -> Optional[Layout]:
        """The layout if the build is resolved already, else None (resolves nothing)."""
        return None if self._resolved is None else self._resolved[1]

    @property
    def overrides(self) -> dict:
        return self._get()[2]

    @property
    def parts(self) -> list:
        return self.cfg.plan.parts()

    def rel(self, path) -> str:
        return self.layout.rel(path)

    def task(self, step) -> dict:
        """A described step's doit task (graph.stepdesc)."""
        from hexbundle.graph.stepdesc import doit_task
        return doit_task(step, self.layout)


class DoitConfig(dict):
    """DOIT_CONFIG, filled from the resolved build (doit_config) when doit first reads it. doit
    asks for a dict and reads it through items() and get(); graph.loader gives a plain `doit
    list` `names_only()` instead, which resolves nothing."""

    def __init__(self, build: Build):
        super().__init__()
        self._build = build

    def _fill(self) -> None:
        if not dict.__len__(self):
            dict.update(self, doit_config(self._build.layout))

    def names_only(self) -> dict:
        """doit's settings for a list of the task creators' names: no variant, so no variant's
        DB (dep_file names one no run writes; the command saves nothing, graph.db)."""
        layout = ProjectLayout(self._build.root)
        return {"default_tasks": ["bundle"], "dep_file": str(layout.db_dir / DOIT_DB),
                "backend": BACKEND if started_in_project(layout.root) else "json"}

    def items(self):
        self._fill()
        return super().items()

    def keys(self):
        self._fill()
        return super().keys()

    def values(self):
        self._fill()
        return super().values()

    def get(self, key, default=None):
        self._fill()
        return super().get(key, default)

    def __getitem__(self, key):
        self._fill()
        return super().__getitem__(key)

    def __contains__(self, key):
        self._fill()
        return super().__contains__(key)

    def __iter__(self):
        self._fill()
        return super().__iter__()

    def __len__(self):
        self._fill()
        return super().__len__()


def build_of(namespace) -> Optional[Build]:
    """dodo.py's Build, from doit's view of the module (None for another dodo.py)."""
    build = (namespace or {}).get("BUILD")
    return build if isinstance(build, Build) else None


def start_guard(layout: Layout) -> None:
    """The lock, recovery and DB state (graph.runguard) for a command that writes, started by
    graph.loader before doit opens the DB; then the persistent digest and import caches. Never
    for a read-only command (graph.commands.ReadOnly): those leave no trace. A problem is one
    line and exit 3."""
    from hexbundle.graph import codekey, runguard   # only a command that writes needs them
    from hexbundle.support import hashing
    try:   # the build lock, clean-up after a killed run, a crash-safe dependency DB
        hashing.check_trace_file()
        runguard.guard_run(layout, checker_and_db()[1])
        from hexbundle.graph import noopstamp
        noopstamp.forget(layout.state_dir)   # this run may change what a stamp vouches for
        if os.environ.get(BENCH_CHECKER_ENV):   # doit's own checker, measured as it comes
            noopstamp.record_none()
    except HexbundleError as exc:
        print(f"hexbundle: {exc}", file=sys.stderr)
        sys.exit(3)
    except OSError as exc:   # a build root that cannot be written (read-only, /proc, ...)
        print(f"hexbundle: {build_root_problem(layout, exc)}", file=sys.stderr)
        sys.exit(3)
    hashing.use_cache(layout.digest_cache)   # else digests stay in memory
    codekey.use_cache(layout.code_imports_cache)   # else every run reads the sources
    # A remote cache names files by SHA-256: take it in the same read as the XXH3.
    hashing.cache().with_sha256 = bool(layout.cfg.remote.cache)


def build_root_problem(layout: Layout, exc: OSError) -> str:
    """The message of a build root hexbundle cannot set up its state in: the file, the
    operation, what to do."""
    where = exc.filename or layout.state_dir
    return (f"{where}: cannot create or write it ({exc.strerror or exc}) while setting up the "
            f"build root {layout.build_root} (its lock and state, {layout.state_dir}): make the "
            f"build root writable, or choose another with {BUILD_ROOT_ENV}=DIR")


def checker_and_db() -> tuple:
    """doit's file checker and the name of its DB files: hexbundle's, or (scripts/bench.py only)
    the stock checker to compare, with DBs of its own."""
    if os.environ.get(BENCH_CHECKER_ENV):
        from hexbundle.graph.checker import comparison_checker
        return comparison_checker(os.environ[BENCH_CHECKER_ENV])
    from hexbundle.graph.checker import XXH3Checker
    return XXH3Checker, DOIT_DB


def doit_config(layout: Layout) -> dict:
    """doit's settings; the dependency DB is the variant's own (graph.variants), kept by
    hexbundle's DB backend (graph.db)."""
    from hexbundle.graph.reporter import Reporter
    checker, db = checker_and_db()
    return {
        "default_tasks": ["bundle"],
        "check_file_uptodate": checker,
        "dep_file": str(layout.doit_db(db)),
        # graph.db's backend, registered in pyproject.toml; doit's own JSON backend (same file
        # format) only for the read-only commands allowed outside the project directory
        "backend": BACKEND if started_in_project(layout.root) else "json",
        "par_type": "thread",      # steps are subprocesses or containers: threads suffice
        "reporter": Reporter,
        "verbosity": 2,            # show the steps' progress lines as they happen
    }


