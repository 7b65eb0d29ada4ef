"""Row 1: file digests on the same multi-GB input files, the project's XXH3-128 checker vs
doit's MD5Checker."""
from __future__ import annotations

import time

from hexbundle.bench.common import GIB, MIN_DIGEST_BYTES
from hexbundle.support import hashing

IDS, NEEDS_BUILD = (1,), False


def measure(bench, full) -> dict:
    """Both checkers on the same files, warm page cache (a warm-up pass first). Small
    inputs are hashed several times over, so that at least MIN_DIGEST_BYTES are timed."""
    from hexbundle.graph.checker import stock_checker
    files = bench.distinct_data_files()
    size = sum(p.stat().st_size for p in files)
    passes = max(1, -(-MIN_DIGEST_BYTES // max(size, 1)))
    bench.log(f"digests: {len(files)} files, {size / GIB:.2f} GiB (x{passes}), XXH3-128 vs MD5 ...")
    for path in files:       # warm-up: both timed passes read from the page cache
        hashing.file_digest(path)
    started = time.monotonic()
    for path in files * passes:
        hashing.file_digest(path)
    ours = max(time.monotonic() - started, 1e-9)
    checker = stock_checker()()
    started = time.monotonic()
    for path in files * passes:
        checker.get_state(str(path), None)
    stock = max(time.monotonic() - started, 1e-9)
    total = size * passes
    return {"files": len(files), "bytes": total, "passes": passes, "ours_seconds": round(ours, 6),
            "stock_seconds": round(stock, 6), "ours_gib_per_s": round(total / GIB / ours, 2),
            "stock_gib_per_s": round(total / GIB / stock, 2), "ratio": round(stock / ours, 1)}


def table(digests: dict, bench, full) -> list:
    return [row_digests(digests)]


def row_digests(digests) -> dict:
    return {"id": 1, "what": "file digests, same files (XXH3-128 checker vs doit MD5Checker)",
            "ours": f"{digests['ours_gib_per_s']} GiB/s",
            "baseline": f"{digests['stock_gib_per_s']} GiB/s",
            "ratio": f"{digests['ratio']}x", "target": ">= 10x", "met": digests["ratio"] >= 10,
            "detail": digests}
