"""Row 3: after touching every input (same bytes), the first and second run, ours vs the stock
MD5 checker (the same dodo.py run with HEXBUNDLE_BENCH_CHECKER=md5 and DBs of its own)."""
from __future__ import annotations

import os
import time

from hexbundle.bench.common import BUILD_TASKS
from hexbundle.config.layout import MD5_DOIT_DB
from hexbundle.support.atomic import write_atomic
from hexbundle.support.files import read_state

IDS, NEEDS_BUILD = (3,), True


def measure(bench, full) -> dict:
    """The MD5 run's DBs (results' "md5_baseline"), then the touch."""
    return {"md5": prepare_md5_db(bench), "touch": touch_row(bench)}


def table(detail: dict, bench, full) -> list:
    return [row_touch(detail["touch"])]


def prepare_md5_db(bench) -> dict:
    """The MD5 run's own DBs, made up to date without rebuilding: copies of ours (for the
    tasks' saved option values; the variant's and the model's, graph.variants), then
    `doit reset-dep`, which MD5-hashes every dependency."""
    bench.log("MD5 baseline: recording its state (reset-dep) ...")
    for ours, md5 in ((bench.layout.doit_db(), bench.layout.doit_db(MD5_DOIT_DB)),
                      (bench.layout.model_db(), bench.layout.model_db(MD5_DOIT_DB))):
        try:   # never through a symbolic link (support.files.read_state)
            records = read_state(ours)
        except FileNotFoundError:   # a model whose inputs steps never ran has no DB of its own
            continue
        write_atomic(md5, records)
    reset = bench.doit("reset-dep", *BUILD_TASKS, md5=True, trace=True)
    noop = bench.doit("bundle", md5=True)
    bench.expect_no_work(noop, "no-op doit bundle with the MD5 checker")
    return {"reset_dep_seconds": round(reset.seconds, 2), "files_hashed": len(reset.hashed),
            "noop_seconds": round(noop.seconds, 3)}


def touch_row(bench) -> dict:
    files = bench.input_files()
    bench.log(f"touching {len(files)} inputs (same bytes), then two runs each checker ...")
    now = time.time_ns()
    for path in files:
        os.utime(path, ns=(now, now))
    runs = {}
    for name, md5 in (("ours_1", False), ("ours_2", False), ("md5_1", True), ("md5_2", True)):
        run = bench.doit("bundle", md5=md5, trace=True)
        bench.expect_no_work(run, f"doit bundle after a touch ({name})")
        runs[name] = {"seconds": round(run.seconds, 3), "files_hashed": len(run.hashed),
                      "bytes_hashed": run.hashed_bytes()}
    return {"files_touched": len(files), **runs}


def row_touch(touch) -> dict:
    return {"id": 3, "what": "after touching every input: run 1 / run 2 (ours vs MD5 checker)",
            "ours": f"{touch['ours_1']['seconds']:.2f} s / {touch['ours_2']['seconds']:.2f} s "
                    f"(hashed {touch['ours_1']['files_hashed']} / "
                    f"{touch['ours_2']['files_hashed']} files)",
            "baseline": f"{touch['md5_1']['seconds']:.2f} s / {touch['md5_2']['seconds']:.2f} s "
                        f"(hashed {touch['md5_1']['files_hashed']} / "
                        f"{touch['md5_2']['files_hashed']} files)",
            "ratio": f"{touch['md5_2']['seconds'] / touch['ours_2']['seconds']:.1f}x on run 2",
            "target": "run 2 hashes nothing", "met": touch["ours_2"]["files_hashed"] == 0,
            "detail": touch}
