"""A context binary's QAIRT release, read as check_bundle reads it (formats/qairt_version.
read_bin_release): from a QNN context binary's metadata only, so a multi-GB bin costs what a
small one does. The bins are Qualcomm's own (tests/data/qualcomm/, QAIRT 2.51.0's compiler);
the large one is such a bin with its payload grown, sparse, to 3 GiB. Bytes read are the
kernel's count for this process (/proc/self/io rchar), not an estimate."""
from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from conftest import ROOT
from hexbundle.formats.qairt_version import read_bin_release, read_file_release
from hexbundle.formats.qnn_context import HEADER_SIZE, parse_header

DATA = ROOT / "tests" / "data" / "qualcomm"
BINS = sorted(p.name for p in DATA.glob("*_qnn.bin"))
LARGE = 3 << 30                       # payload bytes added: a bin of a real LLM part's size
OTHER_BUILD = b"v2.45.40.260406130939"  # another release's build string, planted in the payload

IO = Path("/proc/self/io")
# CI runs on Linux: there a missing /proc/self/io fails the tests rather than skipping them
pytestmark = pytest.mark.skipif(not IO.is_file() and not os.environ.get("CI"),
                                reason="needs Linux's /proc/self/io")


def bytes_read(call) -> tuple:
    """(what call() returned, the bytes this process read while it ran, per the kernel)."""
    before = IO.read_text()
    result = call()
    after = IO.read_text()
    rchar = [int(dict(line.split(": ") for line in text.splitlines())["rchar"])
             for text in (before, after)]
    # the second reading counts the first one's own bytes
    return result, rchar[1] - rchar[0] - len(before.encode())


def header(path: Path):
    with open(path, "rb") as fh:
        return parse_header(fh.read(HEADER_SIZE), path.stat().st_size, str(path))


def grown(src: Path, dest: Path, more: int) -> Path:
    """`src` with `more` payload bytes (zeros, sparse: no disk is written for them), the
    header's payload size to match, and OTHER_BUILD near the end of the payload."""
    shutil.copyfile(src, dest)
    size = src.stat().st_size + more
    with open(dest, "r+b") as fh:
        fh.seek(HEADER_SIZE - 8)
        fh.write(struct.pack("<Q", header(src).payload_size + more))
        fh.truncate(size)
        fh.seek(size - 4096)
        fh.write(OTHER_BUILD)
    assert dest.stat().st_size == size
    return dest


@pytest.mark.parametrize("name", BINS)
def test_a_real_bins_metadata_states_the_release_its_whole_bytes_do(name):
    path = DATA / name
    metadata, whole = read_bin_release(path), read_file_release(path)
    assert [b.text for b in metadata.builds] == [b.text for b in whole.builds]
    assert metadata.release and metadata.release.version == (2, 51, 0)


def test_a_multi_gb_bin_is_read_no_more_than_a_small_one(tmp_path):
    small = DATA / "mlp_int8_prompt_qnn.bin"
    large = grown(small, tmp_path / "large_qnn.bin", LARGE)
    assert header(large).payload_size == header(small).payload_size + LARGE   # sizes add up
    small_release, small_read = bytes_read(lambda: read_bin_release(small))
    large_release, large_read = bytes_read(lambda: read_bin_release(large))
    assert large_read == small_read < small.stat().st_size       # exactly: header and metadata
    assert large_release == small_release
    # the payload was not read: the build string planted there is not among what was found
    assert OTHER_BUILD.decode() not in [b.text for b in large_release.builds]


def test_reading_a_grown_bin_whole_does_see_its_payload(tmp_path):
    """The other direction: the whole-file reader (runtime files, and bins whose metadata state
    nothing) reads every byte, in bounded pieces, and finds the planted string (64 MiB here:
    scanning the 3 GiB one whole took 158 s here, 2 cores shared with another test run)."""
    large = grown(DATA / "mlp_int8_prompt_qnn.bin", tmp_path / "large_qnn.bin", 64 << 20)
    found, read = bytes_read(lambda: read_file_release(large))
    assert read >= large.stat().st_size
    assert OTHER_BUILD.decode() in [b.text for b in found.builds]
    assert found.problem().startswith("states more than one QAIRT release")


def test_a_bin_whose_metadata_states_nothing_is_read_whole(tmp_path):
    """Not every release need put it in the metadata: then the payload is read after all."""
    src = DATA / "mlp_int8_prompt_qnn.bin"
    blank = tmp_path / "blank_meta_qnn.bin"
    data = bytearray(src.read_bytes())
    end = HEADER_SIZE + header(src).metadata_size
    build = read_bin_release(src).builds[0].text.encode()
    data[:end] = data[:end].replace(build, b"x" * len(build))
    blank.write_bytes(bytes(data))
    assert read_file_release(blank, end).stated == ()                # the metadata say nothing
    assert [b.text for b in read_bin_release(blank).builds] == [build.decode()]   # the payload


def test_a_file_that_is_not_a_qnn_context_binary_is_read_whole(tmp_path):
    other = tmp_path / "standin.bin"
    other.write_bytes(b"{}" + b" " * (5 << 20) + b"v2.45.40.260406130939")  # past one piece
    assert [b.text for b in read_bin_release(other).builds] == ["v2.45.40.260406130939"]
