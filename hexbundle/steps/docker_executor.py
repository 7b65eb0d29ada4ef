"""The docker executor: one build step = one container of the toolchain image.

The step runs `python3.10 <root>/scripts/step.py <spec>` with:
  - the source tree mounted read-only at the same absolute path as on the host (so the spec's
    paths, the digest cache's keys and every log line mean the same thing inside and outside),
  - the build root mounted read-write at its own path (outputs, logs, hexbundle's state),
  - no network, no capabilities, no-new-privileges, a read-only root filesystem, a /tmp that is
    a size-limited noexec tmpfs, and the pids, memory and CPU limits of [container] in
    configs/build.toml; an explicit environment (nothing of the host's leaks in),
  - never as root: as the host's uid:gid (outputs belong to the user), or, when hexbundle runs
    as root, as [container] user (default 65534:65534, nobody:nogroup, which owns nothing else).
    Then the directories steps write into (the model's tree under the build root, the state
    directory) are handed to that user before each step (hand_over): the steps' outputs belong
    to it; what the doit process writes itself (its DB, the lock, the logs) stays root's,
  - named after the run and the task (hexbundle-<run id>-<task>), labelled with the build root
    and the run, and recorded under <build root>/.hexbundle/containers/ before it is created,
  - its output streamed to the step's log; the exit code returned; the container removed after,
    whatever happened (Ctrl-C included), and then its record.

A run killed with kill -9 can remove nothing: its container runs on, writing into the build root,
then stays. So the next run, under the build lock and before anything else (the run guard calls
remove_leftovers), removes every container labelled with this build root that is not its own,
waiting until each is gone.

It never pulls: the image is looked up locally first (`containers.run` would silently pull).
"""
from __future__ import annotations

import codecs
import json
import os
import re
import secrets
import signal
import stat
import threading
import time
from pathlib import Path
from typing import Callable

from hexbundle.config.build import ContainerSettings
from hexbundle.config.layout import BUILD_ROOT_ENV, Layout, ProjectLayout
from hexbundle.config.toolchain import load_toolchain
from hexbundle.support import progress
from hexbundle.support.atomic import write_json
from hexbundle.support.errors import ContainerError, HexbundleError
from hexbundle.support.files import open_in_place, require_own_file
from hexbundle.support.run import LIFELINE_ENV, run_id
from hexbundle.support.testhooks import PAUSE_AT_ENV, PAUSE_DIR_ENV
from hexbundle.toolchain.docker import (IMAGE_PYTHON, LONG_TIMEOUT_S, docker_client,
                                       engine_call, pinned_image, require_sdk_image, translate)

PYTHON = IMAGE_PYTHON
# Passed through when set on the host: they change what a build writes, not where it runs; the
# test hook's (support.testhooks) only ever set by tests.
PASS_THROUGH = ("SOURCE_DATE_EPOCH", PAUSE_AT_ENV, PAUSE_DIR_ENV)
LABEL_ROOT = "org.hexbundle.root"               # the source tree
LABEL_BUILD_ROOT = "org.hexbundle.build-root"   # whose containers: the next run looks them up
LABEL_RUN = "org.hexbundle.run"                 # which run (support.run): its own are not leftovers
LABEL_STEP = "org.hexbundle.step"
LABEL_TASK = "org.hexbundle.task"
REMOVE_TIMEOUT_S = 60.0
POLL_S = 0.2
WATCH_EVERY_S = 2.0     # how often a running step's container is looked at (a bounded call)
DRAIN_S = 10.0          # after the container ended, how long its output stream may still take


# ---------------------------------------------------------------------------------------------
# how a step's container runs

def mounts(layout: ProjectLayout) -> dict:
    """Source tree read-only, build root read-write, each at its own absolute path; an export
    used in place from outside the project, read-only at its own path too; the test hook's
    directory (tests only) read-write."""
    root, build_root = layout.root, layout.build_root
    build_root.mkdir(parents=True, exist_ok=True)   # else docker would create it, root-owned
    out = {str(root): {"bind": str(root), "mode": "ro"},
           str(build_root): {"bind": str(build_root), "mode": "rw"}}
    export = getattr(getattr(layout, "cfg", None), "export_dir", None)
    if export is not None and root not in (export, *export.parents):
        out[str(export)] = {"bind": str(export), "mode": "ro"}
    pause_dir = os.environ.get(PAUSE_DIR_ENV)
    if os.environ.get(PAUSE_AT_ENV) and pause_dir:
        out[str(Path(pause_dir).resolve())] = {"bind": str(Path(pause_dir).resolve()),
                                               "mode": "rw"}
    return out


def environment(layout: ProjectLayout) -> dict:
    """Everything the step sees of an environment; the image adds its PATH and SDK variables."""
    env = {"HOME": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",
           BUILD_ROOT_ENV: str(layout.build_root)}
    env.update({k: os.environ[k] for k in PASS_THROUGH if k in os.environ})
    env[LIFELINE_ENV] = "stdin"   # the step stops when this run ends (support.run)
    if PAUSE_DIR_ENV in env:
        env[PAUSE_DIR_ENV] = str(Path(env[PAUSE_DIR_ENV]).resolve())   # as mounted
    return env


def limits(settings: ContainerSettings) -> dict:
    """[container]'s limits as docker's run options. /tmp: noexec (nothing a step runs comes
    from there), nosuid, nodev, and sized: its pages count in the step's memory."""
    out = {"pids_limit": settings.pids_limit, "mem_limit": settings.memory,
           "tmpfs": {"/tmp": f"rw,noexec,nosuid,nodev,size={settings.tmp_size}"}}
    if settings.cpus:
        out["nano_cpus"] = round(settings.cpus * 1e9)
    return out


def run_options(layout: Layout, user: str) -> dict:
    """How a step's container runs, all but its name, labels and command: the one place."""
    return dict(working_dir=str(layout.root), volumes=mounts(layout),
                environment=environment(layout), user=user, network_mode="none",
                cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True,
                **limits(layout.cfg.container))


def step_user(layout: Layout, given: str = "") -> str:
    """uid:gid of the step: `given`, else the host user's, else (hexbundle runs as root)
    [container] user; never root."""
    if given:
        return given
    if os.getuid() == 0:
        return layout.cfg.container.user
    return f"{os.getuid()}:{os.getgid()}"


def container_name(spec: dict, task: str = "") -> str:
    """hexbundle-<run id>-<task>: whose it is at a glance in `docker ps`; unique in a run (doit
    runs a task once). Without a task (a direct call) a random suffix keeps names apart."""
    label = task or f"{spec.get('step', 'step')}-{secrets.token_hex(3)}"
    return f"hexbundle-{run_id()}-{re.sub(r'[^A-Za-z0-9_.-]', '.', label)}"


def labels(layout: ProjectLayout, spec: dict, task: str) -> dict:
    return {LABEL_ROOT: str(layout.root), LABEL_BUILD_ROOT: str(layout.build_root),
            LABEL_RUN: run_id(), LABEL_STEP: spec.get("step", ""), LABEL_TASK: task}


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def describe(settings: ContainerSettings, user: str) -> str:
    """The log's first line, after the image: how the step runs."""
    who = f"user {user}" + (" (hexbundle runs as root: container.user)"
                            if os.getuid() == 0 and user == settings.user else "")
    cpus = f"{settings.cpus:g}" if settings.cpus else "no cap"
    return (f"{who}, network none, pids {settings.pids_limit}, memory {_size(settings.memory)}, "
            f"cpus {cpus}, /tmp {_size(settings.tmp_size)} noexec")


def check_cpus(client, settings: ContainerSettings) -> None:
    """docker refuses more CPUs than the engine has, in words that do not name our key."""
    if not settings.cpus:
        return
    ncpu = engine_call("asking the engine's CPUs", client.info).get("NCPU") or 0
    if ncpu and settings.cpus > ncpu:
        raise ContainerError(f"container.cpus = {settings.cpus:g} (configs/build.toml or the "
                             f"command line), but the Docker engine has {ncpu} CPUs: lower it, "
                             "or set 0 for no cap")


# ---------------------------------------------------------------------------------------------
# the build root, for a step that is not root when hexbundle is

def hand_over(layout: Layout, user: str) -> None:
    """When hexbundle runs as root and the step as `user`: make the directories steps write into
    that user's, so it can create, replace and hard-link its outputs there (the bundle links the
    bins: fs.protected_hardlinks wants the linker to own them). The model's tree whole (every
    file in it is a step's output, its log or its input); of the state directory, itself (the
    digest cache is replaced by a rename there) and the digest cache (mode 0600: else the step
    could not read it and would hash everything again); the lock and the DB stay root's. The
    build root itself stays root's: it may be a directory shared with other files."""
    if os.getuid() != 0:
        return
    uid, gid = (int(n) for n in user.split(":"))
    for directory in (layout.model_dir, layout.state_dir):
        directory.mkdir(parents=True, exist_ok=True)
    try:
        _chown_tree(layout.model_dir, uid, gid)
        os.chown(layout.state_dir, uid, gid, follow_symlinks=False)
        _chown_if_there(layout.digest_cache, uid, gid)
    except OSError as exc:
        raise ContainerError(
            f"{exc.filename or layout.model_dir}: cannot hand it to {user}, the user the steps "
            f"run as since hexbundle runs as root ({exc.strerror or exc}): use a build root on a "
            "file system root may chown on (not NFS with root_squash), or run hexbundle as the "
            "user who should own the outputs") from None


def _chown_if_there(path: Path, uid: int, gid: int) -> None:
    """One of hexbundle's own files handed over through a descriptor, if it is one: a regular
    file with one name (never a hard link planted to a file elsewhere)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:   # none yet, or replaced meanwhile by another step's rename
        return
    try:
        try:
            require_own_file(fd, path)
        except OSError as exc:
            raise ContainerError(f"{path}: hexbundle keeps a file of its own there, but it is "
                                 f"{exc.strerror}; remove it, then run again") from None
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def _chown_tree(top: Path, uid: int, gid: int) -> None:
    """chown what is not already uid:gid under `top`, through directory descriptors and never
    following a symlink (a step of a parallel run writes here meanwhile: a name swapped for a
    link must not send a root chown elsewhere). A file is chowned through a descriptor opened
    on it, and only if every name it has is in the tree (the bundle's bins are hard links of
    bin/'s): a hard link planted to a file elsewhere (a setuid binary) is refused, as is
    anything but a regular file, a directory or a symbolic link (a FIFO, a device)."""
    names = _names_by_inode(top)
    for _, dirnames, filenames, dirfd in os.fwalk(top):
        st = os.fstat(dirfd)   # a directory is chowned through the descriptor fwalk checked
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.fchown(dirfd, uid, gid)
        for name in filenames + dirnames:   # files, and links (fwalk lists a link to a dir there)
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) or (st.st_uid, st.st_gid) == (uid, gid):
                    continue
                if stat.S_ISLNK(st.st_mode):   # the link itself (lchown), never its target
                    os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
                    continue
                _chown_own_file(name, dirfd, uid, gid, names, top)
            except FileNotFoundError:   # renamed away by a step running meanwhile
                continue


def _names_by_inode(top: Path) -> dict:
    """(st_dev, st_ino) -> how many names the file has under `top`."""
    count: dict = {}
    for _, _, filenames, dirfd in os.fwalk(top):
        for name in filenames:
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            key = (st.st_dev, st.st_ino)
            count[key] = count.get(key, 0) + 1
    return count


def _chown_own_file(name: str, dirfd: int, uid: int, gid: int, names: dict, top: Path) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 dir_fd=dirfd)
    try:
        st = os.fstat(fd)
        where = os.path.join(os.readlink(f"/proc/self/fd/{dirfd}"), name)
        if not stat.S_ISREG(st.st_mode):
            raise ContainerError(f"{where}: not a regular file (hexbundle writes only files "
                                 f"there); remove it from {top}, then run again")
        if st.st_nlink > names.get((st.st_dev, st.st_ino), 0):
            raise ContainerError(
                f"{where}: it has {st.st_nlink} names, not all of them under {top}: a hard link "
                "to a file elsewhere, which hexbundle, running as root, will not hand to the "
                "step user; remove it, then run again")
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# one step

def run_in_container(layout: Layout, spec: dict, log_path: Path, user: str = "",
                     task: str = "", on_progress: Callable = None) -> int:
    """Run one step in the toolchain image; its output goes to log_path; returns its exit code
    (3 when the container could not be started: the log says why). `user` (uid:gid) defaults to
    step_user's choice; `task` names the container. The step's progress lines
    (support.progress) are not logged: each goes to on_progress(snapshot, closed)."""
    user = step_user(layout, user)
    with open_in_place(log_path) as log:   # never through a symbolic link
        try:
            tc = load_toolchain(layout.root)
            client = docker_client()
            image = pinned_image(client, tc, layout.root)   # by ID: the tag is not trusted
            if layout.cfg.backend == "qairt":
                require_sdk_image(image, tc)
            check_cpus(client, layout.cfg.container)
            hand_over(layout, user)
        except HexbundleError as exc:
            log.write(f"error: {exc}\n")
            return 3
        spec = {**spec, "image": image.id}   # build-info.json records what ran the step
        log.write(f"# container: image {tc.image_tag} {image.id}, "
                  f"{describe(layout.cfg.container, user)}\n")
        log.flush()
        return _run(client, image, layout, spec, log, user, task, on_progress)


class _Relay:
    """The container's output, line by line: progress lines to on_progress, the rest to the log."""

    def __init__(self, log, on_progress):
        self.log, self.on_progress, self.pending = log, on_progress, ""

    def feed(self, text: str, final: bool = False) -> None:
        lines = (self.pending + text).split("\n")
        self.pending = "" if final else lines.pop()
        kept = []
        for line in lines:
            snap = progress.Snapshot.from_line(line)
            if snap is None:
                kept.append(line)
            elif self.on_progress is not None:
                self.on_progress(snap, progress.is_closed_line(line))
        if kept:
            self.log.write("\n".join(kept) + ("" if final and not text.endswith("\n") else "\n"))
        self.log.flush()


def _run(client, image, layout: Layout, spec: dict, log, user: str, task: str,
         on_progress: Callable = None) -> int:
    from docker.errors import APIError
    command = [PYTHON, str(layout.script("step.py")), json.dumps(spec, sort_keys=True)]
    name = container_name(spec, task)
    record = layout.containers_dir / name
    try:   # before the container exists: from here on a kill -9 leaves the record behind
        write_json(record, {"container": name, "run": run_id(), "pid": os.getpid(),
                            "task": task, "build_root": str(layout.build_root)})
    except HexbundleError as exc:
        log.write(f"error: {exc}\n")
        return 3
    container = lifeline = None
    engine_answers = True
    try:
        # created attached (detach=False) with an open stdin: the lifeline (support.run); by
        # the image's ID, never its tag (a tag moved meanwhile does not change what runs)
        container = engine_call(
            "creating the step's container", client.containers.create, image.id, command,
            name=name, labels=labels(layout, spec, task), stdin_open=True, detach=False,
            **run_options(layout, user))
        lifeline = _lifeline(client, container)
        engine_call("starting the step's container", container.start)
        _follow(client, container.id, _Relay(log, on_progress))
        code = int(engine_call("reading the step's exit code", client.api.wait,
                               container.id).get("StatusCode", 1))
        if code != 0:
            state = engine_call("reading how the step ended", client.api.inspect_container,
                                container.id).get("State") or {}
            why = how_it_ended(code, state, layout.cfg.container, name)
            if why:
                log.write(f"error: {why}\n")
        return code
    except APIError as exc:
        log.write(f"error: the Docker engine refused to run the step: {exc.explanation or exc}\n")
        return 3
    except HexbundleError as exc:   # the engine stopped answering or went away (engine_call)
        engine_answers = False
        log.write(f"error: {exc}\n")
        return 3
    finally:   # also on Ctrl-C, even one that came while the container was being created
        if engine_answers:   # else its record stays: the next run removes it
            _remove_own(client, container, name, record)
        if lifeline is not None:
            lifeline.close()


def _follow(client, container_id: str, relay: "_Relay") -> None:
    """The container's output into the relay until it ends. The stream may be silent for many
    minutes (a compile), so it is read in a thread on a long-timeout client, while this thread
    looks at the container every WATCH_EVERY_S through bounded calls: an engine that stops
    answering, or dies, ends the step with a message instead of a wait of hours."""
    stream_client = docker_client(LONG_TIMEOUT_S)
    box: dict = {}

    def pump():
        text = codecs.getincrementaldecoder("utf-8")(errors="replace")   # chunks split chars
        try:
            for chunk in stream_client.api.logs(container_id, stream=True, follow=True):
                relay.feed(text.decode(chunk))
            relay.feed(text.decode(b"", final=True), final=True)
        except BaseException as exc:   # noqa: BLE001 -- handed to the watching thread
            box["error"] = exc

    reader = threading.Thread(target=pump, name=f"docker logs {container_id[:12]}", daemon=True)
    reader.start()
    ended_at = None
    while True:
        reader.join(WATCH_EVERY_S)
        if not reader.is_alive():
            break
        state = engine_call("watching the step's container", client.api.inspect_container,
                            container_id).get("State") or {}
        if not state.get("Running", True):   # ended: its stream should end soon after
            ended_at = ended_at or time.monotonic()
            if time.monotonic() - ended_at > DRAIN_S:
                break
    if "error" in box:
        plain = translate(box["error"], "reading the step's output")
        raise plain if plain is not box["error"] else box["error"]


def how_it_ended(code: int, state: dict, settings: ContainerSettings, name: str) -> str:
    """Why a step's container ended with `code`, when it was not the step's own exit ("" then):
    the kernel's OOM killer, or a signal from outside (docker kill, docker stop, a restarted
    engine). Steps exit with small codes of their own; 128+N is signal N."""
    if state.get("OOMKilled"):
        return (f"the step's container {name} was killed by the OOM killer (exit {code}): the "
                f"step needed more memory than container.memory = {_size(settings.memory)} "
                "allows: raise container.memory (configs/build.toml [container], or "
                "container.memory=... on the command line), then run the build again: nothing "
                "partial was kept")
    if code > 128:
        try:
            sig = signal.Signals(code - 128).name
        except ValueError:
            sig = f"signal {code - 128}"
        return (f"the step's container {name} was killed by {sig} (exit {code}) from outside "
                "this run: `docker kill` or `docker stop`, a restart of the Docker engine, or "
                "the host's OOM killer. Nothing partial was kept: run the build again")
    return ""


def _remove_own(client, container, name: str, record: Path) -> None:
    """This step's container, then its record. The record stays (the next run looks again) if
    the engine would not remove the container, or if a Ctrl-C cut its creation short: the engine
    may still finish creating it after our NotFound."""
    from docker.errors import APIError, NotFound
    try:
        engine_call("removing the step's container", client.api.remove_container,
                    container.id if container is not None else name, force=True)
    except NotFound:
        if container is None:
            return
    except (APIError, HexbundleError):   # refused, or no answer: the next run removes it
        return
    record.unlink(missing_ok=True)


def _lifeline(client, container):
    """The container's stdin, attached, held open by this process and closed by the kernel when
    it ends (kill -9 included): the engine then closes the step's stdin and the step stops
    (support.run.end_with_the_run). None if the engine will not attach: the step then runs
    without one (its stdin stays open; the next run still removes it if this one is killed)."""
    from docker.errors import DockerException
    try:
        return client.api.attach_socket(container.id, params={"stdin": 1, "stream": 1})
    except (DockerException, OSError):
        return None


# ---------------------------------------------------------------------------------------------
# what a killed run left

def remove_leftovers(layout: Layout, notice: Callable[[str], None]) -> list:
    """Remove the step containers of this build root that are not this run's, waiting until each
    is gone, one line about each; then their records. Returns their names.

    Called by the run guard under the build lock, before the clean-up and before any task: a
    container of a run killed with kill -9 still runs (writing into the build root) or has
    stopped and stays. The engine is asked when a record is there or this run uses docker: a
    local run with no records never touches docker."""
    records = sorted(p.name for p in _records(layout))
    if not records and layout.cfg.executor != "docker":
        return []
    try:
        client = docker_client()
    except HexbundleError:
        if records:
            notice(f"no Docker engine answers, so the step container(s) an interrupted run left "
                   f"cannot be removed: {', '.join(records)}. While one runs it may write into "
                   f"{layout.build_root}/: remove them (docker rm -f NAME); the next run that "
                   "reaches the engine does")
        return []
    removed = []
    for entry in _labelled(client, layout):
        if (entry.get("Labels") or {}).get(LABEL_RUN) == run_id():
            continue
        removed.append(_remove(client, entry, layout, notice))
    for name in records:
        (layout.containers_dir / name).unlink(missing_ok=True)
    return removed


def _records(layout: Layout) -> list:
    try:
        return [p for p in layout.containers_dir.iterdir() if not p.name.startswith(".")]
    except FileNotFoundError:
        return []


def _labelled(client, layout: Layout) -> list:
    """This build root's step containers, in any state, from one list call (no inspect: one
    removed meanwhile would raise NotFound)."""
    return engine_call("listing this build root's step containers", client.api.containers,
                       all=True, filters={"label": f"{LABEL_BUILD_ROOT}={layout.build_root}"})


def _remove(client, entry: dict, layout: Layout, notice: Callable[[str], None]) -> str:
    """Kill and remove one container; return once the engine no longer has it."""
    from docker.errors import APIError, NotFound
    name = (entry.get("Names") or ["/" + entry["Id"][:12]])[0].lstrip("/")
    found, state = entry.get("Labels") or {}, entry.get("State", "?")
    risk = ": it could still write into the build root" if state == "running" else ""
    notice(f"removing the step container {name} ({state}) of an interrupted run (run "
           f"{found.get(LABEL_RUN, '?')}, task {found.get(LABEL_TASK) or '?'}) before this run "
           f"starts{risk}")
    why = ""
    try:
        engine_call(f"removing {name}", client.api.remove_container, entry["Id"],
                    force=True)   # kills it, returns once removed
    except NotFound:
        pass
    except APIError as exc:   # e.g. a removal already in progress: wait for it below
        why = f": {exc.explanation or exc}"
    deadline = time.monotonic() + REMOVE_TIMEOUT_S
    while engine_call(f"looking for {name}", client.api.containers, all=True,
                      filters={"id": entry["Id"]}):
        if time.monotonic() > deadline:
            raise ContainerError(
                f"the step container {name} an interrupted run left could not be removed within "
                f"{REMOVE_TIMEOUT_S:.0f}s{why}; while it exists it may write into "
                f"{layout.build_root}/: remove it (docker rm -f {name}), then run the build again")
        time.sleep(POLL_S)
    return name
