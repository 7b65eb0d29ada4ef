"""Qualcomm's own QAIRT runtime files for the tests (issue 49): the onnxruntime-qnn wheels pinned
by hash in requirements/qairt-runtime.txt, their v73 runtime files kept by
scripts/fetch_qairt_runtime.py (.ci/run runs it) in a cache dir named after the pins.

  LINUX_2_45   onnxruntime-qnn 2.1.0 manylinux_2_34_aarch64: QAIRT 2.45.40 for a Linux board
  WIN_2_45     onnxruntime-qnn 2.1.0 win_arm64: QAIRT 2.45.40 for a Windows board, with the
               skel's signing catalog
  WIN_2_51     onnxruntime-qnn 2.7.0 win_arm64: QAIRT 2.51.0 (the version mixes)

Found through HEXBUNDLE_QAIRT_WHEELS, else where the fetch script puts them by default. Missing:
the tests skip, saying how to fetch them, except under CI=true, where they fail.
"""
from __future__ import annotations

import os
import runpy
import shutil
from pathlib import Path

import pytest

from hexbundle.config.runtime_files import runtime_files

ROOT = Path(__file__).resolve().parent.parent
FETCH = ROOT / "scripts" / "fetch_qairt_runtime.py"
REQUIREMENTS = ROOT / "requirements" / "qairt-runtime.txt"

LINUX_2_45 = "onnxruntime_qnn-2.1.0-cp312-cp312-manylinux_2_34_aarch64"
WIN_2_45 = "onnxruntime_qnn-2.1.0-cp312-cp312-win_arm64"
WIN_2_51 = "onnxruntime_qnn-2.7.0-cp312-cp312-win_arm64"

# what the files say (read from them once by hand: strings, and the wheels' own versions)
BUILD_2_45 = "v2.45.40.260406130939"
BUILD_2_51 = "v2.51.0.260929181845"
SDK_2_45 = "2.45.40.260406"       # the SDK folder / sdk.yaml name of that release
GENIE_API_2_45 = "1.17.0"


def default_dir() -> Path:
    """Where scripts/fetch_qairt_runtime.py keeps them by default (its own cache_dir())."""
    fetch = runpy.run_path(str(FETCH))
    return fetch["cache_dir"](REQUIREMENTS, Path.home() / ".cache" / "hexbundle")


def wheels_dir() -> Path:
    """The fetched files' directory, or a skip (a failure under CI=true) saying how to get them."""
    where = os.environ.get("HEXBUNDLE_QAIRT_WHEELS")
    path = Path(where) if where else default_dir()
    marker = path / "hexbundle-requirements.txt"
    if marker.is_file() and marker.read_bytes() == REQUIREMENTS.read_bytes():
        return path
    reason = (f"Qualcomm's QAIRT runtime files are not at {path}: run `python3 "
              f"scripts/fetch_qairt_runtime.py` (downloads the wheels pinned in "
              f"requirements/qairt-runtime.txt, 184 MiB; .ci/run does)")
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so the real-runtime tests must run, but: {reason}")
    pytest.skip(reason)


def wheel_file(wheels: Path, wheel: str, name: str) -> Path:
    path = wheels / wheel / name
    assert path.is_file(), f"{path}: not fetched (scripts/fetch_qairt_runtime.py keeps it)"
    return path


def install_real(sdk: Path, wheels: Path, target: str, wheel: str,
                 only: tuple = ()) -> None:
    """The target's v73 runtime files in the SDK root replaced by the wheel's (all, or the
    roles in `only`); the optional HtpPrepare (not kept from the wheels) removed, and
    genie-t2t-run (in no wheel) left as the stand-in built it."""
    for f in runtime_files(target, "v73"):
        dest = sdk / f.sdk_path
        if f.role == "libQnnHtpPrepare":
            if not only:
                dest.unlink(missing_ok=True)
            continue
        if f.role == "genie-t2t-run" or (only and f.role not in only):
            continue
        shutil.copyfile(wheel_file(wheels, wheel, dest.name), dest)


def as_release(sdk: Path, version: str, genie_api: str) -> None:
    """The stand-in SDK's sdk.yaml and Genie header saying another release."""
    (sdk / "sdk.yaml").write_text(f"name: qairt-standin\nversion: {version}\n")
    major, minor, patch = genie_api.split(".")
    header = sdk / "include" / "Genie" / "GenieCommon.h"
    header.write_text(f"#define GENIE_API_VERSION_MAJOR {major}\n"
                      f"#define GENIE_API_VERSION_MINOR {minor}\n"
                      f"#define GENIE_API_VERSION_PATCH {patch}\n")

