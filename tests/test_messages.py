"""Messages that point at the right thing (issue 40, kind 9): each error names the file and the
operation that failed. End to end through `doit` where the failure is the run's; the .data read
while a DLC is written in-process (as root, which the tests may be, a file cannot be made
unreadable: the read error is raised by the reader the writer streams from)."""
import errno
import os

import pytest

from hexbundle.formats.container import ContainerWriter
from hexbundle.support.errors import HexbundleError, output_error
from conftest import copy_project

LONG = "m" * 100_000


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("messages") / "proj")


# (id, environment, command-line settings, what the message must name)
RUNS = [
    ("build-root-proc", {"HEXBUNDLE_BUILD_ROOT": "/proc"}, [],
     ["/proc/.hexbundle", "cannot create or write", "HEXBUNDLE_BUILD_ROOT"]),
    ("build-root-under-a-file", {"HEXBUNDLE_BUILD_ROOT": "{file}/b"}, [],
     ["{file}/b/.hexbundle", "cannot create or write", "Not a directory"]),
    ("hash-trace-proc-version", {"HEXBUNDLE_HASH_TRACE": "/proc/version"}, [],
     ["HEXBUNDLE_HASH_TRACE=/proc/version", "cannot append"]),
    ("hash-trace-in-a-missing-dir", {"HEXBUNDLE_HASH_TRACE": "{file}.d/x/trace"}, [],
     ["HEXBUNDLE_HASH_TRACE={file}.d/x/trace", "cannot append"]),
    ("model-100KB", {}, [f"model={LONG}"], ["key 'model'", "characters"]),
]


@pytest.mark.parametrize("env, args, named", [r[1:] for r in RUNS], ids=[r[0] for r in RUNS])
def test_a_run_that_cannot_start_names_the_file_and_the_operation(proj, tmp_path, env, args,
                                                                   named):
    a_file = tmp_path / "a-file"
    a_file.write_text("x\n")
    fill = lambda text: text.replace("{file}", str(a_file))
    run = proj.doit("bundle", *args, env={k: fill(v) for k, v in env.items()}, check=False)
    assert run.code != 0
    assert "Traceback" not in run.out + run.err
    for part in named:
        assert fill(part) in run.err
    assert len(run.err) < 2000


def test_an_unreadable_input_streamed_into_an_output_is_a_read_error_of_the_input(tmp_path):
    data = tmp_path / "exports" / "part_1_of_4.data"
    dlc = tmp_path / "dlc" / "prompt.dlc"
    dlc.parent.mkdir()

    def chunks():
        yield b"\0" * 64
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(data))

    with pytest.raises(HexbundleError) as caught:
        with ContainerWriter(dlc, b"HEXDLC\0\0") as writer:
            writer.add_blob("w", chunks())
    message = str(caught.value)
    assert message.startswith(f"{data}: cannot read it (Permission denied)")
    assert "free disk space" not in message and "ulimit" not in message
    assert os.listdir(dlc.parent) == [], "the temp file was left"


@pytest.mark.parametrize("failed, kind", [
    ("{out}", "cannot write"), ("{dir}/.prompt.dlc.123.0123456789ab.tmp", "cannot write"),
    ("{dir}", "cannot write"), ("/elsewhere/part.data", "cannot read"),
])
def test_output_error_names_the_file_that_failed(tmp_path, failed, kind):
    out = tmp_path / "prompt.dlc"
    failed = failed.replace("{out}", str(out)).replace("{dir}", str(tmp_path))
    message = str(output_error(out, OSError(errno.EACCES, "Permission denied", failed)))
    assert kind in message
    assert message.startswith(str(out) if kind == "cannot write" else failed)
