"""`doit deploy --to ssh://USER@HOST[:PORT]/DIR [--run PROMPT]`: a bundle onto a board and run.

Through the system's OpenSSH client (`ssh`), so the user's ssh config, agent, known_hosts and
jump hosts apply (`--ssh-config FILE` adds `-F FILE`); BatchMode: an unknown host key or a
refused login fails at once with what to do, never a prompt. The board needs a POSIX sh,
sha256sum, df, ln, mv -T, readlink, find, head: what Qualcomm Linux and Android have. How the
board is reached, and the shell functions every write there goes through: deploy.board.

On the board, DIR is a symlink to a complete bundle in `.<name>.hexbundle/` beside it, a folder
deploy made (it holds STATE_MARK):
  incoming/   the push being made (it holds INCOMING_MARK): files whose SHA-256 it already holds
              are kept, those the current bundle holds are hard-linked from it, only the rest
              are sent (each into NAME.part, made with `set -C`, renamed when whole); then every
              digest is checked there
  <id>/       a complete bundle (id: the manifest's first 16 hex digits of SHA-256)
  run-<hex>/  a run's own folder (--run): the profile is written there, read, and removed
DIR is repointed to the new <id>/ in one rename (ln -s + mv -T of `.<name>.hexbundle/link`), so
an interrupted push leaves the previous bundle working, and the next push finds what incoming/
already holds. Anything at those names that deploy did not make (a user's symlink, folder,
FIFO) is refused by name and left untouched.
"""
from __future__ import annotations

import re
import secrets
import sys
import time
from pathlib import Path
from typing import Callable

from hexbundle.config.layout import MANIFEST
from hexbundle.deploy.board import (ANSWER_LIMIT, DEFAULT_TIMEOUT_S, HEX16, SMALL_ANSWER_LIMIT,
                                    Board, DeployError, Target, check_bundle_name, parse_target,
                                    q, sh)
from hexbundle.formats.genie_profile import read_profile
from hexbundle.formats.manifest import read_manifest, verify_bundle_files
from hexbundle.support.console import printable
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import (JSON_CONFIG_MAX_BYTES, about_argument, require_named_dir,
                                     require_named_file)
from hexbundle.support.hashing import cached_sha256
from hexbundle.support import testhooks
from hexbundle.support.progress import duration, size

__all__ = ["DeployError", "Target", "parse_target", "push", "run_on_board", "deploy_command"]

PROGRESS_EVERY_S = 1.0
LARGE = 8 << 20          # files from this size show progress lines
RUN_OUTPUT_LIMIT = 256 << 20   # what --run shows of the board's output before it stops it
LINE_LIMIT = 64 << 10    # a longer line from the board is shown in pieces
QUERY_ROUNDS = 10        # a query (digests, df, dmesg) ends within this many --timeout
FAILED_TO_MAP = re.compile(r"fastrpc.*fail(ed)? to map|failed to map.*fastrpc", re.I)
STATE_MARK = ".hexbundle-state"        # in .<name>.hexbundle/: deploy made this folder
INCOMING_MARK = ".hexbundle-incoming"  # in incoming/: deploy made this folder
LINK = "link"                          # the new link's name in .<name>.hexbundle/
_SCRIPT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST_LINE = re.compile(rb"([0-9a-f]{64})  \./([^\n]+)")


# ---------------------------------------------------------------------------------------------
# the push

def bundle_files(bundle: Path) -> dict:
    """{relative path: sha256} of every file the manifest lists, and the manifest; each name
    checked as it will become a path on the board."""
    doc = read_manifest(bundle)
    names = sorted(doc["files"]) + [MANIFEST]
    return {check_bundle_name(n, str(bundle / MANIFEST)): cached_sha256(bundle / n)
            for n in names}


def _query_s(board: Board) -> float:
    return board.timeout_s * QUERY_ROUNDS


def remote_digests(board: Board, folder: str) -> dict:
    """{relative path: sha256} of the regular files under `folder` on the board ({} if none);
    links, FIFOs, devices, deploy's marks and anything named NAME.part (or under it) are not
    listed, so never taken for stale and removed."""
    proc = board.run(f"if [ -d {q(folder)} ]; then cd -- {q(folder)} && find . -name '*.part' "
                     "-prune -o -type f ! -name '.hexbundle-*' -exec sha256sum {} + "
                     f"| head -c {ANSWER_LIMIT + 1}; fi", "listing the digests of " + folder,
                     total_s=_query_s(board))
    out = {}
    for line in proc.out.split(b"\n"):
        found = _DIGEST_LINE.fullmatch(line)
        if found:   # anything else (an escaped name, garbage) matches no bundle file
            out[found.group(2).decode(errors="replace")] = found.group(1).decode()
    return out


def push(bundle: Path, target: Target, ssh_config: str, say: Callable[[str], None],
         timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:
    """Send `bundle` to the board; returns {"sent_files", "sent_bytes", "linked", "kept"}."""
    doc = _check_deployable(bundle)
    verify_bundle_files(bundle, str)          # a bundle edited since its build is not sent
    board = Board(target, ssh_config, timeout_s)
    files = bundle_files(bundle)
    bundle_id = files[MANIFEST][:16]
    incoming = f"{target.state}/incoming"
    _start(board)
    have = remote_digests(board, incoming)
    current = remote_digests(board, target.path + "/.")
    keep = {n for n, d in files.items() if have.get(n) == d}
    link = {n for n, d in files.items() if n not in keep and current.get(n) == d}
    send = [n for n in sorted(files) if n not in keep and n not in link]
    stale = sorted(n for n in set(have) - set(files) if _plain(n))
    need = sum((bundle / n).stat().st_size for n in send)
    say(f"deploy {bundle} -> {target.where}: {len(files)} files; {len(keep)} already there, "
        f"{len(link)} linked from the current bundle, {len(send)} to send ({size(need)})")
    _check_space(board, incoming, need)
    _prepare(board, sorted(link), stale, {n: (bundle / n).stat().st_mode & 0o777 for n in link})
    sent = 0
    for name in send:
        sent += _send(board, bundle / name, name, say)
    _verify_remote(board, incoming, files, target)
    _swap(board, bundle_id)
    say(f"deploy: {target.where} is bundle {bundle_id} ({doc.get('model')} for "
        f"{doc.get('device')}): {len(send)} file(s), {size(sent)} sent; digests checked on "
        "the board")
    return {"sent_files": send, "sent_bytes": sent, "linked": sorted(link),
            "kept": sorted(keep), "id": bundle_id}


def _plain(name: str) -> bool:
    try:
        check_bundle_name(name, "")
        return True
    except DeployError:
        return False


def _dir_is_ours(target: Target) -> str:
    """sh: DIR is absent, or the link deploy made (to .<name>.hexbundle/<id>)."""
    d, s = q(target.path), q(target.state)
    return (f"if [ -L {d} ]; then t=$(readlink -- {d}); case $t in {s}/{HEX16}) ;; "
            f"*) refuse {d} 'a symlink deploy did not make (it points elsewhere)' ;; esac; "
            f"elif [ -e {d} ]; then refuse {d} 'exists and is not a bundle hexbundle deployed "
            f"(a symlink to .NAME.hexbundle/<id>)'; fi")


def _start(board: Board) -> None:
    """.<name>.hexbundle/ and its incoming/: made now, or the ones an earlier push made; DIR
    absent or deploy's link; nothing in incoming/ but files and folders."""
    t = board.target
    incoming = f"{t.state}/incoming"
    parent = t.path.rpartition("/")[0] or "/"
    board.run(sh(f"if [ ! -d {q(parent)} ]; then printf '%s: no such folder on the board: make "
                 f"it (mkdir -p) or choose another DIR\\n' {q(parent)} >&2; exit 4; fi",
                 _dir_is_ours(t),
                 f"own_dir {q(t.state)} {STATE_MARK}",
                 f"own_dir {q(incoming)} {INCOMING_MARK}",
                 f"bad=$(find {q(incoming)} ! -type f ! -type d -print | head -n 1)",
                 'if [ -n "$bad" ]; then refuse "$bad" "not a file or folder deploy made"; fi'),
              "preparing " + incoming, limit=SMALL_ANSWER_LIMIT, total_s=_query_s(board))


def _check_deployable(bundle: Path) -> dict:
    try:
        doc = read_manifest(bundle)
    except HexbundleError as exc:
        raise DeployError(f"{exc} (deploy takes a bundle `doit bundle backend=qairt` "
                          "built)") from None
    if not isinstance(doc, dict) or not doc.get("deployable"):
        backend = doc.get("backend") if isinstance(doc, dict) else None
        why = _not_deployable_because(doc)
        raise DeployError(f"{bundle}: a {backend!r}-backend bundle is not deployable "
                          "(manifest.json: deployable false): no board runs its binaries"
                          + (f" ({why})" if why else "")
                          + "; build it with `doit bundle backend=qairt`")
    return doc


def _not_deployable_because(doc) -> str:
    """The first reason an ortqnn manifest's runtime.deployment gives, up to its first colon
    ("graph names"), or ""."""
    runtime = doc.get("runtime") if isinstance(doc, dict) else None
    deployment = runtime.get("deployment") if isinstance(runtime, dict) else None
    reasons = deployment.get("not_deployable_because") if isinstance(deployment, dict) else None
    if isinstance(reasons, list) and reasons and isinstance(reasons[0], str):
        return "runtime.deployment: " + reasons[0].split(":", 1)[0][:60]
    return ""


def _check_space(board: Board, folder: str, need: int) -> None:
    proc = board.run(f"df -Pk {q(folder)} | tail -n 1", "df " + folder,
                     limit=SMALL_ANSWER_LIMIT, total_s=_query_s(board))
    fields = proc.out.decode(errors="replace").split()
    if len(fields) >= 4 and fields[3].isdigit():
        free = int(fields[3]) * 1024
        if free < need:
            raise DeployError(f"{board.target.where}: the board's disk has {size(free)} free "
                              f"where {size(need)} must be sent; free space there and push "
                              "again: the previous bundle is untouched")


def _prepare(board: Board, link: list, stale: list, modes: dict) -> None:
    """Hard links from the current bundle (copies, made with `set -C`, where the filesystem
    cannot link); stale files of an older incoming removed. Each name checked right before."""
    t = board.target
    incoming = f"{t.state}/incoming"
    lines = [_dir_is_ours(t), f"own_dir {q(t.state)} {STATE_MARK}",
             f"own_dir {q(incoming)} {INCOMING_MARK}"]
    for name in stale:
        path = q(f"{incoming}/{name}")
        lines += [f"parents {q(incoming)} {q(name)}", f"own_file {path}", f"rm -f -- {path}"]
    for name in link:
        src, dst = q(f"{t.path}/{name}"), q(f"{incoming}/{name}")
        lines += [f"parents {q(incoming)} {q(name)}", f"own_file {dst}", f"rm -f -- {dst}",
                  f"if [ -L {src} ] || [ ! -f {src} ]; then refuse {src} 'not a file of the "
                  "current bundle'; fi",
                  f"if ! ln -- {src} {dst} 2>/dev/null; then own_file {dst}; "
                  f"(set -C; cat -- {src} > {dst}); no_link {dst}; chmod {modes[name]:o} {dst}; "
                  "fi"]
    board.run(sh(*lines), "linking from the current bundle", limit=SMALL_ANSWER_LIMIT)


def _send(board: Board, local: Path, name: str, say: Callable[[str], None]) -> int:
    """One file through `cat` on the board, into NAME.part (made with `set -C`: a name that is
    there is never written through), renamed when whole."""
    total = local.stat().st_size
    t = board.target
    incoming = f"{t.state}/incoming"
    path, part = q(f"{incoming}/{name}"), q(f"{incoming}/{name}.part")
    # a part a killed push left is deploy's own (a regular file in its incoming/): it goes;
    # renamed only when whole: a push killed mid-file leaves NAME.part (an EOF ends cat too)
    script = sh(_dir_is_ours(t), f"own_dir {q(t.state)} {STATE_MARK}",
                f"own_dir {q(incoming)} {INCOMING_MARK}",
                f"parents {q(incoming)} {q(name)}",
                f"own_file {part}", f"rm -f -- {part}", f"own_file {path}",
                f"(set -C; cat > {part})",
                f"no_link {part}",
                f"[ \"$(wc -c < {part})\" -eq {total} ]",
                f"chmod {local.stat().st_mode & 0o777:o} {part}",
                f"own_file {path}",
                f"mv -f -T -- {part} {path}")
    started = time.monotonic()
    progress = {"done": 0, "shown": started - PROGRESS_EVERY_S}   # a large file's first line

    def fed(count: int) -> None:
        progress["done"] += count
        done = progress["done"]
        if done < total:
            testhooks.pause_point()   # tests kill the push here, mid-file
        now = time.monotonic()
        if total >= LARGE and now - progress["shown"] >= PROGRESS_EVERY_S:
            progress["shown"] = now
            rate = done / max(now - started, 1e-6)
            say(f"  {local.name}: {size(done)} of {size(total)}, {size(rate)}/s, "
                f"ETA {duration((total - done) / max(rate, 1))}")
    with open(local, "rb") as fh:
        board.run(script, "sending " + name, limit=SMALL_ANSWER_LIMIT, feed=fh, on_feed=fed)
    say(f"  sent {local.name}: {size(total)} in {duration(time.monotonic() - started)}")
    return total


def _verify_remote(board: Board, incoming: str, files: dict, target: Target) -> None:
    there = remote_digests(board, incoming)
    wrong = [n for n, d in files.items() if there.get(n) != d]
    if wrong:
        raise DeployError(f"{target.where}: after the push, {wrong[0]} (and {len(wrong) - 1} "
                          "more) does not have the bundle's SHA-256 on the board; push again "
                          "(the previous bundle is untouched)")


def _swap(board: Board, bundle_id: str) -> None:
    """incoming/ becomes <id>/, DIR points at it in one rename; older <id>/ folders go. The
    bundle the board already runs is never removed while DIR points at it."""
    t = board.target
    state, incoming = q(t.state), q(f"{t.state}/incoming")
    final, final_raw, link = q(f"{t.state}/{bundle_id}"), f"{t.state}/{bundle_id}", \
        q(f"{t.state}/{LINK}")
    board.run(sh(
        _dir_is_ours(t), f"own_dir {state} {STATE_MARK}", f"own_dir {incoming} {INCOMING_MARK}",
        f"cur=; if [ -L {q(t.path)} ]; then cur=$(readlink -- {q(t.path)}); fi",
        f"if [ \"$cur\" = {q(final_raw)} ]; then",
        f"  rm -rf -- {incoming}",      # the board runs this bundle already: incoming/ links to it
        "else",
        f"  no_link {final}",
        f"  if [ -d {final} ]; then rm -rf -- {final}; elif [ -e {final} ]; then "
        f"refuse {final} 'not a folder deploy made'; fi",
        f"  mv -T -- {incoming} {final}",
        f"  rm -f -- {final}/{INCOMING_MARK}",
        # a link an interrupted swap left (to .<name>.hexbundle/<id>) is deploy's: it goes
        f"  if [ -L {link} ]; then t=$(readlink -- {link}); case $t in {state}/{HEX16}) "
        f"rm -f -- {link} ;; *) refuse {link} 'a symlink deploy did not make' ;; esac; "
        f"elif [ -e {link} ]; then refuse {link} 'not a link deploy made'; fi",
        f"  ln -s -- {final} {link}",
        "  " + _dir_is_ours(t),
        f"  mv -T -f -- {link} {q(t.path)}",
        "fi",
        # older bundles go once the link points at the new one: only deploy's <id>/ folders
        f"for d in {state}/{HEX16}; do",
        f"  if [ \"$d\" != {final} ] && [ -d \"$d\" ] && [ ! -L \"$d\" ]; then rm -rf -- \"$d\"; fi",
        "done"), "swapping in the new bundle", limit=SMALL_ANSWER_LIMIT)


# ---------------------------------------------------------------------------------------------
# the run

def runtime_script(doc: dict, where: str) -> str:
    """The manifest's runtime.script: a plain file name of the bundle (data, never code)."""
    runtime = doc.get("runtime")
    script = runtime.get("script", "run.sh") if isinstance(runtime, dict) else "run.sh"
    files = doc.get("files")
    if not isinstance(script, str) or not _SCRIPT.fullmatch(script) \
            or not isinstance(files, dict) or script not in files:
        raise DeployError(f"{where}: runtime.script {script!r} is not the name of a file the "
                          "bundle holds (a plain name such as run.sh, listed in files); rebuild "
                          "the bundle with `doit bundle backend=qairt`")
    return script


class _Lines:
    """The board's output as lines for the user: decoded with replacement, escaped, long lines
    in pieces."""

    def __init__(self, say: Callable[[str], None]):
        self.say, self.pending = say, b""

    def feed(self, chunk: bytes) -> None:
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            self._show(line)
        while len(self.pending) > LINE_LIMIT:
            self._show(self.pending[:LINE_LIMIT])
            self.pending = self.pending[LINE_LIMIT:]

    def close(self) -> None:
        if self.pending:
            self._show(self.pending)
            self.pending = b""

    def _show(self, line: bytes) -> None:
        self.say(f"  | {printable(line.decode(errors='replace').rstrip())}")


def run_on_board(target: Target, ssh_config: str, prompt: str, script: str,
                 say: Callable[[str], None], timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:
    """run.sh on the board, its output streamed (escaped); the profile's time to first token and
    token rate; the kernel's fastrpc "failed to map" lines logged during the run."""
    board = Board(target, ssh_config, timeout_s)
    run_dir = f"{target.state}/run-{secrets.token_hex(8)}"
    profile = f"{run_dir}/profile.json"
    marker = board.run("dmesg 2>/dev/null | wc -l", "dmesg | wc -l", check=False,
                       limit=SMALL_ANSWER_LIMIT, total_s=_query_s(board))
    count = marker.out.decode(errors="replace").strip()
    before = int(count) if count.isdigit() and marker.code == 0 else None
    cmd = f"cd -- {q(target.path)} && {q('./' + script)} -c genie_config.json " \
          f"-p {q(prompt)} --profile {q(profile)}"
    say(f"run on {target.host}: {printable(cmd)}")
    lines = _Lines(say)
    try:
        answer = board.run(sh(_dir_is_ours(target), f"own_dir {q(target.state)} {STATE_MARK}",
                              f"mkdir -- {q(run_dir)}", "set +e", f"{{ {cmd}; }} 2>&1"),
                           "running " + script, limit=RUN_OUTPUT_LIMIT, check=False,
                           on_out=lines.feed)
    finally:
        lines.close()
    code = answer.code
    if code == 3 and "hexbundle-refuse:" in answer.err:
        raise board.error(code, answer.err, "run")
    kernel = _kernel_lines(board, before, say)
    for line in kernel:
        say(f"  kernel: {line}" + ("   (non-fatal: the run succeeded)" if code == 0 else ""))
    if code == 255:
        _remove_run_dir(board, run_dir)
        raise board.error(code, answer.err, "run")
    result = {"exit": code, "failed_to_map": kernel, "fatal_map_failures": code != 0
              and bool(kernel)}
    if code != 0:
        _remove_run_dir(board, run_dir)
        raise DeployError(f"{target.where}: {script} exited {code}; its output is above"
                          + (f"; the kernel logged {len(kernel)} fastrpc 'failed to map' "
                             "line(s) during the run: the NPU could not map the model (too "
                             "large for one process domain? use-mmap on?)" if kernel else ""))
    fetched = board.run(f"p={q(profile)}; if [ -L \"$p\" ] || [ ! -f \"$p\" ]; then "
                        "if [ -e \"$p\" ] || [ -L \"$p\" ]; then exit 5; fi; exit 4; fi; "
                        f"head -c {JSON_CONFIG_MAX_BYTES + 1} -- \"$p\"", "reading the profile",
                        limit=JSON_CONFIG_MAX_BYTES, check=False, total_s=_query_s(board))
    _remove_run_dir(board, run_dir)
    where = f"{target.host}:{profile}"
    if fetched.code == 0:
        try:
            ttft, rate = read_profile(fetched.out, where)
        except HexbundleError as exc:
            raise DeployError(printable(str(exc))) from None
        result.update(time_to_first_token_us=ttft, token_rate=rate)
        say(f"run: time to first token {ttft / 1000:.1f} ms, {rate:.2f} tokens/s "
            f"(the profile's); {len(kernel)} fastrpc 'failed to map' kernel line(s)"
            + (" (non-fatal)" if kernel else ""))
    elif fetched.code == 5:
        say(f"run: {printable(where)} is not a regular file (a FIFO, a link, a device?): not "
            "read")
    else:
        say("run: no profile was written on the board")
    return result


def _kernel_lines(board: Board, before, say: Callable[[str], None]) -> list:
    if before is None:
        say("run: dmesg is not readable on the board; fastrpc kernel lines not reported")
        return []
    log = board.run(f"dmesg 2>/dev/null | tail -n +{before + 1} | head -c {ANSWER_LIMIT}",
                    "reading the kernel log", check=False, total_s=_query_s(board))
    return [printable(line) for line in log.out.decode(errors="replace").splitlines()
            if FAILED_TO_MAP.search(line)]


def _remove_run_dir(board: Board, run_dir: str) -> None:
    """The run's own folder (made by mkdir in this run) goes, if it is still that folder."""
    board.run(sh(f"if [ -d {q(run_dir)} ] && [ ! -L {q(run_dir)} ]; then "
                 f"rm -rf -- {q(run_dir)}; fi"), "removing " + run_dir, check=False,
              limit=SMALL_ANSWER_LIMIT, total_s=_query_s(board))


def check_ssh_config(path: Path) -> None:
    """The ssh config as ssh itself reads it (`ssh -G`: parse and print, connect to nothing):
    a file that is no ssh config is named now, not after the bundle's digests are taken."""
    import subprocess
    try:
        proc = subprocess.run(["ssh", "-G", "-F", str(path), "--", "hexbundle-config-check"],
                              capture_output=True, text=True, timeout=30, errors="replace",
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
                          f"({printable(first.strip()[:200])}); give your ssh config "
                          "(ssh -F FILE)")


def parse_timeout(text) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not 1 <= value <= 86400:
        raise DeployError(f"--timeout {text!r}: give the seconds the board may stay silent, "
                          "from 1 to 86400")
    return value


def deploy_command(bundle: str, to: str, run: str = "", ssh_config: str = "",
                   push_first: bool = True, timeout: str = str(DEFAULT_TIMEOUT_S)) -> None:
    if not to:
        raise DeployError("deploy: give the board: --to ssh://USER@HOST[:PORT]/DIR")
    target = parse_target(to)
    timeout_s = parse_timeout(timeout)
    path = Path(bundle).expanduser()
    # the paths named on the command line, before anything is read or sent (support.files)
    require_named_dir(path, "bundle directory", "--path")
    if ssh_config:
        require_named_file(Path(ssh_config).expanduser(), "ssh config", JSON_CONFIG_MAX_BYTES,
                           "--ssh-config")
        check_ssh_config(Path(ssh_config).expanduser())
    with about_argument("--path", bundle):
        doc = _check_deployable(path)
        script = runtime_script(doc, str(path / MANIFEST)) if run else ""

    def say(line: str) -> None:
        print(line, flush=True)
    testhooks.set_step("deploy")
    if push_first:
        push(path, target, ssh_config, say, timeout_s)
    if run:
        run_on_board(target, ssh_config, run, script, say, timeout_s)
    sys.stdout.flush()
