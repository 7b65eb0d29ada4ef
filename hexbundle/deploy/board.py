"""The board, as `doit deploy` reaches it: where (`--to`, checked to its exact shape), how (the
system's `ssh`, every value after `--` and quoted), and what comes back (bounded in time and
size, streamed to a file, never decoded strictly, escaped before it is shown).

Every command deploy runs there is a POSIX sh script that starts with PRELUDE: the functions
that create only what deploy makes itself (mkdir, `set -C`), never follow a symlink (`[ -L ]`
right before each step) and refuse anything else by name (exit 3, `hexbundle-refuse:` on stderr),
leaving it untouched.
"""
from __future__ import annotations

import ipaddress
import os
import re
import selectors
import shlex
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Optional

from hexbundle.support.console import printable
from hexbundle.support.errors import HexbundleError

CHUNK = 1 << 20
ANSWER_LIMIT = 16 << 20    # a listing of digests, a kernel log: what deploy reads back
SMALL_ANSWER_LIMIT = 64 << 10   # df, wc
STDERR_LIMIT = 64 << 10    # what is kept of the board's stderr: its end (the last line is shown)
DEFAULT_TIMEOUT_S = 120    # the board silent this long: deploy gives up (--timeout)
REFUSED = 3                # a PRELUDE script's exit code when it refused a path

# ssh://USER@HOST[:PORT]/DIR, split before anything is decoded or dropped (urlsplit drops tabs
# and newlines, WHATWG style: a tab in the host sent the bundle somewhere else)
_TARGET = re.compile(r"ssh://(?:(?P<user>[^@/]*)@)?(?P<host>\[[^\]/]*\]|[^:/\[\]]*)"
                     r"(?::(?P<port>[^/]*))?(?P<path>/.*)", re.S)
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")          # POSIX portable names
_HOST = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?"
                   r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*")   # a name or IPv4
_PORT = re.compile(r"[0-9]{1,5}")
# a bundle file's name on the board: plain components, no control characters, no backslash
_COMPONENT = re.compile(r"[^/\\\x00-\x1f\x7f-\x9f]+")
HEX16 = "[0-9a-f]" * 16    # a sh pattern: a bundle's id (its manifest's first 16 hex digits)


class DeployError(HexbundleError):
    """The push or the run on the board failed; the message says what to do."""


@dataclass(frozen=True)
class Target:
    user: str
    host: str            # a host name, an IPv4 address or an IPv6 one (without brackets)
    port: Optional[int]
    path: str            # absolute, on the board

    @property
    def where(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = f":{self.port}" if self.port else ""
        return f"ssh://{self.user + '@' if self.user else ''}{host}{port}{self.path}"

    @property
    def state(self) -> str:
        """`.<DIR name>.hexbundle` beside DIR: deploy's own folder."""
        parent, _, name = self.path.rpartition("/")
        return f"{parent}/.{name}.hexbundle"


def parse_target(text: str) -> Target:
    """`--to` to its exact shape, or a DeployError naming the part that is not."""
    def bad(what: str) -> DeployError:
        return DeployError(f"--to {text!r}: {what}; give ssh://USER@HOST[:PORT]/DIR (DIR: the "
                           "bundle's folder on the board, an absolute path)")
    found = _TARGET.fullmatch(text)
    if not found:
        raise bad("not an ssh:// address")
    user, host, port, path = found.group("user", "host", "port", "path")
    if user is not None and not _USER.fullmatch(user):
        raise bad(f"the user {user!r} is not a user name (letters, digits, '.', '_', '-'; "
                  "not first '-')")
    if host.startswith("["):
        try:
            host = str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise bad(f"{host!r} is not an IPv6 address") from None
    elif not _HOST.fullmatch(host):
        raise bad(f"the host {host!r} is not a host name or address (letters, digits, '.', "
                  "'_', '-'; not first '-')")
    number = None
    if port is not None:
        if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
            raise bad(f"the port {port!r} is not a number from 1 to 65535")
        number = int(port)
    parts = path.rstrip("/").split("/")[1:]
    if not parts or not all(_COMPONENT.fullmatch(p) and p not in (".", "..") for p in parts):
        raise bad(f"the folder {path!r} is not an absolute path of plain names (no '.', '..', "
                  "empty names, control characters or backslashes; not '/')")
    return Target(user or "", host, number, "/" + "/".join(parts))


def check_bundle_name(name: str, where: str) -> str:
    """A bundle file's relative name, as it becomes a path on the board: plain components."""
    parts = name.split("/") if isinstance(name, str) else []
    if not parts or not all(_COMPONENT.fullmatch(p) and p not in (".", "..") for p in parts) \
            or name.startswith("-") or name.endswith(".part") or name.startswith(".hexbundle"):
        raise DeployError(f"{where}: the file name {name!r} cannot be sent (a relative path of "
                          "plain names, without control characters or backslashes, not ending "
                          "in .part); rebuild the bundle with `doit bundle backend=qairt`")
    return name


# ---------------------------------------------------------------------------------------------
# the board's side: POSIX sh, the only primitives deploy writes with

PRELUDE = r"""set -eu
refuse() { printf 'hexbundle-refuse:%s\t%s\n' "$1" "$2" >&2; exit 3; }
no_link() { if [ -L "$1" ]; then refuse "$1" "a symlink deploy did not make"; fi; }
# a folder deploy uses: made now (mkdir fails if anything is there), or a real folder that holds
# the marker ($2, "" for none) deploy put in it when it made it
own_dir() {
  if [ -L "$1" ]; then refuse "$1" "a symlink deploy did not make"
  elif [ -d "$1" ]; then
    if [ -n "$2" ]; then
      if [ -L "$1/$2" ] || [ ! -f "$1/$2" ]; then refuse "$1" "a folder deploy did not make"; fi
    fi
  elif [ -e "$1" ]; then refuse "$1" "not a folder deploy made"
  else
    mkdir -- "$1"
    if [ -n "$2" ]; then (set -C; : > "$1/$2"); fi
  fi
}
# the folders of the relative name $2 under $1 (made when missing, none a link); sets $dir
parents() {
  dir=$1; rest=$2
  while :; do
    case $rest in */*) ;; *) break ;; esac
    dir=$dir/${rest%%/*}; rest=${rest#*/}
    own_dir "$dir" ""
  done
}
# a file deploy may replace: absent or a regular file, not a link, a folder, a FIFO or a device
own_file() {
  no_link "$1"
  if [ -e "$1" ] && [ ! -f "$1" ]; then refuse "$1" "not a file deploy made"; fi
}
"""


def sh(*lines: str) -> str:
    return PRELUDE + "\n".join(lines) + "\n"


def q(value: str) -> str:
    return shlex.quote(value)


# ---------------------------------------------------------------------------------------------
# the connection

@dataclass
class Answer:
    code: int
    out: bytes
    err: str             # decoded with replacement, not yet escaped


class Board:
    """Commands on the board through `ssh`: every read bounded in time and size."""

    def __init__(self, target: Target, ssh_config: str = "",
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.target = target
        self.timeout_s = timeout_s
        connect_s = max(1, int(min(timeout_s, 20)))
        self.base = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_s}"]
        if ssh_config:
            self.base += ["-F", ssh_config]
        if target.port:
            self.base += ["-p", str(target.port)]
        if target.user:
            self.base += ["-l", target.user]
        self.base += ["--", target.host]      # the host can never be taken for an option

    def argv(self, script: str) -> list:
        return self.base + ["sh -c " + q(script)]

    def run(self, script: str, what: str, limit: int = ANSWER_LIMIT, check: bool = True,
            feed: Optional[BinaryIO] = None, on_out: Optional[Callable[[bytes], None]] = None,
            on_feed: Optional[Callable[[int], None]] = None, total_s: Optional[float] = None
            ) -> Answer:
        """`script` on the board; its stdout (at most `limit` bytes, or the run is stopped) is
        returned, or handed to `on_out` as it comes. `feed` is sent as its stdin."""
        answer = exchange(self.argv(script), what, self, limit, feed, on_out, on_feed, total_s)
        if check and answer.code != 0:
            raise self.error(answer.code, answer.err, what)
        return answer

    def error(self, code: int, err: str, what: str) -> DeployError:
        t = self.target
        refused = next((line for line in err.splitlines()
                        if line.startswith("hexbundle-refuse:")), None)
        if code == REFUSED and refused:
            path, _, reason = refused[len("hexbundle-refuse:"):].partition("\t")
            return DeployError(f"{t.where}: {printable(path)}: {printable(reason)}: refused, and "
                               "left untouched; move it away (or choose another DIR) and push "
                               "again")
        # ssh's own failures exit 255; a command's "Permission denied" (in /opt) is not a
        # refused login
        if code == 255 and ("Host key verification failed" in err
                            or "REMOTE HOST IDENTIFICATION HAS CHANGED" in err):
            return DeployError(f"{t.host}: its host key is not in your known_hosts (or changed): "
                               f"connect once with `ssh {t.host}` and check the fingerprint, or "
                               "add it with ssh-keyscan; nothing was sent")
        if code == 255 and "Permission denied" in err:
            return DeployError(f"{t.user or 'you'}@{t.host}: login refused "
                               f"({printable(_last(err))}): add your public key to the board's "
                               "~/.ssh/authorized_keys or name the key in your ssh config; "
                               "nothing was sent")
        if "No space left on device" in err or "Disk quota exceeded" in err:
            return DeployError(f"{t.where}: the board's disk is full ({printable(_last(err))}); "
                               "free space there and push again: the previous bundle is "
                               "untouched")
        if code == 255:
            return DeployError(f"{t.host}: ssh failed ({printable(_last(err))}); check the "
                               "host, the port and your ssh config")
        return DeployError(f"{t.where}: {what} failed on the board (exit {code}): "
                           f"{printable(_last(err))}")


def _last(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else "no message"


def exchange(argv: list, what: str, board: Board, limit: int, feed: Optional[BinaryIO],
             on_out: Optional[Callable[[bytes], None]], on_feed: Optional[Callable[[int], None]],
             total_s: Optional[float]) -> Answer:
    """Run `argv` (ssh), feeding `feed` to its stdin, its stdout streamed to a file (or to
    `on_out`) and its stderr kept up to STDERR_LIMIT: stopped, with a DeployError naming `what`,
    when nothing moved for board.timeout_s, when it took more than `total_s`, or when stdout
    passed `limit` bytes. A board that accepts the login and never runs the command, or answers
    without end, ends here."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if feed else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sink = tempfile.TemporaryFile(prefix="hexbundle-deploy-")
    err = b""
    got = err_total = 0
    pending = b""
    started = moved = time.monotonic()
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ, "out")
    selector.register(proc.stderr, selectors.EVENT_READ, "err")
    if feed:
        os.set_blocking(proc.stdin.fileno(), False)
        selector.register(proc.stdin, selectors.EVENT_WRITE, "in")
    try:
        while selector.get_map():
            now = time.monotonic()
            if now - moved > board.timeout_s:
                raise DeployError(f"{board.target.where}: {what}: the board sent and took "
                                  f"nothing for {board.timeout_s:g} s; stopped (a board that "
                                  "accepted the login but does not run commands? check it with "
                                  "`ssh`; --timeout SECONDS allows longer)")
            if total_s is not None and now - started > total_s:
                raise DeployError(f"{board.target.where}: {what}: no end after {total_s:g} s; "
                                  "stopped")
            for key, _ in selector.select(timeout=1.0):
                if key.data == "in":
                    if not pending:
                        pending = feed.read(CHUNK)
                        if not pending:
                            selector.unregister(proc.stdin)
                            proc.stdin.close()
                            continue
                    try:
                        sent = os.write(proc.stdin.fileno(), pending)
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:   # the board stopped reading: its exit says why
                        selector.unregister(proc.stdin)
                        proc.stdin.close()
                        continue
                    pending = pending[sent:]
                    moved = time.monotonic()
                    if on_feed:
                        on_feed(sent)
                    continue
                chunk = os.read(key.fileobj.fileno(), CHUNK)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                moved = time.monotonic()
                if key.data == "err":
                    err_total += len(chunk)
                    if err_total > ANSWER_LIMIT:
                        raise DeployError(f"{board.target.where}: {what}: the board's error "
                                          f"output passed {ANSWER_LIMIT} bytes; stopped")
                    err = (err + chunk)[-STDERR_LIMIT:]
                    continue
                got += len(chunk)
                if got > limit:
                    raise DeployError(f"{board.target.where}: {what}: the board's answer passed "
                                      f"{limit} bytes; stopped (not what the command prints: is "
                                      "the board's shell or profile printing?)")
                if on_out:
                    on_out(chunk)
                else:
                    sink.write(chunk)
        code = _wait(proc, board.timeout_s)
        if code is None:
            raise DeployError(f"{board.target.where}: {what}: ssh did not exit "
                              f"{board.timeout_s:g} s after the board closed its output; "
                              "stopped")
        sink.seek(0)
        return Answer(code, sink.read(), err.decode(errors="replace"))
    finally:
        selector.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream and not stream.closed:
                stream.close()
        sink.close()


def _wait(proc: subprocess.Popen, timeout_s: float) -> Optional[int]:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
