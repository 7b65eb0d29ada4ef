#!/usr/bin/env python3
"""The benchmark: one table, every row measured side by side in the same run; also written to
build/bench/results.json. See hexbundle/bench/benchmark.py for what each row measures.

  python3 scripts/bench.py           full scale: qwen2.5-7b-shape (Qwen2.5-7B's tensors, 4 layers;
                                     ~8 GB of inputs, ~17 GB of disk while it runs, ~10 minutes)
  python3 scripts/bench.py --small   qwen2-tiny, seconds (what the tests run)
  --keep                             keep the tree in build/bench/ (the next run reuses its inputs)
  --out FILE                         write the results there instead
  --rows 9                           only these rows (comma-separated), and what they need
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hexbundle.bench.benchmark import main  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="qwen2-tiny instead of the 7B shape")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark tree afterwards")
    parser.add_argument("--out", type=Path, help="results file (default build/bench/results.json)")
    parser.add_argument("--rows", default="", help="only these rows, e.g. 9 or 1,5")
    args = parser.parse_args()
    sys.exit(main(ROOT, args.small, args.keep, args.out, args.rows))
