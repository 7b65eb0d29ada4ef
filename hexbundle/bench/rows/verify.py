"""Row 10: `doit verify` of the built bundle (against the quantized reference and float): time
and peak RSS, beside the full build."""
from __future__ import annotations

from hexbundle.bench.common import GIB, Run

IDS, NEEDS_BUILD = (10,), True
# At full scale: what `doit verify` took before the quantized reference (docs/verify.md)
VERIFY_SECONDS_BEFORE, VERIFY_RSS_BEFORE = 240.0, 4.4 * (1 << 30)


def measure(bench, full) -> dict:
    """`doit verify` of the full build's bundle, in its own doit process (peak RSS from
    wait4)."""
    bench.log("doit verify on the built bundle ...")
    run = bench.doit("verify")
    return {"seconds": round(run.seconds, 2), "peak_rss_bytes": run.maxrss}


def table(verify: dict, bench, full) -> list:
    return [row_verify(verify, full, bench.small)]


def row_verify(verify: dict, full: Run, small: bool) -> dict:
    seconds, rss = verify["seconds"], verify["peak_rss_bytes"]
    met = None if small else (seconds <= VERIFY_SECONDS_BEFORE and rss <= VERIFY_RSS_BEFORE)
    return {"id": 10, "what": "`doit verify` (exact checks of every weight, encoding and graph; "
                              "every part vs two quantized references and float) vs the full "
                              "build",
            "ours": f"{seconds:.1f} s, peak RSS {rss / GIB:.2f} GiB",
            "baseline": f"{full.seconds:.1f} s", "ratio": f"{seconds / full.seconds:.2f}x",
            "target": "(reported)" if small else
            f"<= {VERIFY_SECONDS_BEFORE:.0f} s, <= {VERIFY_RSS_BEFORE / GIB:.1f} GiB (before)",
            "met": met, "detail": verify}
