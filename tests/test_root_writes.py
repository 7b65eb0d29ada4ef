"""Privileged writes never follow a hard link (issue 40, kind 3, the file-handling part): what
hexbundle writes or chowns with root rights for the docker executor is a file it made itself.
Every such place: the hand-over of the build tree to the step user (chown), the digest cache's
hand-over, a step's log, the build lock. In process, as root (CI runs as root); a Docker engine
is not needed for any of them."""
import dataclasses
import os
import stat
import threading

import pytest

from hexbundle.config.build import load_build
from hexbundle.config.layout import Layout
from hexbundle.graph import lock as build_lock
from hexbundle.steps.docker_executor import hand_over
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import open_in_place
from conftest import copy_project

STEP_USER = "65534:65534"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="hexbundle's root-only paths")


@pytest.fixture
def layout(tmp_path):
    root = copy_project(tmp_path / "p", ("configs",)).root
    cfg = load_build(root)
    return Layout(dataclasses.replace(cfg, build_root=(tmp_path / "build").resolve()))


@pytest.fixture
def outside(tmp_path):
    """A setuid-root file outside the build root, as the issue's victim."""
    path = tmp_path / "outside" / "setuid-tool"
    path.parent.mkdir()
    path.write_bytes(b"the user's file\n")
    os.chmod(path, 0o4755)
    return path


def unchanged(path) -> None:
    st = os.stat(path)
    assert (st.st_uid, st.st_gid) == (0, 0)
    assert stat.S_IMODE(st.st_mode) == 0o4755
    assert path.read_bytes() == b"the user's file\n"


def plant_in_tree(layout, outside):
    target = layout.bin_dir / "qwen2_tiny_part_1_of_4.bin"
    target.parent.mkdir(parents=True)
    os.link(outside, target)


def plant_digests(layout, outside):
    layout.state_dir.mkdir(parents=True)
    os.link(outside, layout.digest_cache)


# every place a root run chowns: (id, plant a hard link to the outside file there)
CHOWNS = [("build-tree", plant_in_tree), ("digest-cache", plant_digests)]


@root_only
@pytest.mark.parametrize("plant", [c[1] for c in CHOWNS], ids=[c[0] for c in CHOWNS])
def test_the_hand_over_refuses_a_hard_link_to_a_file_elsewhere(layout, outside, plant):
    plant(layout, outside)
    with pytest.raises(HexbundleError, match="remove it"):
        hand_over(layout, STEP_USER)
    unchanged(outside)


@root_only
def test_the_hand_over_refuses_a_fifo_and_hands_over_the_bundles_own_links(layout):
    bins = layout.bin_dir / "a.bin"
    bins.parent.mkdir(parents=True)
    bins.write_bytes(b"bin")
    layout.bundle_dir.mkdir(parents=True)
    os.link(bins, layout.bundle_dir / "a.bin")    # hexbundle's own links: both in the tree
    hand_over(layout, STEP_USER)
    assert (os.stat(bins).st_uid, os.stat(bins).st_gid) == (65534, 65534)
    os.mkfifo(layout.bin_dir / "fifo")   # root's: the hand-over would chown it
    with pytest.raises(HexbundleError, match="not a regular file"):
        hand_over(layout, STEP_USER)


def hard_link_at(path, outside):
    path.parent.mkdir(parents=True, exist_ok=True)
    os.link(outside, path)


def fifo_at(path, outside):
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


# a step's log: whatever is at its path is replaced by a new file, never written through
@pytest.mark.parametrize("plant", [hard_link_at, fifo_at], ids=["hard-link", "fifo"])
def test_a_step_log_is_a_new_file_whatever_was_at_its_path(layout, outside, plant):
    log = layout.log("convert:prompt_1")
    plant(log, outside)
    done = threading.Event()

    def write():   # a FIFO would block the open: in a thread, so the test cannot hang
        with open_in_place(log) as fh:
            fh.write("the step's log\n")
        done.set()
    threading.Thread(target=write, daemon=True).start()
    assert done.wait(60), "opening the log blocked"
    assert log.read_text() == "the step's log\n" and os.stat(log).st_nlink == 1
    assert outside.read_bytes() == b"the user's file\n"


def test_the_build_lock_refuses_a_hard_link(layout, outside):
    hard_link_at(layout.lock, outside)
    with pytest.raises(HexbundleError, match="names"):
        build_lock.hold_lock(layout.lock, layout.root)
    assert outside.read_bytes() == b"the user's file\n"
