"""A REAPI worker (for the remote-execution tests and `doit bench`): takes leases from a BuildGrid over the Remote
Workers API (Bots service) and runs each Action as a plain subprocess in a fresh directory.

Run with the python of BuildGrid's venv (it uses BuildGrid's generated protos and CAS client;
hexbundle never imports a server):

    $BGD_VENV/bin/python scripts/reapi_worker.py --server grpc://127.0.0.1:PORT --bot-id w1 \
        --workdir DIR --log DIR/w1.jsonl [--property container-image=docker://...] [--corrupt .bin]

Why not buildbox-worker + buildbox-run: neither buildbox-worker nor a `bgd bot` is on PyPI or in
Debian; this worker speaks the same Bots API (CreateBotSession, then UpdateBotSession: BuildGrid
0.4.4 hands a lease over already ACTIVE; the lease's payload is the Action; the result goes back
in the lease as an ActionResult) and runs the Command directly in its own directory, without a
sandbox. For each lease:
  1. the input root is fetched from CAS into DIR/<lease>/ (nothing else is there: an
     incomplete input root fails the Command);
  2. the Command runs there with exactly its environment (plus PATH) and its arguments;
  3. its output files are uploaded, then the ActionResult (exit code, output digests,
     stdout and stderr as CAS blobs) is returned in the lease.
While an action runs, the worker keeps its session alive (UpdateBotSession every POLL_S) and
kills the Command when the server cancels its lease.

Its log (one JSON object a line: start/done/cancelled events with the action digest and the
monotonic time) is what the tests read to see which worker ran what, and when.

--corrupt SUFFIX: the first byte of every output whose path ends with SUFFIX is flipped after the
Command ran (a worker returning wrong outputs under their own digest: the client must catch it
as it catches a bad cache hit).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
from buildgrid._protos.google.devtools.remoteworkers.v1test2 import bots_pb2, bots_pb2_grpc, worker_pb2
from buildgrid._protos.google.rpc import code_pb2
from buildgrid.server.client.cas import download, upload

POLL_S = 0.2


class Worker:
    def __init__(self, args):
        self.args = args
        target = args.server.partition("://")[2]
        self.channel = grpc.insecure_channel(target)
        self.bots = bots_pb2_grpc.BotsStub(self.channel)
        self.instance = args.instance
        self.log_lock = threading.Lock()
        self.running: dict = {}     # lease id -> (thread, holder dict)
        self.stop = False

    def log(self, event: str, **fields) -> None:
        with self.log_lock, open(self.args.log, "a") as fh:
            fh.write(json.dumps({"event": event, "bot": self.args.bot_id, "pid": os.getpid(),
                                 "t": time.time(), **fields}) + "\n")

    def session_proto(self):
        props = [("OSFamily", "linux"), ("ISA", "x86-64")] + [
            tuple(p.split("=", 1)) for p in self.args.property]
        device = worker_pb2.Device(handle=self.args.bot_id, properties=[
            worker_pb2.Device.Property(key=k, value=v) for k, v in props])
        return bots_pb2.BotSession(bot_id=self.args.bot_id, status=bots_pb2.BotStatus.OK,
                                   worker=worker_pb2.Worker(devices=[device]))

    def run(self) -> None:
        session = self.bots.CreateBotSession(bots_pb2.CreateBotSessionRequest(
            parent=self.instance, bot_session=self.session_proto()))
        self.log("session", name=session.name)
        while not self.stop:
            session = self.step(session)
            time.sleep(POLL_S)

    def step(self, session):
        """Report finished leases, pick up new ones, kill cancelled ones."""
        reported = []
        for lease in session.leases:
            entry = self.running.get(lease.id)
            if lease.state == bots_pb2.LeaseState.CANCELLED:
                if entry:
                    entry[1]["cancelled"] = True
                    proc = entry[1].get("proc")
                    if proc and proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                    reported.append(lease.id)
            elif entry is None and lease.state in (bots_pb2.LeaseState.PENDING,
                                                   bots_pb2.LeaseState.ACTIVE):
                lease.state = bots_pb2.LeaseState.ACTIVE
                holder: dict = {}
                thread = threading.Thread(target=self.execute, args=(lease, holder), daemon=True)
                self.running[lease.id] = (thread, holder)
                thread.start()
            elif entry is not None and "result" in entry[1]:
                lease.state = bots_pb2.LeaseState.COMPLETED
                lease.status.code = entry[1].get("status", code_pb2.OK)
                lease.status.message = entry[1].get("message", "")
                lease.result.Pack(entry[1]["result"])
                reported.append(lease.id)
        session = self.bots.UpdateBotSession(bots_pb2.UpdateBotSessionRequest(
            name=session.name, bot_session=session))
        for lid in reported:
            self.running.pop(lid, None)
        return session

    def execute(self, lease, holder: dict) -> None:
        """Run the lease's action; a failure of the worker itself (a blob the server lost...)
        goes back as the lease's status, so the client hears of it rather than waiting."""
        try:
            self.run_action(lease, holder)
        except Exception as exc:   # noqa: BLE001 -- reported to the server, logged
            missing = type(exc).__name__ == "NotFoundError"
            holder["status"] = code_pb2.FAILED_PRECONDITION if missing else code_pb2.INTERNAL
            holder["message"] = f"reapi_worker {self.args.bot_id}: {type(exc).__name__}: {exc}"
            self.log("error", lease=lease.id, error=holder["message"])
            holder["result"] = re_pb2.ActionResult()

    def run_action(self, lease, holder: dict) -> None:
        action = re_pb2.Action()
        lease.payload.Unpack(action)
        key = f"{action.input_root_digest.hash}"
        with download(self.channel, instance=self.instance) as dl:
            command = dl.get_message(action.command_digest, re_pb2.Command())
        act_text = lease.id
        root = os.path.join(self.args.workdir, lease.id.replace("/", "_"))
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        self.log("start", lease=act_text, arguments=list(command.arguments)[:2])
        if action.input_root_digest.size_bytes:   # the empty Directory is no blob to fetch
            with download(self.channel, instance=self.instance) as dl:
                dl.download_directory(action.input_root_digest, root)
        for path in command.output_paths:
            os.makedirs(os.path.dirname(os.path.join(root, path)) or root, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        env.update({v.name: v.value for v in command.environment_variables})
        stdout_path, stderr_path = root + ".stdout", root + ".stderr"
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            try:
                proc = subprocess.Popen(list(command.arguments), cwd=root, env=env,
                                        stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
                holder["proc"] = proc
                code = proc.wait()
            except OSError as exc:
                err.write(f"reapi_worker: cannot run {command.arguments[0]!r}: {exc}\n".encode())
                code = 127
        if holder.get("cancelled"):
            self.log("cancelled", lease=act_text)
            return
        result = re_pb2.ActionResult(exit_code=code)
        result.execution_metadata.worker = self.args.bot_id
        with upload(self.channel, instance=self.instance) as up:
            for path in sorted(command.output_paths):
                local = os.path.join(root, path)
                if not os.path.isfile(local):
                    continue
                if self.args.corrupt and path.endswith(self.args.corrupt):
                    with open(local, "r+b") as fh:
                        first = fh.read(1)
                        fh.seek(0)
                        fh.write(bytes([first[0] ^ 0xFF]) if first else b"\0")
                digest = up.upload_file(local, queue=False)
                result.output_files.add(path=path, digest=digest,
                                        is_executable=os.access(local, os.X_OK))
            result.stdout_digest.CopyFrom(up.upload_file(stdout_path, queue=False))
            result.stderr_digest.CopyFrom(up.upload_file(stderr_path, queue=False))
        self.log("done", lease=act_text, exit_code=code, input_root=key)
        shutil.rmtree(root, ignore_errors=True)
        holder["result"] = result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--instance", default="")
    parser.add_argument("--bot-id", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--property", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--corrupt", default="", metavar="SUFFIX",
                        help="flip the first byte of the outputs whose path ends so")
    args = parser.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    worker = Worker(args)

    def stop(signum, frame):
        worker.stop = True
    signal.signal(signal.SIGTERM, stop)
    try:
        worker.run()
    except grpc.RpcError as exc:
        print(f"reapi_worker {args.bot_id}: {exc.code()}: {exc.details()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
