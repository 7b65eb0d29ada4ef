#!/usr/bin/env python3
"""Write Qwen2.5-7B-shaped stand-in inputs: the real tensor shapes, names, graph I/O and AIMET
encodings layout, random weights from a fixed seed, streamed to disk tensor by tensor.

  python3 scripts/gen_7b_inputs.py                     every part of plan six (~30 GB) into
                                                       exports/qwen2.5-7b-instruct/ (the config's
                                                       inputs.dir), so `doit bundle
                                                       model=qwen2.5-7b-instruct` builds it
  python3 scripts/gen_7b_inputs.py --plan eleven --part 2 --out /tmp/p2
                                                       one 3-layer part (~2.8 GB)
Free disk space is checked first; too little is refused, saying how much is needed.
"""
import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hexbundle.inputs import generate  # noqa: E402
from hexbundle.support.errors import HexbundleError  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-7b-instruct", help="a configs/models name")
    parser.add_argument("--plan", default="", help="a plan of the model (default: its default_plan)")
    parser.add_argument("--part", type=int, action="append", default=[],
                        help="only this part (1-based; repeatable); default: every part")
    parser.add_argument("--out", type=Path, help="output directory (default: where the model "
                        "config expects its inputs)")
    parser.add_argument("--seed", type=int, help="random seed (default: the config's inputs.seed)")
    parser.add_argument("--no-tokenizer", action="store_true", help="do not write tokenizer.json")
    args = parser.parse_args()
    try:
        started = time.monotonic()
        paths = generate.generate_for_config(ROOT, args.model, args.plan, args.part, args.out,
                                           args.seed, not args.no_tokenizer, print)
    except HexbundleError as exc:
        print(f"gen_7b_inputs: {exc}", file=sys.stderr)
        return 1
    total = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} files, {total / 2**30:.2f} GiB (hard links counted twice) in "
          f"{time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
