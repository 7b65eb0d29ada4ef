"""Row 2: start-up, `doit list` vs `python -m doit --version` (doit alone), and a no-op
`doit bundle` on the up-to-date tree vs `doit list`."""
from __future__ import annotations

import statistics
import sys

from hexbundle.bench.common import NOOP_REPEATS, run_measured

IDS, NEEDS_BUILD = (2,), True


def measure(bench, full) -> dict:
    """Start-up, interleaved so a noisy moment hits all alike: `python -m doit --version`
    (doit alone, no dodo.py), `doit list` (dodo.py loaded: the config and the task graph) and
    a no-op `doit bundle` (every up-to-date check)."""
    bench.log(f"--version vs doit list vs no-op doit bundle, {NOOP_REPEATS} runs each ...")
    versions, noops, lists, hashed = [], [], [], 0
    for _ in range(NOOP_REPEATS):
        versions.append(run_measured([sys.executable, "-m", "doit", "--version"], bench.root,
                                     bench.env())[0])
        lists.append(bench.doit("list").seconds)
        run = bench.doit("bundle", trace=True)
        bench.expect_no_work(run, "no-op doit bundle")
        noops.append(run.seconds)
        hashed += len(run.hashed)
    version = statistics.median(versions)
    noop, bare = statistics.median(noops), statistics.median(lists)
    return {"noop_seconds": round(noop, 3), "list_seconds": round(bare, 3),
            "version_seconds": round(version, 3), "ratio": round(noop / bare, 2),
            "list_ratio": round(bare / version, 2), "files_hashed": hashed,
            "noop_all": [round(s, 3) for s in noops], "list_all": [round(s, 3) for s in lists],
            "version_all": [round(s, 3) for s in versions]}


def table(noop: dict, bench, full) -> list:
    return [row_noop(noop)]


def row_noop(noop) -> dict:
    return {"id": 2, "what": "start-up (median): `doit list` vs `python -m doit --version`; "
                             "no-op `doit bundle` vs `doit list`",
            "ours": f"list {noop['list_seconds']:.2f} s; no-op {noop['noop_seconds']:.2f} s",
            "baseline": f"--version {noop['version_seconds']:.2f} s; list "
                        f"{noop['list_seconds']:.2f} s",
            "ratio": f"{noop['list_ratio']}x; {noop['ratio']}x", "target": "<= 1.5x; <= 1.1x",
            "met": noop["list_ratio"] <= 1.5 and noop["ratio"] <= 1.1, "detail": noop}
