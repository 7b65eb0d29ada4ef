#!/usr/bin/env python3
"""Run one build step from its JSON spec (on the host, or inside the toolchain container)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree, as mounted

try:
    from hexbundle.steps.runner import main  # noqa: E402
except ImportError as exc:   # a module the toolchain image installs is missing: another image,
    # or a remote worker's interpreter without hexbundle's requirements. On stderr: a failed
    # remote action's message shows the tail of the worker's stderr.
    print(f"error: this is not the toolchain image: hexbundle's step runner cannot import "
          f"{exc.name or exc} in {sys.executable} ({exc}). Run `doit image` to build it (it "
          "installs requirements/container.lock), and check configs/toolchain.toml [image] tag; "
          "on a remote worker, set remote_python to an interpreter that has them",
          file=sys.stderr, flush=True)
    sys.exit(3)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
