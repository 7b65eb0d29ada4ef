#!/usr/bin/env python3
"""Run one build step from its JSON spec (on the host, or inside the toolchain container)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the source tree, as mounted

from hexbundle.steps.runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
