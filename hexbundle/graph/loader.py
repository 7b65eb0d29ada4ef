"""doit's task loader for hexbundle: doit's own dodo.py loader, named in pyproject.toml
([tool.doit] loader, [tool.doit.plugins.loader]) because doit makes its loader before it reads
the command line's `name=value` settings, and that is where an empty argument has to be caught.

Why: doit 0.36-0.37 reads `arg[0]` of every command-line argument (DoitMain.process_args, and
again when it loads the tasks), so an empty one (`doit import_export --name ""`) raised
IndexError: a traceback before any task code ran. The loader refuses it by name first (exit 3).
It is also where the run guard starts (graph.runguard: lock, recovery, DB state): after dodo.py
is read, before doit opens the dependency DB, for every command that has not said it only reads
(graph.commands.ReadOnly sets `read_only`; a read-only run's DB is never saved, graph.db).
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

from doit.cmd_base import DodoTaskLoader
from doit.loader import _get_task_creators
from doit.task import Task

from hexbundle.graph import interrupts
from hexbundle.support import stdio, testhooks


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
        interrupts.guard_start_up()   # the first hexbundle code doit runs
        stdio.guard()   # before anything is written (support.stdio)
        super().__init__()
        refuse_empty_arguments(sys.argv[1:])

    # Start-up (reading dodo.py, its imports, the configs) may take seconds: Ctrl-C there stops
    # the run with a line, not a KeyboardInterrupt traceback (nothing has been built yet).
    def setup(self, opt_values):
        with interrupted_at_start_up():
            return super().setup(opt_values)

    read_only = False   # set by a command that writes nothing (graph.commands.ReadOnly)
    names_only = False   # `doit list` of names and first lines (graph.commands.List)

    def load_doit_config(self):
        with interrupted_at_start_up():
            if not (self.read_only or self.names_only):
                replay_noop(self.namespace)   # before doit's settings resolve the build
            config = super().load_doit_config()
            from hexbundle.graph.session import DoitConfig
            if self.names_only and isinstance(config, DoitConfig):
                return config.names_only()   # nothing resolved (graph.session.Build)
            self.start_guard()
            return config

    def start_guard(self) -> None:
        """Called by doit right before it opens the DB: guard the run (once), or, for a command
        that only reads, keep the DB from being saved."""
        from hexbundle.graph import db, session
        build = session.build_of(self.namespace)
        if self.read_only:
            db.hold_saves()
        elif build is not None and not getattr(self, "_guarded", False):
            self._guarded = True
            session.start_guard(build.layout)

    def load_tasks(self, cmd, pos_args):
        from hexbundle.graph import interrupts
        interrupts.remember_command(pos_args)   # what an interrupted run says comes next
        with interrupted_at_start_up():
            testhooks.set_step(testhooks.START_UP)   # tests interrupt the start-up here
            testhooks.pause_point()
            testhooks.set_step(None)
            if self.names_only:
                tasks = task_stubs(self.namespace, self.cmd_names)
            else:
                with paths_settled(self.namespace):
                    tasks = super().load_tasks(cmd, pos_args)
            interrupts.start_up_over()
            return tasks


def replay_noop(namespace) -> None:
    """This command ran before and found everything up to date, and nothing it read has
    changed since (graph.noopstamp): say so again and exit 0, resolving nothing."""
    from hexbundle.config.layout import ProjectLayout
    from hexbundle.graph import noopstamp, session
    build = session.build_of(namespace)
    if build is None:
        return
    if noopstamp.replay(ProjectLayout(build.root).state_dir, sys.argv):
        sys.stdout.flush()
        raise SystemExit(0)


@contextmanager
def paths_settled(namespace):
    """The task creators run with the resolved build's directories settled (config.layout
    ProjectLayout.paths_settled): nothing is written meanwhile. Only a build already resolved
    (a run: doit read DOIT_CONFIG first): this never resolves one."""
    from hexbundle.graph import session
    build = session.build_of(namespace)
    if build is None or build.resolved_layout is None:
        yield
        return
    with build.resolved_layout.paths_settled():
        yield


def task_stubs(namespace: dict, command_names) -> list:
    """One task per task creator, named and documented as doit names and documents it (the
    creator's docstring), without calling it: all `doit list` shows."""
    return [Task(name, None, doc=creator.__doc__)
            for name, creator, _ in _get_task_creators(namespace, command_names)]


@contextmanager
def interrupted_at_start_up():
    try:
        yield
    except KeyboardInterrupt:
        interrupts.ignore_further_interrupts()   # a second Ctrl-C while exiting: no traceback
        sys.stderr.write(interrupts.START_UP_LINE + "\n")
        raise SystemExit(130) from None
