"""`doit deploy --to ssh://USER@HOST[:PORT]/DIR [--run PROMPT]`: a bundle onto a board and run.

Through the system's OpenSSH client (`ssh`), so the user's ssh config, agent, known_hosts and
jump hosts apply (`--ssh-config FILE` adds `-F FILE`); BatchMode: an unknown host key or a
refused login fails at once with what to do, never a prompt. The board needs a POSIX sh,
sha256sum, df, ln, mv: what Qualcomm Linux and Android have.

On the board, DIR is a symlink to a complete bundle in `.<name>.hexbundle/` beside it:
  incoming/   the push being made: files whose SHA-256 it already holds are kept, those the
              current bundle holds are hard-linked from it, only the rest are sent (each into
              NAME.part, renamed when whole); then every digest is checked there
  <id>/       a complete bundle (id: the manifest's first 16 hex digits of SHA-256)
DIR is repointed to the new <id>/ in one rename (ln -s + mv -T), so an interrupted push leaves
the previous bundle working, and the next push finds what incoming/ already holds.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlsplit

from hexbundle.config.layout import MANIFEST
from hexbundle.formats.genie_profile import read_profile
from hexbundle.formats.manifest import read_manifest, verify_bundle_files
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import (JSON_CONFIG_MAX_BYTES, about_argument, require_named_dir,
                                     require_named_file)
from hexbundle.support.hashing import cached_sha256
from hexbundle.support import testhooks
from hexbundle.support.progress import duration, size

CHUNK = 1 << 20
PROGRESS_EVERY_S = 1.0
LARGE = 8 << 20          # files from this size show progress lines
FAILED_TO_MAP = re.compile(r"fastrpc.*fail(ed)? to map|failed to map.*fastrpc", re.I)


class DeployError(HexbundleError):
    """The push or the run on the board failed; the message says what to do."""


@dataclass(frozen=True)
class Target:
    user: str
    host: str
    port: Optional[int]
    path: str            # absolute, on the board

    @property
    def where(self) -> str:
        port = f":{self.port}" if self.port else ""
        return f"ssh://{self.user + '@' if self.user else ''}{self.host}{port}{self.path}"


def parse_target(text: str) -> Target:
    parts = urlsplit(text)
    if parts.scheme != "ssh" or not parts.hostname or not parts.path.strip("/"):
        raise DeployError(f"--to {text!r}: give ssh://USER@HOST[:PORT]/DIR (DIR: the bundle's "
                          "folder on the board, an absolute path)")
    try:
        port = parts.port
    except ValueError:
        raise DeployError(f"--to {text!r}: the port is not a number") from None
    return Target(parts.username or "", parts.hostname, port, "/" + parts.path.strip("/"))


class Board:
    """Commands on the board through `ssh`."""

    def __init__(self, target: Target, ssh_config: str = ""):
        self.target = target
        self.base = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20"]
        if ssh_config:
            self.base += ["-F", ssh_config]
        if target.port:
            self.base += ["-p", str(target.port)]
        self.base.append(f"{target.user}@{target.host}" if target.user else target.host)

    def run(self, script: str, stdin=None, check=True) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.base + ["sh -c " + shlex.quote(script)], input=stdin,
                              capture_output=True)
        if check and proc.returncode != 0:
            raise self.error(proc.returncode, proc.stderr.decode(errors="replace"), script)
        return proc

    def error(self, code: int, err: str, what: str) -> DeployError:
        t = self.target
        if "Host key verification failed" in err or "REMOTE HOST IDENTIFICATION HAS CHANGED" in err:
            return DeployError(f"{t.host}: its host key is not in your known_hosts (or changed): "
                               f"connect once with `ssh {t.host}` and check the fingerprint, or "
                               "add it with ssh-keyscan; nothing was sent")
        if "Permission denied" in err:
            return DeployError(f"{t.user or 'you'}@{t.host}: login refused ({err.strip()}): "
                               "add your public key to the board's ~/.ssh/authorized_keys or "
                               "name the key in your ssh config; nothing was sent")
        if "No space left on device" in err or "Disk quota exceeded" in err:
            return DeployError(f"{t.where}: the board's disk is full ({_last(err)}); free "
                               "space there and push again: the previous bundle is untouched")
        if code == 255:
            return DeployError(f"{t.host}: ssh failed ({_last(err)}); check the host, the "
                               "port and your ssh config")
        return DeployError(f"{t.where}: a command on the board failed (exit {code}): "
                           f"{_last(err)}")


def _last(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


# ---------------------------------------------------------------------------------------------
# the push

def bundle_files(bundle: Path) -> dict:
    """{relative path: sha256} of every file the manifest lists, and the manifest."""
    doc = read_manifest(bundle)
    names = sorted(doc["files"]) + [MANIFEST]
    return {n: cached_sha256(bundle / n) for n in names}


def _state_dir(path: str) -> str:
    parent, _, name = path.rstrip("/").rpartition("/")
    return f"{parent}/.{name}.hexbundle"


def remote_digests(board: Board, folder: str) -> dict:
    """{relative path: sha256} of the files under `folder` on the board ({} if none)."""
    q = shlex.quote(folder)
    proc = board.run(f"if [ -d {q} ]; then cd {q} && find . -type f ! -name '*.part' "
                     "-exec sha256sum {} +; fi")
    out = {}
    for line in proc.stdout.decode(errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        if name:
            out[name[2:] if name.startswith("./") else name] = digest
    return out


def push(bundle: Path, target: Target, ssh_config: str, say: Callable[[str], None]) -> dict:
    """Send `bundle` to the board; returns {"sent_files", "sent_bytes", "linked", "kept"}."""
    doc = _check_deployable(bundle)
    verify_bundle_files(bundle, str)          # a bundle edited since its build is not sent
    board = Board(target, ssh_config)
    files = bundle_files(bundle)
    bundle_id = files[MANIFEST][:16]
    state = _state_dir(target.path)
    incoming, current_link = f"{state}/incoming", target.path
    _start(board, incoming, current_link)
    have = remote_digests(board, incoming)
    current = remote_digests(board, current_link + "/.")
    keep = {n for n, d in files.items() if have.get(n) == d}
    link = {n for n, d in files.items() if n not in keep and current.get(n) == d}
    send = [n for n in sorted(files) if n not in keep and n not in link]
    stale = sorted(set(have) - set(files))
    need = sum((bundle / n).stat().st_size for n in send)
    say(f"deploy {bundle} -> {target.where}: {len(files)} files; {len(keep)} already there, "
        f"{len(link)} linked from the current bundle, {len(send)} to send ({size(need)})")
    _check_space(board, incoming, need)
    _prepare(board, incoming, current_link, sorted(link), stale)
    sent = 0
    for name in send:
        sent += _send(board, bundle / name, f"{incoming}/{name}", say)
    _verify_remote(board, incoming, files, target)
    _swap(board, state, incoming, bundle_id, current_link)
    say(f"deploy: {target.where} is bundle {bundle_id} ({doc.get('model')} for "
        f"{doc.get('device')}): {len(send)} file(s), {size(sent)} sent; digests checked on "
        "the board")
    return {"sent_files": send, "sent_bytes": sent, "linked": sorted(link),
            "kept": sorted(keep), "id": bundle_id}


def _start(board: Board, incoming: str, link: str) -> None:
    """incoming/ made; DIR, when there, must be the link an earlier push made."""
    q = shlex.quote
    proc = board.run(f"if [ -e {q(link)} ] && [ ! -L {q(link)} ]; then exit 3; fi; "
                     f"mkdir -p {q(incoming)}", check=False)
    if proc.returncode == 3:
        raise DeployError(f"{board.target.where}: exists and is not a bundle hexbundle deployed "
                          "(a symlink to .NAME.hexbundle/<id>): move it away or choose another "
                          "DIR")
    if proc.returncode != 0:
        raise board.error(proc.returncode, proc.stderr.decode(errors="replace"), "mkdir")


def _check_deployable(bundle: Path) -> dict:
    try:
        doc = read_manifest(bundle)
    except HexbundleError as exc:
        raise DeployError(f"{bundle / MANIFEST}: cannot read it ({exc}); build the bundle with "
                          "`doit bundle backend=qairt`") from None
    if not doc.get("deployable"):
        raise DeployError(f"{bundle}: a {doc.get('backend')!r}-backend bundle is not deployable "
                          "(manifest.json: deployable false): no board runs its binaries; build "
                          "it with `doit bundle backend=qairt`")
    return doc


def _check_space(board: Board, folder: str, need: int) -> None:
    proc = board.run(f"df -Pk {shlex.quote(folder)} | tail -n 1")
    fields = proc.stdout.decode().split()
    if len(fields) >= 4 and fields[3].isdigit():
        free = int(fields[3]) * 1024
        if free < need:
            raise DeployError(f"{board.target.where}: the board's disk has {size(free)} free "
                              f"where {size(need)} must be sent; free space there and push "
                              "again: the previous bundle is untouched")


def _prepare(board: Board, incoming: str, current: str, link: list, stale: list) -> None:
    """Hard links from the current bundle (copies where the filesystem cannot link); stale
    files of an older incoming removed."""
    lines = ["set -e", f"cd {shlex.quote(incoming)}"]
    for name in stale:
        lines.append(f"rm -f {shlex.quote(name)}")
    for name in link:
        src, dst = shlex.quote(f"{current}/{name}"), shlex.quote(name)
        lines.append(f"mkdir -p \"$(dirname {dst})\" && rm -f {dst} && "
                     f"{{ ln {src} {dst} 2>/dev/null || cp {src} {dst}; }}")
    board.run("\n".join(lines))


def _send(board: Board, local: Path, remote: str, say: Callable[[str], None]) -> int:
    """One file through `cat` on the board, into NAME.part, renamed when whole."""
    total = local.stat().st_size
    q, part = shlex.quote(remote), shlex.quote(remote + ".part")
    # renamed only when whole: a push killed mid-file leaves NAME.part (an EOF ends cat too)
    script = (f"mkdir -p \"$(dirname {q})\" && cat > {part} && "
              f"[ \"$(wc -c < {part})\" -eq {total} ] && "
              f"chmod {local.stat().st_mode & 0o777:o} {part} && mv -f {part} {q}")
    proc = subprocess.Popen(board.base + ["sh -c " + shlex.quote(script)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    started = time.monotonic()
    done, shown = 0, started - PROGRESS_EVERY_S     # a large file's first line at once
    try:
        with open(local, "rb") as fh:
            while chunk := fh.read(CHUNK):
                proc.stdin.write(chunk)
                done += len(chunk)
                if done < total:
                    testhooks.pause_point()   # tests kill the push here, mid-file
                now = time.monotonic()
                if total >= LARGE and now - shown >= PROGRESS_EVERY_S:
                    shown = now
                    rate = done / max(now - started, 1e-6)
                    say(f"  {local.name}: {size(done)} of {size(total)}, {size(rate)}/s, "
                        f"ETA {duration((total - done) / max(rate, 1))}")
        proc.stdin.close()
    except BrokenPipeError:
        pass
    err = proc.stderr.read().decode(errors="replace")
    code = proc.wait()
    if code != 0:
        raise board.error(code, err, f"sending {local.name}")
    elapsed = time.monotonic() - started
    say(f"  sent {local.name}: {size(total)} in {duration(elapsed)}")
    return total


def _verify_remote(board: Board, incoming: str, files: dict, target: Target) -> None:
    there = remote_digests(board, incoming)
    wrong = [n for n, d in files.items() if there.get(n) != d]
    if wrong:
        raise DeployError(f"{target.where}: after the push, {wrong[0]} (and {len(wrong) - 1} "
                          "more) does not have the bundle's SHA-256 on the board; push again "
                          "(the previous bundle is untouched)")


def _swap(board: Board, state: str, incoming: str, bundle_id: str, link: str) -> None:
    final, tmp_link = f"{state}/{bundle_id}", f"{link}.hexbundle-link"
    q = shlex.quote
    board.run("set -e\n"
              f"rm -rf {q(final)}\n"
              f"mv {q(incoming)} {q(final)}\n"
              f"ln -sfn {q(final)} {q(tmp_link)}\n"
              f"mv -Tf {q(tmp_link)} {q(link)}\n"
              # older bundles go once the link points at the new one
              f"for d in {q(state)}/*; do [ \"$d\" = {q(final)} ] || rm -rf \"$d\"; done\n")


# ---------------------------------------------------------------------------------------------
# the run

def run_on_board(target: Target, ssh_config: str, prompt: str, script: str,
                 say: Callable[[str], None]) -> dict:
    """run.sh on the board, its output streamed; the profile's time to first token and token
    rate; the kernel's fastrpc "failed to map" lines logged during the run."""
    board = Board(target, ssh_config)
    q = shlex.quote
    profile = f"{_state_dir(target.path)}/last-profile.json"
    marker = board.run("dmesg 2>/dev/null | wc -l", check=False).stdout.decode().strip()
    before = int(marker) if marker.isdigit() else None
    cmd = (f"cd {q(target.path)} && ./{script} -c genie_config.json -p {q(prompt)} "
           f"--profile {q(profile)}")
    say(f"run on {target.host}: {cmd}")
    proc = subprocess.Popen(board.base + ["sh -c " + q(cmd)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    for line in proc.stdout:
        say(f"  | {line.rstrip()}")
    code = proc.wait()
    kernel = []
    if before is not None:
        log = board.run(f"dmesg 2>/dev/null | tail -n +{before + 1}", check=False)
        kernel = [line for line in log.stdout.decode(errors="replace").splitlines()
                  if FAILED_TO_MAP.search(line)]
    else:
        say("run: dmesg is not readable on the board; fastrpc kernel lines not reported")
    for line in kernel:
        say(f"  kernel: {line}" + ("   (non-fatal: the run succeeded)" if code == 0 else ""))
    if code == 255:
        raise board.error(code, "", "run")
    result = {"exit": code, "failed_to_map": kernel, "fatal_map_failures": code != 0
              and bool(kernel)}
    if code != 0:
        raise DeployError(f"{target.where}: {script} exited {code}; its output is above"
                          + (f"; the kernel logged {len(kernel)} fastrpc 'failed to map' "
                             "line(s) during the run: the NPU could not map the model (too "
                             "large for one process domain? use-mmap on?)" if kernel else ""))
    fetched = board.run(f"cat {q(profile)}", check=False)
    if fetched.returncode == 0:
        ttft, rate = read_profile(fetched.stdout, f"{target.host}:{profile}")
        result.update(time_to_first_token_us=ttft, token_rate=rate)
        say(f"run: time to first token {ttft / 1000:.1f} ms, {rate:.2f} tokens/s "
            f"(the profile's); {len(kernel)} fastrpc 'failed to map' kernel line(s)"
            + (" (non-fatal)" if kernel else ""))
    else:
        say("run: no profile was written on the board")
    return result


def check_ssh_config(path: Path) -> None:
    """The ssh config as ssh itself reads it (`ssh -G`: parse and print, connect to nothing):
    a file that is no ssh config is named now, not after the bundle's digests are taken."""
    try:
        proc = subprocess.run(["ssh", "-G", "-F", str(path), "--", "hexbundle-config-check"],
                              capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise DeployError("deploy: no `ssh` on PATH: install the OpenSSH client "
                          "(apt-get install openssh-client)") from None
    except subprocess.TimeoutExpired:
        raise DeployError(f"--ssh-config {path}: `ssh -G` did not finish reading it in 30 s") \
            from None
    if proc.returncode != 0:
        first = next((line for line in proc.stderr.splitlines() if line.strip()), "")
        raise DeployError(f"--ssh-config {path}: ssh cannot use it as a config file "
                          f"({first.strip()[:200]}); give your ssh config (ssh -F FILE)")


def deploy_command(bundle: str, to: str, run: str = "", ssh_config: str = "",
                   push_first: bool = True) -> None:
    if not to:
        raise DeployError("deploy: give the board: --to ssh://USER@HOST[:PORT]/DIR")
    target = parse_target(to)
    path = Path(bundle).expanduser()
    # the paths named on the command line, before anything is read or sent (support.files)
    require_named_dir(path, "bundle directory", "--path")
    if ssh_config:
        require_named_file(Path(ssh_config).expanduser(), "ssh config", JSON_CONFIG_MAX_BYTES,
                           "--ssh-config")
        check_ssh_config(Path(ssh_config).expanduser())
    with about_argument("--path", bundle):
        doc = _check_deployable(path)

    def say(line: str) -> None:
        print(line, flush=True)
    testhooks.set_step("deploy")
    if push_first:
        push(path, target, ssh_config, say)
    if run:
        script = (doc.get("runtime") or {}).get("script", "run.sh")
        run_on_board(target, ssh_config, run, script, say)
    sys.stdout.flush()
