"""doit's `run` and `help` commands, as hexbundle's command line needs them.

Registered as doit command plugins in pyproject.toml ([tool.doit.plugins.command]; doit reads it
from the directory it is started in: the project's). What they add to doit's own:

- `doit bundle --help` (or -h): the task's help, as `doit help bundle` gives it (doit takes
  `--help` after a task name for an option of the task, and fails);
- `doit help TASK`: the task's whole description (doit keeps the first line of a docstring
  only) and the command-line settings `key=value` it reads, with the values configs/build.toml
  gives them (config.build.command_line_settings: load_build's own keys, not a copy);
- `doit bundle --dry-run`: which steps would run and why, in order; nothing is executed or
  written (no lock, no DB save: ReadOnly);
- `doit bundle --explain`: the build, with one line per step saying why it ran (the setting,
  input or code file that changed), that it was up to date or fetched from the cache
  (graph.explain; --dry-run gives the same reasons without running);
- `doit verify --json`: the last verify report (report.json) as JSON on stdout, nothing run;
- read-only commands (`doit list`, `help`, `info`, `tabcompletion`, a dry run, `doit TASK
  --help`, `doit check_bundle`, `doit verify --json`) say so (ReadOnly): no lock, no
  recovery, no DB save (graph.loader), so they answer while a build runs;
- a task, target or command name that is none of them: one line with the nearest name
  (did you mean), exit 3, instead of doit's three lines;
- verbosity and reporter reach hexbundle's own lines (support.console, graph.reporter): at
  `-v 0`/`-v 1` (doit: task output captured) the banner, progress lines and tables are not
  printed; under `-r json` they go to stderr, so stdout is exactly doit's JSON.
"""
from __future__ import annotations

import getopt
import inspect
import json
import sys

from doit import cmd_help, cmd_info, cmd_list, cmd_run
from doit.cmd_completion import TabCompletion as DoitTabCompletion
from doit.cmdparse import CmdParseError
from doit.control import TaskControl
from doit.exceptions import InvalidCommand
from doit.reporter import JsonReporter

from hexbundle.graph.session import build_of, checker_and_db, with_option_values
from hexbundle.support import console
from hexbundle.support.jsondoc import read_state_json

HELP_FLAGS = ("--help", "-h")
DRY_RUN_FLAG = "--dry-run"
EXPLAIN_FLAG = "--explain"
JSON_FLAG = "--json"
# Tasks that read and write nothing of the build (their own output aside): a run of them alone
# takes no lock and saves no DB. The flag, if any, that makes a task read-only.
READ_ONLY_TASKS = {"check_bundle": None, "verify": JSON_FLAG}
TASKS_ONLY_BUILD = "settings"   # a task's meta {"settings": False}: it reads no build setting

opt_dry_run = {
    "name": "dry_run",
    "short": "",
    "long": "dry-run",
    "type": bool,
    "default": False,
    "help": "say which tasks would run and why, in order; run nothing, write nothing",
}


opt_explain = {
    "name": "explain",
    "short": "",
    "long": "explain",
    "type": bool,
    "default": False,
    "help": "one line per step: why it runs (the setting, input or code file that changed), "
            "or that it is up to date or fetched from the cache",
}


def _is_stdout(stream) -> bool:
    try:
        return stream.fileno() == 1
    except (OSError, ValueError, AttributeError):
        return False


class ReadOnly:
    """A doit command that writes nothing: no lock, no recovery, no DB save (graph.loader)."""

    def execute(self, params, args):
        self.loader.read_only = True
        return super().execute(params, args)


class List(ReadOnly, cmd_list.List):
    """`doit list` as it is most run (names and first lines only): the task creators are not
    called (graph.loader.Loader.names_only), so nothing they import or compute is paid for."""

    def execute(self, params, args):
        details = ("subtasks", "status", "private", "list_deps", "template")
        self.loader.names_only = not args and not any(params.get(k) for k in details)
        return super().execute(params, args)


class Info(ReadOnly, cmd_info.Info):
    pass


class TabCompletion(ReadOnly, DoitTabCompletion):
    pass


def read_only_selection(args: list) -> bool:
    """A run of one read-only task (READ_ONLY_TASKS), with its read-only flag if it has one:
    `doit check_bundle --path DIR`, `doit verify --json`. Read before dodo.py is loaded, so
    conservatively: any other name (an option's value aside) may be a task that writes."""
    if not args or args[0] not in READ_ONLY_TASKS:
        return False
    flag = READ_ONLY_TASKS[args[0]]
    if flag is not None and flag not in args:
        return False
    takes_value = False
    for arg in args[1:]:
        if takes_value:
            takes_value = False
        elif not arg.startswith("-"):
            return False   # another task (or target) named
        else:
            takes_value = "=" not in arg and arg != JSON_FLAG
    return True


class Run(cmd_run.Run):
    doc_purpose = cmd_run.Run.doc_purpose
    doc_usage = "[TASK/TARGET...] [key=value...] [--dry-run] [--explain] [--help]"
    doc_description = ("`doit help TASK` (or `doit TASK --help`) lists a task's command-line "
                       "settings key=value.")
    cmd_options = cmd_run.Run.cmd_options + (opt_dry_run, opt_explain)

    def execute(self, params, args):
        """doit's; a dry run, a task's --help or a read-only task alone writes nothing."""
        if params.get("dry_run") or read_only_selection(args):
            self.loader.read_only = True
        return super().execute(params, args)

    def __init__(self, cmds=None, **kwargs):
        self._command_names = sorted(cmds or ())
        super().__init__(cmds=cmds, **kwargs)

    def parse_execute(self, in_args):
        """doit's, plus: --help/-h and --dry-run anywhere (doit takes what follows a task name
        for the task's own options); an unknown option in one line, with the nearest."""
        in_args = with_option_values(in_args)   # an option's value is never a setting
        flags = HELP_FLAGS + (DRY_RUN_FLAG, EXPLAIN_FLAG, JSON_FLAG)
        wants_help = any(a in HELP_FLAGS for a in in_args)
        dry_run = DRY_RUN_FLAG in in_args
        try:
            params, args = self.cmdparser.parse([a for a in in_args if a not in flags])
        except CmdParseError as exc:   # an option of doit run's own
            raise CmdParseError(self._unknown_option(exc, of_task=False)) from None
        try:   # from here on, a parse error is of a task's options (doit's TaskParse)
            self.pdb = params.get("pdb", False)
            params.update(self.opt_vals)
            if wants_help:
                self.loader.read_only = True
                return self._help(params, args)
            if JSON_FLAG in in_args:
                return self._json_report(params, args)
            if dry_run:
                params["dry_run"] = True
            if EXPLAIN_FLAG in in_args:
                params["explain"] = True
            return self.execute(params, args)
        except CmdParseError as exc:
            raise CmdParseError(self._unknown_option(exc, of_task=True)) from None

    def _help(self, params, names) -> int:
        """`doit bundle --help`: what `doit help bundle` says (default tasks: without a name)."""
        self.loader.setup(params)
        defaults = self.loader.load_doit_config().get("default_tasks") or []
        tasks = {t.name: t for t in self.loader.load_tasks(cmd=self, pos_args=[])}
        for name in names or defaults:
            print_task_help(tasks, name, self.loader, self._command_names)
        return 0

    def _json_report(self, params, names) -> int:
        """`doit verify --json`: the last verify report of the variant, as JSON on stdout;
        nothing is run or written (verify writes it: docs/verify.md)."""
        if list(names) != ["verify"]:
            raise InvalidCommand(f"{JSON_FLAG} is an option of `doit verify` alone (it prints "
                                 "the last verify report); got: "
                                 f"{' '.join(names) or 'the default tasks'}")
        self.loader.read_only = True
        self.loader.setup(params)
        self.loader.load_doit_config()
        layout = build_of(self.loader.namespace).layout
        path = layout.verify_report
        try:
            report = read_state_json(path)   # never through a symbolic link
        except FileNotFoundError:
            raise InvalidCommand(f"{layout.rel(path)}: no verify report for this variant yet: "
                                 "run `python3 -m doit verify` first") from None
        except (OSError, ValueError) as exc:
            raise InvalidCommand(f"{layout.rel(path)}: not a readable verify report ({exc}): "
                                 "run `python3 -m doit verify` again") from None
        print(json.dumps(report, indent=1, sort_keys=True))
        return 0

    def _unknown_option(self, exc: CmdParseError, of_task: bool) -> str:
        """doit's message lists every option object (CmdOption(...)): name the one instead."""
        cause = exc.__context__
        opt = getattr(cause, "opt", "")
        if not isinstance(cause, getopt.GetoptError) or not opt:
            return str(exc)
        from hexbundle.config.build import did_you_mean
        typed = ("--" if len(opt) > 1 else "-") + opt
        known = [f"--{o.long}" for o in self.cmdparser.options if o.long] + \
            [f"-{o.short}" for o in self.cmdparser.options if o.short]
        task = " or of the tasks named" if of_task else ""
        return (f"option {typed} is not an option of doit run{task}"
                f"{did_you_mean(typed, known + list(HELP_FLAGS))}; `python3 -m doit help run` "
                "lists doit's, `python3 -m doit help TASK` a task's")

    def _execute(self, outfile, verbosity=None, always=False, continue_=False,
                 reporter="console", num_process=0, par_type="process", single=False,
                 auto_delayed_regex=False, force_verbosity=False, failure_verbosity=0,
                 pdb=False, dry_run=False, explain=False):
        if outfile is None or not isinstance(outfile, str) and _is_stdout(outfile):
            outfile = sys.stdout   # guarded (support.stdio); doit took it at import, unguarded
        chosen = self.reporters.get(reporter) if isinstance(reporter, str) else reporter
        console.configure(
            quiet=bool(force_verbosity and verbosity is not None and verbosity < 2),
            to_stderr=isinstance(chosen, type) and issubclass(chosen, JsonReporter))
        plain_stdout, explaining = sys.stdout, None
        if console.terminal():   # what tasks print goes above the status line
            sys.stdout = console.StatusAware(plain_stdout)
        try:
            if dry_run:
                return self._dry_run(always, auto_delayed_regex)
            if explain:   # graph.explain and what it reads: only when asked for
                from hexbundle.graph import explain as explaining
                build = build_of(getattr(self.loader, "namespace", None))
                layout = build.layout if build else None
                explaining.start(explaining.Explainer(
                    self.dep_manager, {t.name: t for t in self.task_list}, layout))
            return super()._execute(outfile, verbosity, always, continue_, reporter,
                                    num_process, par_type, single, auto_delayed_regex,
                                    force_verbosity, failure_verbosity, pdb)
        except InvalidCommand as exc:
            if exc.not_found is None:
                raise
            raise InvalidCommand(not_a_task(exc.not_found, self.task_list,
                                            self._command_names)) from None
        finally:
            if explaining is not None:
                explaining.start(None)
            sys.stdout = plain_stdout

    def _dry_run(self, always, auto_delayed_regex) -> int:
        """Each task the run would reach, in dependency order: would it run, and why."""
        build = build_of(getattr(self.loader, "namespace", None))
        if build is not None:   # the model's steps' records, as a real run would see them
            from hexbundle.graph import dbstate
            dbstate.seeded_view(self.dep_manager.backend, build.layout, checker_and_db()[1])
        control = TaskControl(self.task_list, auto_delayed_regex=auto_delayed_regex)
        control.process(self.sel_tasks)
        tasks, order, seen = control.tasks, [], set()

        def visit(name):
            if name in seen:
                return
            seen.add(name)
            for dep in tasks[name].task_dep + tasks[name].setup_tasks:
                visit(dep)
            order.append(name)

        for name in control.selected_tasks:
            visit(name)
        runs, lines = set(), []
        for name in order:
            task = tasks[name]
            if not task.actions:   # a group: its subtasks are listed
                if any(d in runs for d in task.task_dep):
                    runs.add(name)
                continue
            upstream = [d for d in task.task_dep if d in runs]
            if always:
                why = "-a: always"
            elif upstream:   # its inputs are rewritten first
                why = f"after {upstream[0]}" + (f" and {len(upstream) - 1} more"
                                                if len(upstream) > 1 else "")
            else:
                why = run_reason(self.dep_manager, task, tasks)
            if why is None:
                lines.append(f"--  {name}")
            else:
                runs.add(name)
                lines.append(f".   {name}  ({why})")
        steps = sum(1 for n in order if tasks[n].actions)
        print(f"dry run: {len(runs & {n for n in order if tasks[n].actions})} of {steps} "
              "task(s) would run ('.'); '--': up to date. Nothing was run or written.")
        print("\n".join(lines))
        return 0


def run_reason(dep_manager, task, tasks) -> str | None:
    """Why doit would run `task` now (graph.explain: the setting, input, code file or output
    that changed), or None."""
    from hexbundle.graph import explain as explaining
    return explaining.reason(dep_manager, task, tasks)


def _first(names) -> str:
    names = sorted(names)
    return names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "")


def not_a_task(name: str, task_list, command_names) -> str:
    """One line for a name that is no task, target or command: the nearest one, and where to
    look."""
    from hexbundle.config.build import did_you_mean
    known = [t.name for t in task_list] + list(command_names)
    return (f"{name!r} is not a task, target or command{did_you_mean(name, known)}; "
            "`python3 -m doit list` lists the tasks (--all: with their subtasks)")


def print_task_help(tasks: dict, name: str, loader, command_names=()) -> None:
    """A task's whole description, its options, and the command-line settings it reads."""
    task = tasks.get(name)
    if task is None:
        raise InvalidCommand(not_a_task(name, tasks.values(), command_names))
    print(f"{task.name}  {task.doc}")
    basename = task.name.split(":", 1)[0]
    creator = (getattr(loader, "namespace", None) or {}).get(f"task_{basename}")
    text = inspect.cleandoc(creator.__doc__ or "") if creator else ""
    first, _, rest = text.partition("\n")
    if ":" in task.name and first:
        print(f"  (a subtask of {basename}: {first})")
    elif rest.strip():
        print("\n" + "\n".join("  " + line if line else "" for line in rest.strip().splitlines()))
    params = list(task.creator_params) + list(task.params)
    if params:
        print("\noptions:")
        for opt in cmd_help.TaskParse([cmd_help.CmdOption(o) for o in params]).options:
            print("\n".join(opt.help_doc()))
    if (task.meta or {}).get(TASKS_ONLY_BUILD, True) is False:
        print("\ncommand-line settings: none (this task does not read configs/build.toml)")
        return
    from hexbundle.config.build import command_line_settings
    settings = command_line_settings(loader.namespace["ROOT"]) if "ROOT" in \
        (getattr(loader, "namespace", None) or {}) else []
    print(f"\ncommand-line settings (`python3 -m doit {task.name} key=value ...`; shown: the "
          "value configs/build.toml gives, or the default):")
    shown = [f"{key}={_shown(value)}" for key, value, _ in settings]
    width = max((len(s) for s in shown), default=0)
    for text, (_, _, doc) in zip(shown, settings):
        print(f"  {text:<{width}}  {doc}".rstrip())


def _shown(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return '""' if value == "" else str(value)


class Help(ReadOnly, cmd_help.Help):
    """doit's help; on a task: its whole description and its command-line settings."""

    def _execute(self, pos_args):
        tasks = {t.name: t for t in self.task_list}
        print_task_help(tasks, pos_args[0], self.loader, self.cmds)
        return True
