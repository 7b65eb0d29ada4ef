"""A private PostgreSQL cluster for BuildGrid's SQL scheduler (remote execution in the tests and
the benchmark): initdb in a fresh directory, started on a free localhost port, stopped and
deleted afterwards.

Why PostgreSQL: BuildGrid 0.4.4's `!sql-scheduler` (which `!execution` and `!bots` need) refuses
SQLite. Its URL is `postgresql+psycopg2://`: with psycopg 3 BuildGrid's LISTEN/NOTIFY notifier
fails and workers never get leases (.ci/run puts psycopg2-binary into BuildGrid's venv).

PostgreSQL refuses to run as root: as root the cluster is made and run as the `postgres` user
(runuser), in a directory under /tmp that user can enter (pytest's tmp_path is mode 0700).
The binaries: $HEXBUNDLE_PG_BIN, else Debian's /usr/lib/postgresql/<newest>/bin.

    with Postgres.start() as pg:
        pg.url   -> "postgresql+psycopg2://bgd@127.0.0.1:PORT/bgd"
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from hexbundle.remote.buildgrid import BuildGridError, free_port

PG_BIN_ENV = "HEXBUNDLE_PG_BIN"
DEBIAN_PG = Path("/usr/lib/postgresql")
RUN_AS = "postgres"      # as root: PostgreSQL will not run as root
DATABASE = "bgd"


def find_pg_bin() -> Optional[Path]:
    given = os.environ.get(PG_BIN_ENV)
    if given:
        return Path(given) if (Path(given) / "initdb").is_file() else None
    versions = sorted((p for p in DEBIAN_PG.glob("*/bin") if (p / "initdb").is_file()),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return versions[-1] if versions else None


class Postgres:
    def __init__(self, workdir: Path, port: int, bindir: Path, user: Optional[str]):
        self.workdir = workdir
        self.port = port
        self.bindir = bindir
        self.user = user

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{DATABASE}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def data(self) -> Path:
        return self.workdir / "data"

    @property
    def log(self) -> Path:
        return self.workdir / "postgres.log"

    def _run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=self.workdir)
        if done.returncode != 0:
            raise BuildGridError(f"PostgreSQL: {' '.join(args[:1])} exited {done.returncode}:\n"
                                 f"{done.stdout[-2000:]}")

    @classmethod
    def start(cls) -> "Postgres":
        bindir = find_pg_bin()
        if bindir is None:
            raise BuildGridError(f"no PostgreSQL: install postgresql (Debian) or set {PG_BIN_ENV} "
                                 "to the directory of its initdb and pg_ctl")
        user = RUN_AS if os.geteuid() == 0 else None
        workdir = Path(tempfile.mkdtemp(prefix="hexbundle-pg-"))
        if user:
            entry = pwd.getpwnam(user)
            os.chown(workdir, entry.pw_uid, entry.pw_gid)
        pg = cls(workdir, free_port(), bindir, user)
        try:
            pg._run("initdb", "-D", str(pg.data), "-U", DATABASE, "--auth=trust",
                    "--no-sync", "-E", "UTF8")
            # fsync off: a test cluster, thrown away; sockets in its own directory
            pg._run("pg_ctl", "-D", str(pg.data), "-l", str(pg.log), "-w", "-t", "60", "-o",
                    f"-p {pg.port} -h 127.0.0.1 -k {workdir} -F", "start")
            pg._run("createdb", "-h", "127.0.0.1", "-p", str(pg.port), "-U", DATABASE, DATABASE)
        except BaseException:
            pg.stop()
            raise
        return pg

    def query(self, sql: str) -> list:
        """Rows of a query (psql, tab-separated): the tests read BuildGrid's scheduler state."""
        cmd = [str(self.bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
               DATABASE, "-d", DATABASE, "-At", "-F", "\t", "-c", sql]
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildGridError(f"psql: {done.stderr.strip()}")
        return [line.split("\t") for line in done.stdout.splitlines()]

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except BuildGridError:
                pass
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "Postgres":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
