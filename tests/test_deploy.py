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
        (top / "authorized_keys").write_text(client_pub + "\n")
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
        Path("/run/sshd").mkdir(exist_ok=True)      # sshd's privilege separation directory
        config = top / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {top / 'host_key'}\n"
            f"PidFile {top / 'sshd.pid'}\nAuthorizedKeysFile {top / 'authorized_keys'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nUsePAM no\nStrictModes no\n"
            "PermitRootLogin prohibit-password\n"
            f"SetEnv PATH={self.fakebin}:/usr/local/bin:/usr/bin:/bin "
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
    assert re.search(rf"  {target.name}: [0-9.]+ MiB of 9\.[0-9] MiB, [0-9.]+ [KMG]?i?B/s, "
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
