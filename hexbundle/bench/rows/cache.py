"""Row 9: a cache-hit build through a REAPI remote cache (a local BuildGrid) vs the full
build."""
from __future__ import annotations

import re
from typing import Optional
import shutil

from hexbundle.bench.common import GIB, BenchError, Run

IDS, NEEDS_BUILD = (9,), True


def measure(bench, full: Run) -> dict:
    """A local BuildGrid (disk storage in the bench tree): one build uploads every convert and
    compile step; then, outputs removed, the cache-hit build fetches them all. Compared
    with the full build (same tree, same inputs, `-n 1`)."""
    from hexbundle.remote.buildgrid import BuildGrid, BuildGridError, find_bgd
    if not find_bgd():
        bench.log("cache row: no BuildGrid `bgd` (HEXBUNDLE_BGD): skipped")
        return {"skipped": "no BuildGrid `bgd` (set HEXBUNDLE_BGD)"}
    try:
        server = BuildGrid.start(bench.build_root / "buildgrid")
    except BuildGridError as exc:
        raise BenchError(str(exc)) from None
    try:
        url = f"remote_cache={server.url}"
        bench.log("cache row: a build that uploads every step ...")
        bench.remove_outputs()
        upload = bench.doit("-n", "1", "bundle", url)
        if _cache_hits(upload):
            raise BenchError("the uploading build found its steps in an empty cache")
        cas_bytes = sum(p.stat().st_size for p in server.blobs())
        bench.log("cache row: outputs removed, the cache-hit build ...")
        bench.remove_outputs()
        hit = bench.doit("-n", "1", "bundle", url)
        steps = {t for t in hit.executed if t.split(":")[0] in ("convert", "compile")}
        if _cache_hits(hit) != steps or not steps or set(hit.step_seconds) != {"bundle"}:
            raise BenchError(f"the cache-hit build ran {sorted(hit.step_seconds)} here and "
                             f"fetched {sorted(_cache_hits(hit))}; expected every convert "
                             "and compile step from the cache")
    finally:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)
    fetched = sum(p.stat().st_size for p in bench.layout.dlc_dir.iterdir()) + \
        sum(bench.layout.bin(p).stat().st_size for p in bench.parts)
    return {"hit_seconds": round(hit.seconds, 2), "full_seconds": round(full.seconds, 2),
            "upload_build_seconds": round(upload.seconds, 2),
            "ratio": round(full.seconds / hit.seconds, 2), "steps_fetched": len(steps),
            "fetched_bytes": fetched, "cas_bytes": cas_bytes,
            "hit_peak_rss_bytes": hit.maxrss, "server": "BuildGrid (local, disk storage)"}


def table(cache: dict, bench, full) -> list:
    return cache_rows(cache)


def _cache_hits(run: Run) -> set:
    return set(re.findall(r"^  cache hit (\S+) ", run.out, re.M))


def cache_rows(cache: Optional[dict]) -> list:
    if cache is None:
        return []
    what = "cache-hit build (local BuildGrid REAPI cache) vs full build, outputs removed"
    if "skipped" in cache:
        return [{"id": 9, "what": what, "ours": "-", "baseline": "-",
                 "ratio": f"skipped: {cache['skipped']}", "target": "(reported)", "met": None,
                 "detail": cache}]
    return [{"id": 9, "what": what,
             "ours": f"{cache['hit_seconds']:.1f} s ({cache['steps_fetched']} steps, "
                     f"{cache['fetched_bytes'] / GIB:.2f} GiB fetched)",
             "baseline": f"{cache['full_seconds']:.1f} s",
             "ratio": f"{cache['ratio']:.2f}x faster", "target": "(reported)", "met": None,
             "detail": cache}]
