"""`doit deploy` against a real OpenSSH server (Debian's sshd) that the test starts on
127.0.0.1 with its own sshd_config, port, host key and a client key it makes; the client is the
system's ssh with a config file of the test's own (UserKnownHostsFile, IdentityFile), given by
--ssh-config. The "board" is this machine: the pushed bundle is read back from its folder.
(issue 41, item 4)"""
import getpass
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import Held, copy_project
from hexbundle.support.hashing import file_digest
from test_runtime_bundle import bin_sizes
from standin_runtime import build_runtime

pytestmark = [pytest.mark.deploy, pytest.mark.heavy]

SSHD = "/usr/sbin/sshd"
# a board's forced command (authorized_keys command="..."), whatever deploy asks it to run
FORCED = {
    "silent": "sleep 60",                          # accepts the login, never runs the command
    "binary": "head -c 100000 /dev/urandom",       # answers every command with binary
    "escapes": r"printf '\033]0;pwned\007\033[2Jboom\n' >&2; exit 1",   # terminal escapes
}
HOST_GENIE = Path(__file__).resolve().parent / "standin_qairt" / "host" / "genie-t2t-run"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip() if path.suffix else \
        Path(str(path) + ".pub").read_text().strip()


class Sshd:
    def __init__(self, top: Path):
        assert Path(SSHD).exists(), "sshd is not installed: apt-get install openssh-server"
        self.top = top
        self.port = free_port()
        self.user = getpass.getuser()
        host_pub = keygen(top / "host_key")
        client_pub = keygen(top / "client_key")
        keygen(top / "stranger_key")
        # boards that misbehave, each a key whose authorized_keys line forces its command
        forced = {name: keygen(top / f"{name}_key") for name in FORCED}
        (top / "authorized_keys").write_text(
            client_pub + "\n" + "".join(f'command="{FORCED[name]}" {pub}\n'
                                         for name, pub in forced.items()))
        self.fakebin = top / "fakebin"      # the "board's" dmesg (the kernel log of a board)
        self.fakebin.mkdir()
        self.kernel_log = top / "kernel.log"
        self.kernel_log.write_text("[    1.000] boot\n")
        (self.fakebin / "dmesg").write_text(f"#!/bin/sh\ncat {self.kernel_log}\n")
        (self.fakebin / "dmesg").chmod(0o755)
        self.node = top / "fastrpc-cdsp"
        self.node.write_bytes(b"")
        self.libs = top / "libs"
        self.libs.mkdir()
        (self.libs / "libcdsprpc.so").write_bytes(b"")
        # the board's libstdc++, as run.sh checks it: its symbol versions as plain strings
        (self.libs / "libstdc++.so.6").write_bytes(b"\0GLIBCXX_3.4.28\0GLIBCXX_3.4.29\0")
        Path("/run/sshd").mkdir(exist_ok=True)      # sshd's privilege separation directory
        config = top / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {top / 'host_key'}\n"
            f"PidFile {top / 'sshd.pid'}\nAuthorizedKeysFile {top / 'authorized_keys'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nUsePAM no\nStrictModes no\n"
            "PermitRootLogin prohibit-password\n"
            # SHLVL=1: bash run by sshd reads the user's ~/.bashrc only at shell level 1; this
            # "board" is the machine's own user, whose ~/.bashrc is not a board's (here: pyenv
            # init, whose `pyenv rehash` waits 60 s on a lock a killed session left, per command)
            f"SetEnv SHLVL=1 PATH={self.fakebin}:/usr/local/bin:/usr/bin:/bin "
            f"HEXBUNDLE_FASTRPC_NODE={self.node} LD_LIBRARY_PATH={self.libs}\n")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                     stdout=subprocess.DEVNULL, stderr=open(top / "sshd.log", "w"))
        (top / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_pub}\n")
        (top / "empty_known_hosts").write_text("")
        self.config = self.client_config("ssh_config", "known_hosts", "client_key")
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert self.proc.poll() is None, (top / "sshd.log").read_text()
                assert time.monotonic() < deadline, "sshd did not listen"
                time.sleep(0.1)

    def client_config(self, name: str, known_hosts: str, key: str) -> Path:
        path = self.top / name
        path.write_text(f"Host board\n  HostName 127.0.0.1\n  Port {self.port}\n"
                        f"  User {self.user}\n  IdentityFile {self.top / key}\n"
                        "  IdentitiesOnly yes\n"
                        f"  UserKnownHostsFile {self.top / known_hosts}\n"
                        "  StrictHostKeyChecking yes\n  GlobalKnownHostsFile /dev/null\n")
        return path

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)


@pytest.fixture(scope="module")
def sshd():
    top = Path(tempfile.mkdtemp(prefix="hexbundle-sshd-", dir="/tmp"))
    server = Sshd(top)
    yield server
    server.stop()
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deploy")
    sdk = build_runtime(tmp / "sdk", tmp / "work")
    project = copy_project(tmp / "proj")
    project.doit("inputs")
    env = {"QAIRT_SDK_ROOT": str(sdk),
           "STANDIN_QAIRT_BIN_BYTES": json.dumps(bin_sizes(project, "iq9075"))}
    project.doit("bundle", "backend=qairt", env=env)
    project.doit("bundle")          # the reference bundle too
    return project


def deploy(project, sshd, bundle: Path, dest: Path, *args, config=None, check=True):
    return project.doit("deploy", "--to", f"ssh://board{dest}", "--ssh-config",
                        str(config or sshd.config), "--path", str(bundle), *args, check=check)


def sent(run) -> list:
    return [line.split("sent ", 1)[1].split(":")[0] for line in run.out.splitlines()
            if line.startswith("  sent ")]


def same_tree(a: Path, b: Path) -> bool:
    def files(root):
        return {p.relative_to(root).as_posix(): file_digest(p)
                for p in root.rglob("*") if p.is_file()}
    return files(a) == files(b)


def changed_copy(bundle: Path, dest: Path, name: str) -> Path:
    """`bundle` with one bin's bytes changed and its manifest entry to match."""
    shutil.copytree(bundle, dest)
    path = dest / name
    path.write_bytes(path.read_bytes() + b" ")
    man = json.loads((dest / "manifest.json").read_text())
    man["files"][name] = {"size": path.stat().st_size, "xxh3_128": file_digest(path)}
    (dest / "manifest.json").write_text(json.dumps(man, indent=2))
    return dest


def test_pushes_send_what_differs_and_swap_it_in_whole(proj, sshd, tmp_path):
    bundle = proj.bundle(backend="qairt")
    dest = sshd.top / "boards" / "a" / "bundle"
    dest.parent.mkdir(parents=True)
    first = deploy(proj, sshd, bundle, dest)
    files = json.loads((bundle / "manifest.json").read_text())["files"]
    assert sorted(sent(first)) == sorted(Path(n).name for n in list(files) + ["manifest.json"])
    assert dest.is_symlink() and same_tree(dest, bundle)
    assert "digests checked on the board" in first.out
    second = deploy(proj, sshd, bundle, dest)
    assert sent(second) == []          # no bin bytes, nothing at all
    assert "0 file(s), 0 B sent" in second.out
    part = "qwen2_tiny_part_3_of_4.bin"
    other = changed_copy(bundle, tmp_path / "changed", part)
    third = deploy(proj, sshd, other, dest)
    assert sorted(sent(third)) == sorted([part, "manifest.json"])   # one part (and the manifest)
    assert same_tree(dest, other)
    kept = [p.name for p in (dest.parent / ".bundle.hexbundle").iterdir() if p.is_dir()]
    assert len(kept) == 1      # the old one removed


def test_a_push_killed_mid_transfer_leaves_the_previous_bundle_and_the_next_completes(
        proj, sshd, tmp_path):
    bundle = proj.bundle(backend="qairt")
    dest = sshd.top / "boards" / "b" / "bundle"
    dest.parent.mkdir(parents=True)
    deploy(proj, sshd, bundle, dest)
    big = changed_copy(bundle, tmp_path / "big", "qwen2_tiny_part_2_of_4.bin")
    target = big / "qwen2_tiny_part_2_of_4.bin"
    target.write_bytes(target.read_bytes() + os.urandom(9 << 20))   # large: progress shown
    man = json.loads((big / "manifest.json").read_text())
    man["files"][target.name] = {"size": target.stat().st_size, "xxh3_128": file_digest(target)}
    (big / "manifest.json").write_text(json.dumps(man))
    held = Held(proj, ["deploy", "--to", f"ssh://board{dest}", "--ssh-config", str(sshd.config),
                       "--path", str(big)], pause_at="deploy", tmp=tmp_path / "held")
    held.wait_paused()
    held.proc.send_signal(signal.SIGKILL)
    held.proc.wait(timeout=60)
    time.sleep(0.5)                     # the ssh child sees its stdin close
    assert same_tree(dest, bundle)      # the previous bundle, whole
    run = deploy(proj, sshd, big, dest)
    assert target.name in sent(run)
    assert same_tree(dest, big)
    # bytes, rate and ETA of a large file
    assert re.search(rf"  {target.name}: [0-9.]+ [KMG]?i?B of 9\.[0-9] MiB, [0-9.]+ [KMG]?i?B/s, "
                     r"ETA \d+", run.out), run.out


def test_a_reference_bundle_is_refused_by_name(proj, sshd):
    run = deploy(proj, sshd, proj.bundle(), sshd.top / "boards" / "ref", check=False)
    assert run.code != 0
    assert "a 'reference'-backend bundle is not deployable" in run.out + run.err
    assert not (sshd.top / "boards" / "ref").exists()


@pytest.mark.parametrize("case, expect", [
    ("unknown host key", "its host key is not in your known_hosts"),
    ("refused login", "login refused"),
])
def test_ssh_failures_say_what_to_do(proj, sshd, case, expect):
    config = sshd.client_config(f"cfg-{case.replace(' ', '-')}",
                                "empty_known_hosts" if case == "unknown host key"
                                else "known_hosts",
                                "stranger_key" if case == "refused login" else "client_key")
    run = deploy(proj, sshd, proj.bundle(backend="qairt"), sshd.top / "boards" / "c",
                 config=config, check=False)
    assert run.code != 0
    text = run.out + run.err
    assert expect in text and "nothing was sent" in text and "Traceback" not in text


def test_a_full_disk_on_the_board_is_a_clear_error(proj, sshd):
    mnt = sshd.top / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        run = deploy(proj, sshd, proj.bundle(backend="qairt"), mnt / "bundle", check=False)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert run.code != 0
    text = run.out + run.err
    assert "the board's disk has" in text and "free space there and push again" in text
    assert "Traceback" not in text


def test_run_streams_the_output_and_reports_the_profile_and_fastrpc_lines(proj, sshd):
    bundle = proj.bundle(backend="qairt")
    dest = sshd.top / "boards" / "run" / "bundle"
    dest.parent.mkdir(parents=True)
    deploy(proj, sshd, bundle, dest)
    # the board's genie-t2t-run: the host stand-in (the bundled one is aarch64); it appends
    # the kernel lines a fastrpc mapping failure leaves, as the seeds saw them
    runner = dest / "bin" / "genie-t2t-run"
    runner.unlink()
    script = HOST_GENIE.read_text().replace(
        'print("[BEGIN]', f'open({str(sshd.kernel_log)!r}, "a").write("[ 99.1] fastrpc '
        'fastrpc-cdsp: failed to map buffer fd 5 size 1048576\\n")\nprint("[BEGIN]')
    runner.write_text(script)
    runner.chmod(0o755)
    run = deploy(proj, sshd, bundle, dest, "--no-push", "--run", "Hello there")
    assert "  | Using libGenie.so version 1.14.0" in run.out
    assert "  | [PROMPT]: Hello there" in run.out
    assert "  | [BEGIN]: Hello from the stand-in.[END]" in run.out
    assert "time to first token 66.5 ms, 11.25 tokens/s" in run.out
    assert "kernel: [ 99.1] fastrpc fastrpc-cdsp: failed to map buffer" in run.out
    assert "(non-fatal: the run succeeded)" in run.out
    assert "[    1.000] boot" not in run.out     # only what the kernel logged during the run


def test_a_folder_deploy_did_not_make_is_left_alone(proj, sshd):
    dest = sshd.top / "boards" / "mine"
    dest.mkdir(parents=True)
    (dest / "notes.txt").write_text("the user's own\n")
    run = deploy(proj, sshd, proj.bundle(backend="qairt"), dest, check=False)
    assert run.code != 0
    assert "exists and is not a bundle hexbundle deployed" in run.out + run.err
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]


# ---------------------------------------------------------------------------------------------
# issue 47: the board's files, commands built from data, reads without bounds, values with '='

import ast
import contextlib
import hashlib
import stat

from hexbundle.deploy import push as push_module
from hexbundle.deploy.push import INCOMING_MARK, LINK, STATE_MARK

PUSH_SOURCE = Path(push_module.__file__)
BOARD_SOURCE = PUSH_SOURCE.with_name("board.py")


def snapshot(root: Path) -> dict:
    """Everything at and under `root`, links not followed: {path: (kind, bytes or target)}."""
    out = {}
    if not os.path.lexists(root):
        return out
    todo = [root]
    while todo:
        path = todo.pop()
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            out[str(path)] = ("link", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[str(path)] = ("dir", None)
            todo += sorted(path.iterdir())
        elif stat.S_ISREG(st.st_mode):
            out[str(path)] = ("file", path.read_bytes())
        else:
            out[str(path)] = ("other", stat.S_IFMT(st.st_mode))
    return out


def user_folder(where: Path) -> Path:
    """A user's own folder on the board: what no push may write, move or remove."""
    where.mkdir(parents=True)
    (where / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY----- the user's own\n")
    (where / "notes.txt").write_text("the user's notes\n")
    return where


def state_of(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.hexbundle"


def deploys_state(dest: Path) -> Path:
    """.DIR.hexbundle/ as a push leaves it (its mark), nothing else."""
    state = state_of(dest)
    state.mkdir(parents=True)
    (state / STATE_MARK).write_bytes(b"")
    return state


def deploys_incoming(dest: Path) -> Path:
    """incoming/ as a push killed before the swap leaves it."""
    incoming = deploys_state(dest) / "incoming"
    incoming.mkdir()
    (incoming / INCOMING_MARK).write_bytes(b"")
    return incoming


def bundle_id(bundle: Path) -> str:
    return hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()[:16]


# Kind 1: every name deploy creates, writes, renames or removes on the board, with a user's own
# thing planted there. (case, plant(dest, user, bundle) -> the planted path, refused at the swap)
KIND1 = [
    ("DIR: a user's symlink", lambda d, u, b: _link(d, u)),
    ("DIR: a user's folder", lambda d, u, b: _folder(d)),
    (".DIR.hexbundle: a user's symlink", lambda d, u, b: _link(state_of(d), u)),
    (".DIR.hexbundle: a user's folder", lambda d, u, b: _folder(state_of(d))),
    (".DIR.hexbundle: a user's folder DIR points into",
     lambda d, u, b: (_link(d, state_of(d) / ("0" * 16)), _folder(state_of(d)))[1]),
    ("incoming/: a user's symlink", lambda d, u, b: _link(deploys_state(d) / "incoming", u)),
    ("incoming/: a user's folder", lambda d, u, b: _folder(deploys_state(d) / "incoming")),
    ("incoming/NAME.part: a user's symlink",
     lambda d, u, b: _link(deploys_incoming(d) / "manifest.json.part", u / "id_rsa")),
    ("incoming/NAME.part: a user's folder",
     lambda d, u, b: _folder(deploys_incoming(d) / "manifest.json.part")),
    ("incoming/NAME: a user's symlink",
     lambda d, u, b: _link(deploys_incoming(d) / "manifest.json", u / "id_rsa")),
    ("incoming/lib/: a user's symlink", lambda d, u, b: _link(deploys_incoming(d) / "lib", u)),
    ("the temporary link's name: a user's folder",
     lambda d, u, b: _folder(deploys_state(d) / LINK)),
    ("the temporary link's name: a user's symlink",
     lambda d, u, b: _link(deploys_state(d) / LINK, u)),
    ("the new bundle's folder: a user's symlink",
     lambda d, u, b: _link(deploys_state(d) / bundle_id(b), u)),
]


def _link(path: Path, to: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(to)
    return path


def _folder(path: Path) -> Path:
    user_folder(path)
    return path


def test_kind1_table_covers_every_write_on_the_board():
    """Every command that writes on the board (mkdir, a redirection, mv, rm, ln, chmod) sits in
    one of these steps; each names the table cases that plant something where it writes. A new
    write must join KIND1 and this list."""
    writes = {
        "own_dir": ("DIR", ".DIR.hexbundle", "incoming/", "incoming/lib/"),
        "_start": ("DIR", ".DIR.hexbundle", "incoming/"),     # through own_dir
        "_send": ("incoming/NAME.part", "incoming/NAME"),
        "_prepare": ("incoming/NAME",),
        "_swap": ("the temporary link's name", "the new bundle's folder"),
        "run_on_board": ("run-",),       # the run's own folder: mkdir (exclusive), random name
        "_remove_run_dir": ("run-",),    # that folder, checked a real folder right before
    }
    primitives = re.compile(r"\bmkdir\b|\bmv\b|\brm -|\bln\b|\bchmod\b|\bcat\b[^\n\"]*>")
    found = set()
    for source in (PUSH_SOURCE, BOARD_SOURCE):
        tree = ast.parse(source.read_text())
        for func in ast.walk(tree):
            if isinstance(func, ast.FunctionDef):
                text = ast.get_source_segment(source.read_text(), func)
                if primitives.search(text) and func.name not in ("sh",):
                    found.add(func.name)
        if source == BOARD_SOURCE:
            prelude = re.search(r'PRELUDE = r"""(.*?)"""', source.read_text(), re.S).group(1)
            assert primitives.search(prelude)
            found.add("own_dir")
    assert found - {"check_ssh_config"} <= set(writes), sorted(found - set(writes))
    names = " ".join(case for case, _ in KIND1)
    for places in writes.values():
        for place in places:
            assert place in names or place == "run-", place


@pytest.mark.parametrize("case, plant", KIND1, ids=[c for c, _ in KIND1])
def test_kind1_what_deploy_did_not_make_is_refused_by_name_and_left_untouched(
        proj, sshd, case, plant):
    bundle = proj.bundle(backend="qairt")
    top = sshd.top / "boards" / "k1" / re.sub(r"[^a-z0-9]+", "-", case.lower())
    user = user_folder(top / "user")
    dest = top / "bundle"
    planted = plant(dest, user, bundle)
    before = {**snapshot(planted), **snapshot(user)}
    run = deploy(proj, sshd, bundle, dest, check=False)
    text = run.out + run.err
    assert run.code != 0, text
    assert "Traceback" not in text
    assert str(planted) in text, text
    assert "refused, and left untouched" in text or \
        "exists and is not a bundle hexbundle deployed" in text, text
    assert {**snapshot(planted), **snapshot(user)} == before


def test_a_dir_whose_folder_is_missing_is_named(proj, sshd):
    dest = sshd.top / "boards" / "k1-no-parent" / "sub" / "bundle"
    run = deploy(proj, sshd, proj.bundle(backend="qairt"), dest, check=False)
    text = run.out + run.err
    assert run.code != 0 and "Traceback" not in text
    assert f"{dest.parent}: no such folder on the board: make it (mkdir -p)" in text, text
    assert not os.path.lexists(dest.parent)


def test_a_users_own_folder_beside_deploys_bundles_is_kept(proj, sshd):
    bundle = proj.bundle(backend="qairt")
    dest = sshd.top / "boards" / "k1-beside" / "bundle"
    dest.parent.mkdir(parents=True)
    deploy(proj, sshd, bundle, dest)
    mine = user_folder(state_of(dest) / "mine")
    before = snapshot(mine)
    deploy(proj, sshd, bundle, dest)
    assert same_tree(dest, bundle) and snapshot(mine) == before


# Kind 2: every value that reaches ssh or the board's shell. (case, --to, what the message names)
KIND2_TARGETS = [
    ("user starting with -", "ssh://-oProxyCommand=touch%20PWNED@board{d}", "the user"),
    ("user -l", "ssh://-l@board{d}", "the user '-l'"),
    ("user with a newline", "ssh://a\nb@board{d}", "the user"),
    ("host starting with -", "ssh://-oProxyCommand=touch%20PWNED{d}", "the host"),
    ("host -F", "ssh://-F{d}", "the host '-F'"),
    ("host -E", "ssh://-E{d}", "the host '-E'"),
    ("host with a tab", "ssh://boa\trd{d}", "the host 'boa\\trd'"),
    ("host with a newline", "ssh://board\n{d}", "the host"),
    ("port 0", "ssh://board:0{d}", "the port '0'"),
    ("port 65536", "ssh://board:65536{d}", "the port '65536'"),
    ("port +22", "ssh://board:+22{d}", "the port '+22'"),
    ("port empty", "ssh://board:{d}", "the port ''"),
    ("DIR with a newline", "ssh://board{d}\nx", "the folder"),
    ("DIR with a tab", "ssh://board{d}\tx", "the folder"),
    ("DIR with ..", "ssh://board{d}/../x", "the folder"),
    ("DIR /", "ssh://board/", "the folder"),
]


@pytest.mark.parametrize("case, to, names", KIND2_TARGETS, ids=[c for c, *_ in KIND2_TARGETS])
def test_kind2_a_target_not_of_its_exact_shape_is_refused(proj, sshd, case, to, names):
    dest = sshd.top / "boards" / "k2" / re.sub(r"[^a-z0-9]+", "-", case.lower())
    run = proj.doit("deploy", "--to", to.format(d=dest), "--ssh-config", str(sshd.config),
                    "--path", str(proj.bundle(backend="qairt")), check=False)
    text = run.out + run.err
    assert run.code != 0 and "Traceback" not in text
    assert names in text and "ssh://USER@HOST[:PORT]/DIR" in text, text
    assert not os.path.lexists(dest) and not os.path.lexists(dest.parent / "x")
    assert not (proj.root / "PWNED").exists() and not (Path.home() / "PWNED").exists()


def manifest_edited(bundle: Path, dest: Path, edit) -> Path:
    shutil.copytree(bundle, dest)
    man = json.loads((dest / "manifest.json").read_text())
    edit(man, dest)
    (dest / "manifest.json").write_text(json.dumps(man, indent=2))
    return dest


def _outside_file(man: dict, dest: Path) -> None:
    outside = dest.parent / "escape.txt"
    outside.write_text("not the bundle's\n")
    man["files"]["../escape.txt"] = {"size": outside.stat().st_size,
                                     "xxh3_128": file_digest(outside)}


# (case, the manifest's edit, --run or not, what the message names)
KIND2_MANIFEST = [
    ("runtime.script a command", lambda m, d: m["runtime"].update(script="run.sh; touch PWNED #"),
     True, "key 'script' is 'run.sh; touch PWNED #'"),
    ("runtime.script a path", lambda m, d: m["runtime"].update(script="../run.sh"), True,
     "key 'script' is '../run.sh'"),
    ("runtime.script an option", lambda m, d: m["runtime"].update(script="-x"), True,
     "key 'script' is '-x'"),
    ("runtime.script not the bundle's", lambda m, d: m["runtime"].update(script="other.sh"),
     True, "key 'script' is 'other.sh'"),
    ("runtime.script not a string", lambda m, d: m["runtime"].update(script=["run.sh"]), True,
     "key 'script' is list"),
    ("a file name outside the bundle", _outside_file, False,
     "the file name '../escape.txt' cannot be sent"),
]


@pytest.mark.parametrize("case, edit, with_run, names", KIND2_MANIFEST,
                         ids=[c for c, *_ in KIND2_MANIFEST])
def test_kind2_manifest_values_are_data_never_code(proj, sshd, tmp_path, case, edit, with_run,
                                                   names):
    bundle = manifest_edited(proj.bundle(backend="qairt"), tmp_path / "edited" / "bundle", edit)
    dest = sshd.top / "boards" / "k2m" / re.sub(r"[^a-z0-9]+", "-", case.lower()) / "bundle"
    dest.parent.mkdir(parents=True)
    args = ("--no-push", "--run", "Hello") if with_run else ()
    run = deploy(proj, sshd, bundle, dest, *args, check=False)
    text = run.out + run.err
    assert run.code != 0 and "Traceback" not in text
    assert names in text, text
    assert not os.path.lexists(dest) and not os.path.lexists(state_of(dest))
    assert not (Path.home() / "PWNED").exists() and not (proj.root / "PWNED").exists()


def test_kind2_a_folder_name_of_shell_syntax_is_a_name(proj, sshd):
    """Faithful: DIR, quoted everywhere, may hold anything but control characters."""
    bundle = proj.bundle(backend="qairt")
    dest = sshd.top / "boards" / "k2-names" / "it's \"$(touch PWNED)\" `touch PWNED` a=b;*"
    dest.parent.mkdir(parents=True)
    deploy(proj, sshd, bundle, dest)
    assert dest.is_symlink() and same_tree(dest, bundle)
    assert not (Path.home() / "PWNED").exists() and not (dest.parent / "PWNED").exists()


def test_kind2_every_value_in_a_board_command_is_quoted():
    """Every interpolation in the shell text push.py builds is shlex-quoted (q) or one of these
    numbers and constants: a new value must be quoted or join this list."""
    allowed = {"HEX16", "STATE_MARK", "INCOMING_MARK", "total", "modes[name]", "cmd",
               "local.stat().st_mode & 0o777", "ANSWER_LIMIT + 1", "ANSWER_LIMIT",
               "JSON_CONFIG_MAX_BYTES + 1", "before + 1"}
    source = PUSH_SOURCE.read_text()
    tree = ast.parse(source)
    bad = []
    for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        quoted = set()      # names assigned q(...) in this function
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) \
                    else [node.targets[0]]
                for target, value in zip(targets, values):
                    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "q":
                        quoted.add(getattr(target, "id", ""))
        shell = []
        for node in ast.walk(func):
            if isinstance(node, ast.Call) and (getattr(node.func, "id", "") == "sh" or
                                               getattr(node.func, "attr", "") == "run"):
                shell += node.args[:1] if getattr(node.func, "attr", "") == "run" else node.args
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if getattr(target, "id", "") in ("cmd", "script", "lines"):
                    shell.append(node.value)
            elif isinstance(node, ast.Return) and func.name == "_dir_is_ours":
                shell.append(node.value)
        for root in shell:
            for value in ast.walk(root):
                if not isinstance(value, ast.FormattedValue):
                    continue
                expr = value.value
                if isinstance(expr, ast.Call) and getattr(expr.func, "id", "") == "q":
                    continue
                text = ast.get_source_segment(source, expr)
                if text in quoted or text in allowed:
                    continue
                bad.append(f"{func.name}: {{{text}}}")
    assert not bad, bad


def test_kind2_ssh_gets_every_value_after_its_option_or_after_double_dash():
    from hexbundle.deploy.board import Board, Target
    argv = Board(Target("root", "iq9075", 2222, "/opt/x"), "/cfg").argv("true")
    assert argv[argv.index("--") + 1] == "iq9075" and argv[-1] == "sh -c true"
    assert argv[argv.index("-l") + 1] == "root" and argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-F") + 1] == "/cfg"


# Kind 4, 5, 7: every read from the board, bounded in time and size, decoded with replacement,
# escaped. The `what` of every board.run in push.py -> the case that shows its bound.
KIND4_READS = {
    "preparing ": "a board that accepts the login and never runs the command",
    "listing the digests of ": "sha256sum never answers",
    "df ": "df never answers",
    "linking from the current bundle": "ln never returns while linking",
    "sending ": "chmod never returns while sending",
    "swapping in the new bundle": "ln never returns at the swap",
    "dmesg | wc -l": "dmesg never answers",
    "running ": "the run never prints",
    "reading the kernel log": "dmesg never answers the second time",
    "reading the profile": "a FIFO at the profile path",
    "removing ": "rm never returns",
}


def test_kind4_table_covers_every_read_from_the_board():
    source = PUSH_SOURCE.read_text()
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "run" \
                and getattr(node.func.value, "id", "") == "board":
            what = node.args[1]
            while isinstance(what, ast.BinOp):
                what = what.left
            assert isinstance(what, ast.Constant), ast.get_source_segment(source, node)
            found.add(what.value)
    assert found == set(KIND4_READS), found ^ set(KIND4_READS)


@contextlib.contextmanager
def board_tool(sshd, name: str, script: str, always: bool = False, when: str = ""):
    """The board's `name` (first on its PATH) runs `script` when deploy calls it (its working
    folder or an argument under the test's boards/), the real tool otherwise. `always`: for a
    tool only deploy calls (the test's dmesg); `when`: a narrower sh case pattern of "$PWD $*"
    (its spaces quoted)."""
    path = sshd.fakebin / name
    old = path.read_bytes() if path.exists() else None
    real = old and f"{sshd.top}/real-{name}"
    if old:
        Path(real).write_bytes(old)
        Path(real).chmod(0o755)
    else:
        real = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
    pattern = "*" if always else when or f"*{sshd.top}/boards*"
    path.write_text(f'#!/bin/sh\ncase "$PWD $*" in {pattern})\n{script}\nexit $? ;;\n'
                    f'esac\nexec {real} "$@"\n')
    path.chmod(0o755)
    try:
        yield
    finally:
        if old is None:
            path.unlink()
        else:
            path.write_bytes(old)


HANG = "sleep 60"
TIMEOUT = ("--timeout", "3")


def stopped(run, what: str) -> str:
    text = run.out + run.err
    assert run.code != 0 and "Traceback" not in text, text
    assert what in text and "nothing for 3 s; stopped" in text, text
    return text


def runner(dest: Path, replace: str = "", by: str = "") -> None:
    """The board's genie-t2t-run: the host stand-in, edited."""
    path = dest / "bin" / "genie-t2t-run"
    text = HOST_GENIE.read_text()
    assert replace in text
    path.unlink()
    path.write_text(text.replace(replace, by) if replace else text)
    path.chmod(0o755)


@pytest.fixture(scope="module")
def deployed(proj, sshd):
    """A bundle pushed once, for the runs (--no-push) and the second pushes."""
    bundle = proj.bundle(backend="qairt")
    dest = sshd.top / "boards" / "k4" / "bundle"
    dest.parent.mkdir(parents=True)
    deploy(proj, sshd, bundle, dest)
    return dest


def test_kind4_a_board_that_never_runs_the_command(proj, sshd):
    config = sshd.client_config("cfg-silent", "known_hosts", "silent_key")
    dest = sshd.top / "boards" / "k4-silent" / "bundle"
    run = deploy(proj, sshd, proj.bundle(backend="qairt"), dest, *TIMEOUT, config=config,
                 check=False)
    stopped(run, "preparing ")


@pytest.mark.parametrize("tool, what", [("sha256sum", "listing the digests of "),
                                        ("df", "df "), ("chmod", "sending ")])
def test_kind4_a_push_read_that_never_ends(proj, sshd, tool, what):
    dest = sshd.top / "boards" / f"k4-{tool}" / "bundle"
    (deploys_incoming(dest) / "manifest.json").write_text("{}")   # something to list
    with board_tool(sshd, tool, HANG):
        run = deploy(proj, sshd, proj.bundle(backend="qairt"), dest, *TIMEOUT, check=False)
    stopped(run, what)
    assert not os.path.lexists(dest)


def test_kind4_links_and_the_swap_that_never_end(proj, sshd, deployed, tmp_path):
    bundle = proj.bundle(backend="qairt")
    before = snapshot(deployed.resolve())
    other = changed_copy(bundle, tmp_path / "changed", "qwen2_tiny_part_1_of_4.bin")
    with board_tool(sshd, "ln", HANG):
        stopped(deploy(proj, sshd, other, deployed, *TIMEOUT, check=False),
                "linking from the current bundle")
    dest = sshd.top / "boards" / "k4-swap" / "bundle"
    dest.parent.mkdir(parents=True)
    with board_tool(sshd, "ln", HANG):
        stopped(deploy(proj, sshd, bundle, dest, *TIMEOUT, check=False),
                "swapping in the new bundle")
    assert snapshot(deployed.resolve()) == before     # the previous bundle, whole


def test_kind4_an_answer_without_end_is_stopped_at_its_limit(proj, sshd):
    dest = sshd.top / "boards" / "k4-endless" / "bundle"
    (deploys_incoming(dest) / "manifest.json").write_text("{}")
    with board_tool(sshd, "sha256sum", "yes 0123456789abcdef0123456789abcdef"):
        run = deploy(proj, sshd, proj.bundle(backend="qairt"), dest, check=False)
    text = run.out + run.err
    assert run.code != 0 and "Traceback" not in text
    assert f"the board's answer passed {16 << 20} bytes; stopped" in text, text


def test_kind5_binary_answers_are_a_clear_error(proj, sshd):
    config = sshd.client_config("cfg-binary", "known_hosts", "binary_key")
    dest = sshd.top / "boards" / "k5-binary" / "bundle"
    run = deploy(proj, sshd, proj.bundle(backend="qairt"), dest, config=config, check=False)
    text = run.out + run.err
    assert run.code != 0 and "Traceback" not in text
    assert "preparing " in text and "the board's answer passed 65536 bytes; stopped" in text, \
        text


def test_kind7_escapes_in_the_boards_error_are_shown_escaped(proj, sshd):
    config = sshd.client_config("cfg-escapes", "known_hosts", "escapes_key")
    dest = sshd.top / "boards" / "k7-escapes" / "bundle"
    run = deploy(proj, sshd, proj.bundle(backend="qairt"), dest, config=config, check=False)
    text = run.out + run.err
    assert run.code != 0 and "Traceback" not in text
    assert "\\x1b]0;pwned\\x07\\x1b[2Jboom" in text, text
    assert "\x1b" not in text and "\x07" not in text


RUN = ("--no-push", "--run", "Hello")


def test_kind4_run_reads_that_never_end(proj, sshd, deployed):
    runner(deployed)
    with board_tool(sshd, "dmesg", HANG, always=True):
        stopped(deploy(proj, sshd, deployed, deployed, *TIMEOUT, *RUN, check=False),
                "dmesg | wc -l")
    flag = sshd.top / "dmesg-asked"
    with board_tool(sshd, "dmesg", f"if [ -e {flag} ]; then {HANG}; fi; touch {flag}",
                    always=True):
        stopped(deploy(proj, sshd, deployed, deployed, *TIMEOUT, *RUN, check=False),
                "reading the kernel log")
    flag.unlink()
    # deploy's `rm -rf -- RUN_DIR`, not run.sh's own `rm -f -- RUN_DIR/profile.json`
    with board_tool(sshd, "rm", HANG, when='*" -rf -- "*.hexbundle/run-*'):
        stopped(deploy(proj, sshd, deployed, deployed, *TIMEOUT, *RUN, check=False),
                "removing ")
    runner(deployed, 'print("[BEGIN]', 'time.sleep(60)\nprint("[BEGIN]')
    stopped(deploy(proj, sshd, deployed, deployed, *TIMEOUT, *RUN, check=False), "running ")
    runs = [p for p in state_of(deployed).iterdir() if p.name.startswith("run-")]
    assert runs == [] or runs    # a stopped run's folder may stay: the next run makes its own


def test_kind4_a_fifo_at_the_profile_path_is_not_read(proj, sshd, deployed):
    runner(deployed, '    with open(args.profile, "w") as fh:\n        json.dump(profile, fh, '
           'indent=2)', "    os.mkfifo(args.profile)")
    run = deploy(proj, sshd, deployed, deployed, *TIMEOUT, *RUN)
    assert "profile.json is not a regular file (a FIFO, a link, a device?): not read" in run.out
    assert "  | [BEGIN]: Hello from the stand-in.[END]" in run.out


def test_kind5_7_binary_and_escapes_on_the_boards_stdout_are_shown_escaped(proj, sshd,
                                                                          deployed):
    runner(deployed, 'print("[BEGIN]', 'sys.stdout.flush(); sys.stdout.buffer.write(b"\\xff\\xfe'
           '\\x1b]0;pwned\\x07\\x1b[31mred\\x9b2J\\n"); sys.stdout.flush()\nprint("[BEGIN]')
    run = deploy(proj, sshd, deployed, deployed, *RUN)
    assert "  | \ufffd\ufffd\\x1b]0;pwned\\x07\\x1b[31mred\ufffd2J" in run.out, run.out
    assert "\x1b" not in run.out + run.err and "\x07" not in run.out + run.err
    assert "time to first token 66.5 ms" in run.out


# Kind 6: an option's value is never a setting, whatever it holds.
def test_kind6_option_values_with_equals_signs_are_values(proj, sshd, deployed, tmp_path):
    runner(deployed)
    run = deploy(proj, sshd, deployed, deployed, "--no-push", "--run",
                 "what is x=1+1; it's \"$(touch PWNED)\"")
    assert "  | [PROMPT]: what is x=1+1; it's \"$(touch PWNED)\"" in run.out, run.out
    assert not (Path.home() / "PWNED").exists() and not (deployed / "PWNED").exists()
    bundle = tmp_path / "a=b" / "bundle"
    shutil.copytree(proj.bundle(backend="qairt"), bundle)
    config = tmp_path / "cfg=1"
    shutil.copy(sshd.config, config)
    dest = sshd.top / "boards" / "k6" / "x=1"
    dest.parent.mkdir(parents=True)
    run = proj.doit("deploy", "--to", f"ssh://board{dest}", "--ssh-config", str(config),
                    "--path", str(bundle), "--timeout", "30")
    assert same_tree(dest, bundle)


def test_every_board_script_passes_shellcheck_as_posix_sh():
    """The scripts deploy runs on the board, as built for a DIR with a space and a quote."""
    from hexbundle.deploy.board import Target
    target = Target("", "board", None, "/opt/my dir/bun'dle")
    scripts = []

    class Recording:
        timeout_s = 5.0

        def __init__(self):
            self.target = target

        def run(self, script, what, **_):
            scripts.append(script)
            return type("Answer", (), {"code": 0, "out": b"", "err": ""})()
    board = Recording()
    push_module._start(board)
    push_module._prepare(board, ["lib/a.so"], ["old/x"], {"lib/a.so": 0o644})
    push_module._swap(board, "0123456789abcdef")
    push_module._remove_run_dir(board, "/opt/.bundle.hexbundle/run-1")
    push_module._send(board, PUSH_SOURCE, "lib/a.so", lambda line: None)
    assert len(scripts) == 5
    for script in scripts:
        proc = subprocess.run(["shellcheck", "-s", "sh", "-e", "SC2317", "-"], input=script,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + script
