"""Row 12: a full build with `remote_executor` on 2 workers (`-n 2`: two Actions in flight) vs
the local `-n 1` full build (issue 37: goal >= 1.8x).

The grid (hexbundle/remote/grid.py: a private PostgreSQL, BuildGrid on its SQL scheduler, two
scripts/reapi_worker.py processes) is started fresh in the bench tree for this row: a worker's
lease, the scheduler's jobs and the server's ActionCache never carry over between runs, so no
step is answered from a cache. The server and workers are started before the clock starts (a
build farm is up before a build); the build runs with `remote_fallback=fail`, so a step the grid
cannot run fails the row instead of being built here unnoticed. Its bundle must be
byte-identical to the local build's: a fast wrong build is no result.

What the ratio means here: the workers run on this machine, so they share its cores with the
client (doit, which uploads inputs and fetches outputs) and with BuildGrid. On the bench's
2-core machine that is 2 workers on the same 2 cores `-n 2` already uses (row 6), plus the
gRPC transfers of every input and output through BuildGrid's CAS; it measures the overhead of
going through REAPI, not what 2 separate worker machines would give. So the row also splits an
action's time (per_action, a mean): the step's own work, the rest of the worker's time (input
root, interpreter start and imports, upload) and the rest of the client's (upload, queue, lease,
fetch and checks).
"""
from __future__ import annotations

import os
import re
import shutil
import time
from collections import Counter
from pathlib import Path

from hexbundle.bench.common import BenchError, Run
from hexbundle.support.errors import DiskSpaceError
from hexbundle.formats.manifest import read_build_info

IDS, NEEDS_BUILD = (12,), True
WORKERS = ("w1", "w2")
GOAL = 1.8
WHAT = ("full build on 2 REAPI workers (local BuildGrid, their plain-subprocess runner, `-n 2`) "
        "vs local `-n 1`")
SHARED_CORES = "the workers share this machine's cores with the client"


def measure(bench, full: Run) -> dict:
    skipped = skip_reason(bench)
    if skipped:
        bench.log(f"remote execution row: {skipped}: skipped")
        return {"skipped": skipped}
    # The local `-n 1` build's bundle, still in place: this row is measured first (ROWS)
    local = bundle_digests(bench.layout.bundle_dir)
    remote, events, grid_seconds = build_on_grid(bench)
    per_worker = steps_per_worker(events)
    steps = check_remote_build(bench, remote, per_worker)
    cost = per_action(bench, remote, events)
    identical = check_identical(local, bundle_digests(bench.layout.bundle_dir))
    ratio = round(full.seconds / remote.seconds, 2)   # the verdict is the shown ratio's
    return {"remote_seconds": round(remote.seconds, 2), "local_n1_seconds": round(full.seconds, 2),
            "ratio": ratio, "goal": GOAL, "met": ratio >= GOAL,
            "steps_remote": steps, "steps_per_worker": per_worker,
            "worker_busy_seconds": busy_seconds(events), "per_action": cost,
            "bundle_byte_identical": identical, "grid_start_seconds": round(grid_seconds, 2),
            "remote_peak_rss_bytes": remote.maxrss, "cores": os.cpu_count(),
            "note": SHARED_CORES}


def skip_reason(bench) -> str:
    from hexbundle.remote.buildgrid import find_bgd
    from hexbundle.remote.postgres import find_pg_bin
    missing = _missing_grid(find_bgd(), find_pg_bin(), bench.cfg.executor)
    if missing:
        return missing
    try:
        check_grid_disk(bench)
    except DiskSpaceError as exc:   # the other rows are still measured
        return str(exc)
    return ""


def build_on_grid(bench) -> tuple:
    """(the remote build's Run, the workers' log lines, seconds the grid took to start): a fresh
    grid in the bench tree, its 2 workers, then the full build on them; the grid is stopped
    (and, unless --keep, deleted) whatever happens."""
    from hexbundle.remote.buildgrid import BuildGridError
    from hexbundle.remote.grid import ExecGrid
    bench.log("remote execution row: a fresh grid (PostgreSQL, BuildGrid, 2 workers) ...")
    started = time.monotonic()
    workdir = bench.build_root / "exec-grid"
    try:
        grid = ExecGrid.start(workdir)
    except BuildGridError as exc:
        raise BenchError(f"remote execution row: {exc}") from None
    try:
        for bot in WORKERS:
            grid.add_worker(bot, *worker_properties(bench.layout))
        grid_seconds = time.monotonic() - started
        bench.log("remote execution row: full build, doit -n 2 on the 2 workers ...")
        bench.remove_outputs()
        remote = bench.doit("-n", "2", "bundle", f"remote_executor={grid.url}",
                            "remote_fallback=fail")
        return remote, grid.events(), grid_seconds
    except BuildGridError as exc:
        raise BenchError(f"remote execution row: {exc}") from None
    finally:
        grid.stop()
        if not bench.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _missing_grid(bgd, pg_bin, executor: str) -> str:
    if executor != "local":   # the bench's workers run steps in their Python, not an image
        return f"executor = {executor}: the bench's workers offer executor = local only"
    if not bgd:
        return "no BuildGrid `bgd` (set HEXBUNDLE_BGD)"
    if not pg_bin:
        return "no PostgreSQL (initdb): install postgresql or set HEXBUNDLE_PG_BIN"
    return ""


def check_grid_disk(bench) -> None:
    """Refuse before the grid is started when the disk cannot take what it writes: the server's
    CAS keeps every input and output (the local build's, in place now: the same bytes), and
    each worker's action root (one at a time, deleted after it) at most the largest action's
    inputs and outputs (a convert: a graph's .data and its DLC; a compile: a part's DLCs and
    its bin)."""
    from hexbundle.inputs.generate import check_disk
    data = [p.stat().st_size for p in bench.distinct_data_files()]
    dlcs = [p.stat().st_size for p in bench.layout.dlc_dir.iterdir()]
    bins = [bench.layout.bin(p).stat().st_size for p in bench.parts]
    inputs = sum(p.stat().st_size for p in bench.input_files() if p.suffix != ".data")
    cas = inputs + sum(data) + sum(dlcs) + sum(bins)
    action = max(max(data) + max(dlcs), 2 * max(dlcs) + max(bins))
    check_disk(bench.build_root, cas + len(WORKERS) * action,
               "the remote execution row's grid (its CAS and the workers' action roots)")


def worker_properties(layout) -> list:
    """--property arguments: the platform this client's local-executor Actions ask for (python,
    numpy, onnx versions; OSFamily and ISA the worker always offers)."""
    from hexbundle.remote.action import platform_properties
    return [arg for name, value in platform_properties(layout)
            if name not in ("OSFamily", "ISA") for arg in ("--property", f"{name}={value}")]


def steps_per_worker(events: list) -> dict:
    """bot -> actions it finished with exit code 0, from the workers' own logs."""
    done = Counter(e["bot"] for e in events if e["event"] == "done" and e.get("exit_code") == 0)
    return {bot: done.get(bot, 0) for bot in WORKERS}


def busy_seconds(events: list) -> dict:
    """bot -> seconds it spent on actions (each from its start to its done event: fetching the
    input root, running the step, uploading the outputs), from the workers' own logs."""
    started, busy = {}, Counter()
    for e in events:
        if e["event"] == "start":
            started[(e["bot"], e["lease"])] = e["t"]
        elif e["event"] == "done" and (e["bot"], e["lease"]) in started:
            busy[e["bot"]] += e["t"] - started.pop((e["bot"], e["lease"]))
    return {bot: round(busy.get(bot, 0.0), 2) for bot in WORKERS}


def check_remote_build(bench, run: Run, per_worker: dict) -> int:
    """Every convert and compile step this build ran came from a worker (build-info.json's
    origins), as many as the workers finished; the bundle step ran here."""
    built = {t.split(":")[0] for t in run.executed}
    if not {"convert", "compile", "bundle"} <= built:
        raise BenchError(f"the remote build did not rebuild everything: {run.executed}")
    origins = read_build_info(bench.layout.build_info).get("steps", {})
    ran = {t for t in run.executed if t.split(":")[0] in ("convert", "compile")}
    local = sorted(t for t in ran if origins.get(t, {}).get("origin") != "remote-execution")
    if local:
        raise BenchError(f"the remote build ran {', '.join(local)} elsewhere than on a worker")
    if sum(per_worker.values()) != len(ran):
        raise BenchError(f"the workers finished {per_worker} actions, the build ran "
                         f"{len(ran)} steps remotely")
    return len(ran)


# The step runner's last line (steps/runner.run), in the worker's stdout the step's log keeps
# (remote/executed._write_log); and the client's line for each step done remotely.
STEP_DONE = re.compile(r"^done in ([0-9.]+)s$", re.M)
CLIENT_DONE = re.compile(r"^  remote (\S+) ([0-9.]+)s: ", re.M)


def per_action(bench, run: Run, events: list) -> dict:
    """What an action costs beside its step's work, per action (mean): `work` is the step's own
    time (its runner's "done in" line: after the interpreter started and imported the step's
    modules); `on_worker` the rest of the worker's busy time (start to done event: the input
    root fetched, the interpreter started, its imports, the outputs uploaded); `around` the rest
    of the client's time for the step (its "remote <task> X s" line: the upload, the queue, the
    scheduler's lease and its report, the outputs fetched and checked)."""
    client = {task: float(s) for task, s in CLIENT_DONE.findall(run.out)}
    if not client:
        raise BenchError("the remote build printed no `remote <task> X s` line")
    work = 0.0
    for task in client:
        try:
            done = STEP_DONE.findall(bench.layout.log(task).read_text(errors="replace"))
        except OSError as exc:
            raise BenchError(f"the log of {task}, executed remotely, cannot be read ({exc})") \
                from None
        if not done:
            raise BenchError(f"the log of {task}, executed remotely, has no `done in` line of "
                             f"the step runner: {bench.layout.log(task)}")
        work += float(done[-1])
    busy = sum(busy_seconds(events).values())
    n = len(client)
    return {"actions": n, "work": round(work / n, 2), "on_worker": round((busy - work) / n, 2),
            "around": round((sum(client.values()) - busy) / n, 2)}


def bundle_digests(bundle_dir: Path) -> dict:
    """relative path -> XXH3-128 of every file in the bundle."""
    from hexbundle.support.hashing import file_digest
    return {str(p.relative_to(bundle_dir)): file_digest(p)
            for p in sorted(bundle_dir.rglob("*")) if p.is_file()}


def check_identical(local: dict, remote: dict) -> bool:
    if not local:
        raise BenchError("no bundle of the local full build to compare the remote one with")
    if remote != local:
        differ = sorted(k for k in set(local) | set(remote) if local.get(k) != remote.get(k))
        raise BenchError("the remote build's bundle differs from the local `-n 1` build's: "
                         + ", ".join(differ))
    return True


def table(measured: dict, bench, full) -> list:
    if "skipped" in measured:
        return [{"id": 12, "what": WHAT, "ours": "-", "baseline": "-",
                 "ratio": f"skipped: {measured['skipped']}", "target": f">= {GOAL}x",
                 "met": None, "detail": measured}]
    workers = ", ".join(f"{bot} {n}" for bot, n in measured["steps_per_worker"].items())
    cost = measured["per_action"]
    return [{"id": 12, "what": f"{WHAT}; {SHARED_CORES} ({measured['cores']})",
             "ours": f"{measured['remote_seconds']:.1f} s ({measured['steps_remote']} steps: "
                     f"{workers}; bundle byte-identical; per action {cost['work']:.1f} s of "
                     f"work, {cost['on_worker']:.1f} s more on the worker, "
                     f"{cost['around']:.1f} s around it)",
             "baseline": f"{measured['local_n1_seconds']:.1f} s",
             "ratio": f"{measured['ratio']:.2f}x faster", "target": f">= {GOAL}x",
             "met": measured["met"], "detail": measured}]
