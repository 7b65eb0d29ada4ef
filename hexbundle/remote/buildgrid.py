"""A local BuildGrid server (REAPI cache: CAS, ByteStream, ActionCache) for the tests and the
benchmark: started on a free localhost port, in a directory of its own, stopped afterwards.

BuildGrid comes from PyPI (`buildgrid`, pinned in requirements/buildgrid.txt; Python >= 3.11) in a
virtualenv of its own: hexbundle never imports it (a client must not depend on a server). Its
`bgd` is found through $HEXBUNDLE_BGD, else on PATH. .ci/run installs it and sets HEXBUNDLE_BGD.

    with BuildGrid.start(tmp_dir) as server:
        server.url         -> "grpc://127.0.0.1:PORT"
        server.cas_dir     -> where its disk storage keeps the blobs (the tests corrupt one)
        server.stop()      -> stopped mid-run (the tests do that too)
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

from hexbundle.support.errors import HexbundleError

BGD_ENV = "HEXBUNDLE_BGD"
START_TIMEOUT_S = 120.0

CONFIG = """\
# Written by hexbundle.remote.buildgrid: a cache-only BuildGrid on localhost, no auth.
server:
  - !channel
    address: "127.0.0.1:{port}"
    insecure-mode: true
authorization:
  method: none
storages:
  - !disk-storage &cas-storage
    path: {cas_dir}
caches:
  - !lru-action-cache &action-cache
    storage: *cas-storage
    max-cached-refs: 100000
    allow-updates: {allow_updates}
    cache-failed-actions: false
{execution}instances:
  - name: "{instance}"
    services:
      - !action-cache
        cache: *action-cache
      - !cas
        storage: *cas-storage
      - !bytestream
        storage: *cas-storage
{execution_services}"""

# Remote execution (docs/remote-cache.md): the SQL scheduler (PostgreSQL: remote/postgres.py),
# the Execution and Operations services for clients and the Bots service workers take leases
# from. OSFamily and ISA are always match keys; every other property an Action carries must be
# registered, or Execute fails FAILED_PRECONDITION "Unregistered platform property".
EXECUTION = """\
connections:
  - !sql-connection &sql
    connection-string: {db_url}
    pool-size: 5
    pool-timeout: 30
    max-overflow: 10
schedulers:
  - !sql-scheduler &scheduler
    sql: *sql
    storage: *cas-storage
    action-cache: *action-cache
    bot-session-keepalive-timeout: {keepalive}
    poll-interval: 0.2
    bot-poll-interval: 0.2
    property-set: !dynamic-property-set
      match-property-keys: [container-image, executor, python, numpy, onnx]
"""
EXECUTION_SERVICES = """\
      - !execution
        scheduler: *scheduler
      - !bots
        scheduler: *scheduler
"""


class BuildGridError(HexbundleError):
    """The local BuildGrid server could not be found or started."""


def find_bgd() -> Optional[str]:
    """The `bgd` executable: $HEXBUNDLE_BGD, else on PATH; None when neither."""
    given = os.environ.get(BGD_ENV)
    if given:
        return given if os.access(given, os.X_OK) else None
    return shutil.which("bgd")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BuildGrid:
    def __init__(self, workdir: Path, port: int, instance: str, proc: subprocess.Popen):
        self.workdir = workdir
        self.port = port
        self.instance = instance
        self.proc = proc

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    @property
    def cas_dir(self) -> Path:
        return self.workdir / "cas"

    def blob_path(self, sha256: str) -> Path:
        """Where BuildGrid's disk storage keeps a blob (cas/objects/<2 hex>/<62 hex>)."""
        return self.cas_dir / "cas" / "objects" / sha256[:2] / sha256[2:]

    def blobs(self) -> list:
        return sorted(p for p in (self.cas_dir / "cas" / "objects").rglob("*") if p.is_file())

    @property
    def log(self) -> Path:
        return self.workdir / "bgd.log"

    @classmethod
    def start(cls, workdir: Path, instance: str = "", allow_updates: bool = True,
              port: int = 0, execution_db: str = "", bot_keepalive: int = 10) -> "BuildGrid":
        """execution_db: a PostgreSQL URL (remote/postgres.py) for a server that also executes
        (Execution, Operations and Bots services); bot_keepalive: seconds after a bot's last
        word that the scheduler takes it for dead and requeues its lease."""
        bgd = find_bgd()
        if not bgd:
            raise BuildGridError(f"no BuildGrid server: set {BGD_ENV} to its `bgd` (pip install "
                                 "-r requirements/buildgrid.txt in a Python >= 3.11 venv)")
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "cas").mkdir(exist_ok=True)
        port = port or free_port()
        config = workdir / "server.yml"
        text = CONFIG.format(port=port, cas_dir=workdir / "cas", instance=instance,
                             allow_updates="true" if allow_updates else "false",
                             execution_services=EXECUTION_SERVICES if execution_db else "",
                             execution=EXECUTION.format(db_url=execution_db,
                                                        keepalive=bot_keepalive)
                             if execution_db else "")
        config.write_text(text)
        if execution_db:    # the scheduler's tables: BuildGrid's own migrations (alembic)
            migrate = subprocess.run([bgd, "migrate", "apply", execution_db], cwd=workdir,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
            if migrate.returncode != 0:
                raise BuildGridError(f"bgd migrate apply exited {migrate.returncode}:\n"
                                     f"{migrate.stdout[-2000:]}")
        log = open(workdir / "bgd.log", "ab")
        proc = subprocess.Popen([bgd, "server", "start", str(config)], cwd=workdir,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        server = cls(workdir, port, instance, proc)
        server.wait_ready()
        return server

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until the server answers GetCapabilities (it takes a few seconds to start)."""
        from hexbundle.config.build import remote_settings
        from hexbundle.remote.cas import CasClient, RemoteError
        client = CasClient(remote_settings(cache=self.url, instance=self.instance, timeout=5),
                           self.workdir)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    raise BuildGridError(f"bgd exited {self.proc.returncode} while starting; its "
                                         f"log: {self.log}\n{self._log_tail()}")
                try:
                    client.capabilities()
                    return
                except RemoteError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise BuildGridError(f"bgd did not answer on {self.url} within "
                                             f"{timeout:.0f}s; its log: {self.log}\n"
                                             f"{self._log_tail()}") from None
                    time.sleep(0.2)
        finally:
            client.close()

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after 10 s."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> "BuildGrid":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
