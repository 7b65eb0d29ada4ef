"""The benchmark behind scripts/bench.py and `doit bench`: one table, every row measured side by
side in the same run, on the same tree, written to build/bench/results.json.

Rows (the issue's list; targets are reported, never asserted):
1. file digests on the same multi-GB input files: the project's XXH3-128 vs doit's MD5Checker;
2. start-up: `doit list` vs `python -m doit --version` (doit alone), and a no-op `doit bundle`
   on the up-to-date tree vs `doit list`;
3. after touching every input (same bytes): first and second run, ours vs the stock MD5
   checker (the same dodo.py run with HEXBUNDLE_BENCH_CHECKER=md5 and a DB of its own);
4. one part's weights changed: rebuild vs full build;
5. the reference backend on the part with the most layers: GB/s and peak RSS (subprocesses);
6. a full build with `doit -n 2` vs `-n 1`;
7, 8. the local split of an unsplit graph vs `cp`; `import_export` vs `doit list`;
9. a cache-hit build through a REAPI remote cache (a local BuildGrid) vs the full build;
10. `doit verify` of the built bundle (against the quantized reference and float): time and
    peak RSS, beside the full build;
11. `import_export` of a Qwen3-8B-shaped qai-hub-models quantize checkpoint (every layer; its
    model.data past 2 GiB, as aimet-onnx writes it): wall time and peak RSS (goal <= 3 GiB).
12. a full build on 2 REAPI workers (a fresh local BuildGrid on PostgreSQL, `-n 2`) vs the
    local `-n 1` build (goal >= 1.8x); its bundle must be byte-identical. The workers run on
    this machine, sharing its cores with the client.
13. Qualcomm's simulator on the part with the most layers (issue 48): the part's two graphs
    through the ortqnn convert, then what `doit verify backend=ortqnn` runs for it, through
    verify's own code (checks/simulated.py, backends/ortqnn_sim.py): its bin recompiled, each
    graph's own unshared bin compiled, 2 prompt chunks and 4 token runs on the simulator, beside
    onnxruntime CPU on the same QDQ graphs and the same inputs (ratios per chunk, per step, of
    peak RSS; the outputs' largest difference in LSB). A whole verify of the part on the
    simulator is extrapolated from those figures and labelled so. Measured at full scale
    (`python3 scripts/bench.py --rows 13`, load 2-4; docs/perf-notes.md "Qualcomm's simulator
    on the 7B-shaped part"): a chunk 200.8 s vs 4.44 s (45.2x), a step 44.6 s vs 2.76 s
    (16.1x), own bins 58.6 s, peak RSS 0.90 vs 1.38 GiB (the compiles 3.97 GiB); a verify of
    the part ~45 min, extrapolated; the row 15 min. Needs the ortqnn kit (wine64, mingw-w64,
    the wheels: docs/backends.md); without it the row says skipped, under CI=true it fails.

Each row (or pair of rows) is a unit of its own in hexbundle/bench/rows/ (its measurement and its
table line); rows/__init__.py lists them, and this module is the runner: the tree, the inputs and
the full build the rows share, the results file and the table.

`--rows 9` (or `--rows 1,5`) measures only those rows (and what they need: the inputs, and the
full build for rows 2, 3, 4, 6, 9, 10 and 12; row 13 needs the inputs and its part's ortqnn
converts only).

Full scale uses qwen2.5-7b-shape (Qwen2.5-7B's tensors, 4 layers, ~8 GB of inputs); --small
uses qwen2-tiny (seconds; the tests run it). The tree lives in build/bench/<tree>/ (its own
build root, hence its own doit DB and lock) and is deleted afterwards unless --keep.
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from hexbundle.bench.common import (FULL_MODEL, GIB, MIB, RESULTS_FORMAT, SEED_3_LAYER_PART_MIB,
                                    SMALL_MODEL, TRACE_ENV, BenchError, Run, run_measured)
from hexbundle.bench.rows import ALL_ROWS, NEEDS_BUILD, ROWS, parallel, touch
from hexbundle.config.build import load_build
from hexbundle.config.layout import BUILD_ROOT_ENV, Layout, ProjectLayout
from hexbundle.support import table as tables
from hexbundle.support.atomic import atomic_output
from hexbundle.support.errors import HexbundleError


def parse_rows(text: str) -> tuple:
    """`--rows 1,5,9` -> (1, 5, 9); empty: every row."""
    if not text:
        return ALL_ROWS
    try:
        rows = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        rows = ()
    if not rows or not set(rows) <= set(ALL_ROWS):
        raise BenchError(f"--rows {text!r}: expected row numbers among "
                         f"{', '.join(map(str, ALL_ROWS))}, comma-separated")
    return rows


class Bench:
    def __init__(self, root: Path, small: bool, keep: bool, log: Callable[[str], None] = print,
                 rows: tuple = ALL_ROWS):
        self.root = Path(root).resolve()
        self.small = small
        self.keep = keep
        self.log = log
        self.rows = set(rows)
        self.model_name = SMALL_MODEL if small else FULL_MODEL
        self.build_root = ProjectLayout(self.root).bench_tree(small)
        os.environ[BUILD_ROOT_ENV] = str(self.build_root)   # this process's Layout, and children's
        self.cfg = load_build(self.root, {"model": self.model_name})
        self.layout = Layout(self.cfg)
        self.parts = self.cfg.plan.parts()
        # The part the backend row and the one-part change use: the most decoder layers (for the
        # 7B shape, the 3-layer part: the seeds' 11-split part 2).
        self.part = max((p for p in self.parts if not (p.has_embedding or p.has_head)),
                        key=lambda p: len(p.layers), default=self.parts[-1])
        self._trace_dir = Path(tempfile.mkdtemp(prefix="hexbundle-bench-"))
        self._traces = 0

    # ------------------------------------------------------------------ helpers

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in (TRACE_ENV, "HEXBUNDLE_BENCH_CHECKER")}
        return {**env, BUILD_ROOT_ENV: str(self.build_root), **extra}

    def doit(self, *args, md5: bool = False, trace: bool = False, check: bool = True) -> Run:
        extra = {"HEXBUNDLE_BENCH_CHECKER": "md5"} if md5 else {}
        trace_path = None
        if trace:
            self._traces += 1
            trace_path = self._trace_dir / f"trace-{self._traces}.txt"
            extra[TRACE_ENV] = str(trace_path)
        cmd = [sys.executable, "-m", "doit", *args, f"model={self.model_name}"]
        seconds, code, out, err, maxrss = run_measured(cmd, self.root, self.env(**extra))
        hashed = trace_path.read_text().split() if trace_path and trace_path.exists() else []
        run = Run(tuple(args), seconds, code, out, err, maxrss, hashed)
        if check and code != 0:
            raise BenchError(f"`doit {' '.join(args)} model={self.model_name}` exited {code}:\n"
                             + "\n".join((out + err).splitlines()[-30:]))
        return run

    def expect_no_work(self, run: Run, what: str) -> None:
        if run.executed:
            raise BenchError(f"{what}: expected every task up to date, but doit ran "
                             f"{', '.join(run.executed)}")

    def input_files(self) -> list:
        return self.layout.all_inputs()

    def distinct_data_files(self) -> list:
        """The inputs' .data files, one name per inode (a part's graphs share one file)."""
        seen, out = set(), []
        for path in self.input_files():
            if path.suffix == ".data":
                st = path.stat()
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    out.append(path)
        return out

    def remove_outputs(self) -> None:
        for d in (self.layout.dlc_dir, self.layout.bin_dir, self.layout.bundle_dir):
            shutil.rmtree(d, ignore_errors=True)

    # ------------------------------------------------------------------ steps

    def check_disk(self) -> None:
        """Refuse before anything is written: inputs, DLCs, bins and the backend row's scratch."""
        from hexbundle.checks import sizes
        from hexbundle.inputs import generate
        model = self.cfg.model
        inputs = sum(generate.part_disk_bytes(model, p)
                     for p in generate.missing_parts(model, self.parts, self.layout.inputs_dir))
        dlcs = sum(2 * sizes.part_bytes(model, p, packed=False) for p in self.parts)
        bins = sum(sizes.part_bytes(model, p) for p in self.parts)
        scratch = 2 * sizes.part_bytes(model, self.part, packed=False) + sizes.part_bytes(model, self.part)
        if 13 in self.rows:   # the simulator row: 2 QDQ models, the recompile, 2 own bins
            scratch += 5 * sizes.part_bytes(model, self.part)
        generate.check_disk(self.build_root, inputs + dlcs + bins + scratch,
                          f"the {self.model_name} benchmark tree (inputs, DLCs, bins)")

    def generate_inputs(self) -> dict:
        self.log(f"generating the inputs of {self.model_name} (skipped if up to date) ...")
        run = self.doit("inputs")
        files = self.input_files()
        return {"files": len(files), "bytes": sum(p.stat().st_size for p in files),
                "distinct_bytes": sum(p.stat().st_size for p in self.distinct_data_files()),
                "generate_seconds": round(run.seconds, 2), "generated": bool(run.executed)}

    def full_build(self, jobs: int) -> Run:
        self.log(f"full build, doit -n {jobs} ...")
        self.remove_outputs()
        run = self.doit("-n", str(jobs), "bundle")
        built = {t.split(":")[0] for t in run.executed}
        if not {"convert", "compile", "bundle"} <= built:
            raise BenchError(f"full build -n {jobs} did not rebuild everything: {run.executed}")
        return run

    def check_sizes(self) -> dict:
        run = self.doit("check_sizes", check=False)
        size = self.layout.bin(self.part).stat().st_size
        row = {"passed": run.code == 0, "table": run.out.strip().splitlines()[-(len(self.parts) + 3):],
               "part": self.part.index, "part_layers": len(self.part.layers),
               "part_bin_mib": round(size / MIB, 2)}
        if len(self.part.layers) == 3 and self.cfg.model.architecture.hidden_size == 3584:
            row["seed_mib"] = SEED_3_LAYER_PART_MIB
            row["ratio_to_seed"] = round(size / MIB / SEED_3_LAYER_PART_MIB, 4)
        if run.code != 0:
            raise BenchError("check_sizes failed on the benchmark tree:\n" + run.out + run.err)
        return row

    def bundle_facts(self) -> dict:
        bins = [self.layout.bundle_dir / self.layout.bin_name(p) for p in self.parts]
        return {"bins_bytes": sum(b.stat().st_size for b in bins),
                "bins_hard_linked": all(b.stat().st_nlink >= 2 for b in bins)}

    # ------------------------------------------------------------------ the whole run

    def run(self) -> dict:
        started, load_before = time.monotonic(), _load_average()
        self.check_disk()
        full_1 = sizes_row = bundle = None
        measured = {}   # row unit -> what it measured
        try:
            inputs = self.generate_inputs()
            if self.rows & NEEDS_BUILD:
                full_1 = self.full_build(1)
                sizes_row = self.check_sizes()
                bundle = self.bundle_facts()
            for unit in ROWS:   # in ROWS' order: the rows that change inputs come last
                if self.rows & set(unit.IDS):
                    measured[unit] = unit.measure(self, full_1)
        finally:
            shutil.rmtree(self._trace_dir, ignore_errors=True)
            if not self.keep:
                shutil.rmtree(self.build_root, ignore_errors=True)
        full_2 = measured.get(parallel)
        table = [r for unit, detail in measured.items() for r in unit.table(detail, self, full_1)]
        results = {
            "format": RESULTS_FORMAT,
            "mode": "small" if self.small else "full",
            "machine": {**machine(), "load_average_before": load_before,
                        "load_average_after": _load_average()},
            "model": self.model_name, "plan": self.cfg.plan.name, "parts": len(self.parts),
            "inputs": inputs,
            "rows_measured": sorted(self.rows),
            "full_build": None if full_1 is None else {
                "n1_seconds": round(full_1.seconds, 2),
                "n2_seconds": round(full_2.seconds, 2) if full_2 else None,
                "n1_peak_rss_bytes": full_1.maxrss,
                "n2_peak_rss_bytes": full_2.maxrss if full_2 else None,
                "bundle_step_seconds": full_1.step_seconds.get("bundle"),
                "n1_step_seconds": full_1.step_seconds, **bundle},
            "sizes": sizes_row,
            "md5_baseline": measured[touch]["md5"] if touch in measured else None,
            "rows": sorted((r for r in table if r["id"] in self.rows), key=lambda r: r["id"]),
            "bench_seconds": round(time.monotonic() - started, 1),
        }
        return results


def _load_average() -> Optional[list]:
    """1/5/15-minute load: other work on the machine skews every figure, so it is recorded."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def format_table(results: dict) -> str:
    head = ("#", "measured", "hexbundle", "baseline", "ratio", "target", "met")
    body = [(str(r["id"]), r["what"], r["ours"], r["baseline"], r["ratio"], r["target"],
             {True: "yes", False: "NO", None: "-"}[r["met"]]) for r in results["rows"]]
    lines = tables.table(head, body, markdown=True)
    m, s, f = results["machine"], results["sizes"], results["full_build"]
    notes = [f"machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, {m['os']}, "
             f"Python {m['python']}, doit {m['doit']}, numpy {m['numpy']}; load average "
             f"{m['load_average_before']} before, {m['load_average_after']} after",
             f"model: {results['model']} (plan {results['plan']}, {results['parts']} parts); inputs "
             f"{results['inputs']['bytes'] / GIB:.2f} GiB in {results['inputs']['files']} files "
             f"({results['inputs']['distinct_bytes'] / GIB:.2f} GiB of distinct .data)"]
    if f:   # not measured by a --rows run that needs no full build
        notes.append(
            f"full build -n 1: {f['n1_seconds']} s, peak RSS {f['n1_peak_rss_bytes'] / GIB:.2f} GiB "
            f"(the whole build runs in the doit process); bundle step {f['bundle_step_seconds']} s "
            f"for {f['bins_bytes'] / GIB:.2f} GiB of bins, hard-linked: "
            f"{'yes' if f['bins_hard_linked'] else 'NO'}")
    if s:
        notes.append(f"part {s['part']} ({s['part_layers']} layers): {s['part_bin_mib']} MiB"
                     + (f" vs {s['seed_mib']} MiB measured with QAIRT: ratio {s['ratio_to_seed']}"
                        if "seed_mib" in s else "")
                     + f"; check_sizes {'passed' if s['passed'] else 'FAILED'}")
    if results.get("rows_measured", list(ALL_ROWS)) != list(ALL_ROWS):
        notes.append(f"rows measured: {', '.join(map(str, results['rows_measured']))} (--rows)")
    return "\n".join(lines + [""] + notes)


def machine() -> dict:
    from importlib.metadata import version

    import numpy
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = 0
    try:
        ram = int(re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text()).group(1)) * 1024
    except (OSError, AttributeError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(ram / GIB, 1),
            "os": platform.platform(), "python": platform.python_version(),
            "doit": version("doit"), "numpy": numpy.__version__}


def write_results(results: dict, path: Path) -> Path:
    with atomic_output(path, "w", perms=None) as fh:
        fh.write(json.dumps(results, indent=2, default=str) + "\n")
    return path


def main(root: Path, small: bool, keep: bool, out: Optional[Path] = None, rows: str = "") -> int:
    try:
        bench = Bench(root, small, keep, rows=parse_rows(rows))
        results = bench.run()
    except HexbundleError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    path = write_results(results, Path(out) if out else ProjectLayout(root).bench_results)
    print(format_table(results))
    print(f"\nwritten: {path}")
    return 0


def run_bench(root: Path, small: bool = False, keep: bool = False, rows: str = ""):
    """`doit bench`: the benchmark in its own process (it runs doit itself)."""
    cmd = [sys.executable, str(ProjectLayout(root).script("bench.py"))]
    cmd += ["--small"] if small else []
    cmd += ["--keep"] if keep else []
    cmd += [f"--rows={rows}"] if rows else []   # one argument: a value is never an option
    code = subprocess.call(cmd, cwd=root, env={k: v for k, v in os.environ.items() if k != BUILD_ROOT_ENV})
    if code != 0:
        raise BenchError(f"scripts/bench.py exited {code}")
