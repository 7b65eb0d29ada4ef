"""Row 6: a full build with `doit -n 2` vs `-n 1`."""
from __future__ import annotations

IDS, NEEDS_BUILD = (6,), True


def measure(bench, full):
    """The second full build (results' "full_build" n2 figures)."""
    return bench.full_build(2)


def table(full_2, bench, full) -> list:
    return [row_parallel(full, full_2)]


def row_parallel(full_1, full_2) -> dict:
    n1, n2 = full_1.seconds, full_2.seconds
    return {"id": 6, "what": "full build `doit -n 2` vs `-n 1`",
            "ours": f"{n2:.1f} s", "baseline": f"{n1:.1f} s", "ratio": f"{n1 / n2:.2f}x faster",
            "target": "(reported)", "met": None,
            "detail": {"n1_seconds": round(n1, 2), "n2_seconds": round(n2, 2),
                       "n1_peak_rss_bytes": full_1.maxrss, "n2_peak_rss_bytes": full_2.maxrss}}
