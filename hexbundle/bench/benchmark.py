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
    peak RSS, beside the full build.

`--rows 9` (or `--rows 1,5`) measures only those rows (and what they need: the inputs, and the
full build for rows 2, 3, 4, 6, 9 and 10).

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
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from hexbundle.config.build import load_build
from hexbundle.config.layout import BUILD_ROOT_ENV, MD5_DOIT_DB, Layout, ProjectLayout, dlc_name
from hexbundle.config.model import Part
from hexbundle.support import hashing
from hexbundle.support import table as tables
from hexbundle.support.atomic import atomic_output, write_atomic
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import read_state

FULL_MODEL = "qwen2.5-7b-shape"
SMALL_MODEL = "qwen2-tiny"
# The seeds' measured context binary of a 3-layer Qwen2.5-7B part (11-split part 2, QAIRT 2.42
# Python API, weights_packing=True).
SEED_3_LAYER_PART_MIB = 337.3
RESULTS_FORMAT = 1
NOOP_REPEATS = 5
CHANGED_BYTES = 1 << 20     # bytes of one weight negated to "change a part's weights"
MIN_DIGEST_BYTES = 256 << 20   # the digest row times at least this much hashing
TRACE_ENV = hashing.TRACE_ENV
BUILD_TASKS = ("inputs", "convert", "compile", "bundle")   # what `doit bundle` runs
MIB, GIB = 1 << 20, 1 << 30


class BenchError(HexbundleError):
    """A benchmark step failed (a doit run exited non-zero, or did work it should not have)."""


# --------------------------------------------------------------------------- the MD5 baseline


# --------------------------------------------------------------------------- running doit


@dataclass
class Run:
    """One doit invocation: wall time, peak RSS, what it ran, what it hashed."""

    args: tuple
    seconds: float
    code: int
    out: str
    err: str
    maxrss: int                      # bytes, of the doit process (steps run in it)
    hashed: list = field(default_factory=list)

    @property
    def executed(self) -> list:
        return re.findall(r"^\.  (\S+)$", self.out, re.M)

    @property
    def step_seconds(self) -> dict:
        """task -> seconds, from the executor's "ok <task> [...] 1.2s" lines."""
        # not the checks of a hit's downloads (`<task>:cache-check`): no step of the build ran
        return {t: float(s) for t, s in re.findall(r"^\s+ok (\S+) \[[^\]]*\] ([\d.]+)s",
                                                   self.out, re.M)
                if not t.endswith(":cache-check")}

    def hashed_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.hashed if os.path.exists(p))


def run_measured(cmd: list, cwd: Path, env: dict) -> tuple:
    """(seconds, exit code, stdout, stderr, peak RSS bytes) of a child process (wait4 rusage)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return seconds, proc.returncode, out.read(), err.read(), usage.ru_maxrss * 1024


ALL_ROWS = tuple(range(1, 11))
# Row 10 at full scale: what `doit verify` took before the quantized reference (docs/verify.md)
VERIFY_SECONDS_BEFORE, VERIFY_RSS_BEFORE = 240.0, 4.4 * (1 << 30)


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

    def backend_row(self) -> dict:
        """Convert both graphs and compile the part, each in its own process (peak RSS from
        wait4), writing to a scratch directory so the build tree stays untouched."""
        self.log(f"reference backend on {self.part.tag} ({len(self.part.layers)} layers) ...")
        scratch = self.layout.bench_scratch
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        steps = []
        try:
            for graph in self.cfg.model.graphs(self.part):
                steps.append(self._backend_step({"step": "convert", "graph": graph.slot}, scratch))
            steps.append(self._backend_step({"step": "compile"}, scratch))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        weights = sum(s["read_bytes"] for s in steps if s["step"] == "convert")
        seconds = sum(s["seconds"] for s in steps)
        largest = max(w.numel * 4 for w in _part_weights(self.cfg, self.part))
        return {"part": self.part.index, "layers": len(self.part.layers), "steps": steps,
                "fp32_weight_bytes": weights, "seconds": round(seconds, 2),
                "gb_per_s": round(weights / max(seconds, 1e-9) / 1e9, 3),
                "peak_rss_bytes": max(s["maxrss"] for s in steps),
                "largest_tensor_bytes": largest}

    def _backend_step(self, step: dict, scratch: Path) -> dict:
        spec = {**step, "root": str(self.root), "model": self.model_name,
                "part": self.part.index, "scratch": str(scratch)}
        cmd = [sys.executable, "-c", "import json, sys; from hexbundle.bench.benchmark import backend_step; "
               "print(json.dumps(backend_step(json.loads(sys.argv[1]))))", json.dumps(spec)]
        wall, code, out, err, maxrss = run_measured(cmd, self.root, self.env())
        if code != 0:
            raise BenchError(f"backend step {step} failed (exit {code}):\n{out}{err}")
        result = json.loads(out.strip().splitlines()[-1])
        return {**result, "wall_seconds": round(wall, 2), "maxrss": maxrss}

    def verify_row(self) -> dict:
        """`doit verify` of the full build's bundle, in its own doit process (peak RSS from
        wait4)."""
        self.log("doit verify on the built bundle ...")
        run = self.doit("verify")
        return {"seconds": round(run.seconds, 2), "peak_rss_bytes": run.maxrss}

    def digest_row(self) -> dict:
        """Both checkers on the same files, warm page cache (a warm-up pass first). Small
        inputs are hashed several times over, so that at least MIN_DIGEST_BYTES are timed."""
        from hexbundle.graph.checker import stock_checker
        files = self.distinct_data_files()
        size = sum(p.stat().st_size for p in files)
        passes = max(1, -(-MIN_DIGEST_BYTES // max(size, 1)))
        self.log(f"digests: {len(files)} files, {size / GIB:.2f} GiB (x{passes}), XXH3-128 vs MD5 ...")
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

    def noop_row(self) -> dict:
        """Start-up, interleaved so a noisy moment hits all alike: `python -m doit --version`
        (doit alone, no dodo.py), `doit list` (dodo.py loaded: the config and the task graph) and
        a no-op `doit bundle` (every up-to-date check)."""
        self.log(f"--version vs doit list vs no-op doit bundle, {NOOP_REPEATS} runs each ...")
        versions, noops, lists, hashed = [], [], [], 0
        for _ in range(NOOP_REPEATS):
            versions.append(run_measured([sys.executable, "-m", "doit", "--version"], self.root,
                                         self.env())[0])
            lists.append(self.doit("list").seconds)
            run = self.doit("bundle", trace=True)
            self.expect_no_work(run, "no-op doit bundle")
            noops.append(run.seconds)
            hashed += len(run.hashed)
        version = statistics.median(versions)
        noop, bare = statistics.median(noops), statistics.median(lists)
        return {"noop_seconds": round(noop, 3), "list_seconds": round(bare, 3),
                "version_seconds": round(version, 3), "ratio": round(noop / bare, 2),
                "list_ratio": round(bare / version, 2), "files_hashed": hashed,
                "noop_all": [round(s, 3) for s in noops], "list_all": [round(s, 3) for s in lists],
                "version_all": [round(s, 3) for s in versions]}

    def prepare_md5_db(self) -> dict:
        """The MD5 run's own DBs, made up to date without rebuilding: copies of ours (for the
        tasks' saved option values; the variant's and the model's, graph.variants), then
        `doit reset-dep`, which MD5-hashes every dependency."""
        self.log("MD5 baseline: recording its state (reset-dep) ...")
        for ours, md5 in ((self.layout.doit_db(), self.layout.doit_db(MD5_DOIT_DB)),
                          (self.layout.model_db(), self.layout.model_db(MD5_DOIT_DB))):
            try:   # never through a symbolic link (support.files.read_state)
                records = read_state(ours)
            except FileNotFoundError:   # a model whose inputs steps never ran has no DB of its own
                continue
            write_atomic(md5, records)
        reset = self.doit("reset-dep", *BUILD_TASKS, md5=True, trace=True)
        noop = self.doit("bundle", md5=True)
        self.expect_no_work(noop, "no-op doit bundle with the MD5 checker")
        return {"reset_dep_seconds": round(reset.seconds, 2), "files_hashed": len(reset.hashed),
                "noop_seconds": round(noop.seconds, 3)}

    def touch_row(self) -> dict:
        files = self.input_files()
        self.log(f"touching {len(files)} inputs (same bytes), then two runs each checker ...")
        now = time.time_ns()
        for path in files:
            os.utime(path, ns=(now, now))
        runs = {}
        for name, md5 in (("ours_1", False), ("ours_2", False), ("md5_1", True), ("md5_2", True)):
            run = self.doit("bundle", md5=md5, trace=True)
            self.expect_no_work(run, f"doit bundle after a touch ({name})")
            runs[name] = {"seconds": round(run.seconds, 3), "files_hashed": len(run.hashed),
                          "bytes_hashed": run.hashed_bytes()}
        return {"files_touched": len(files), **runs}

    def one_part_row(self, full: Run) -> dict:
        """Negate the first MiB of one weight of the part (its .data is shared by both graphs,
        per-channel |max| unchanged so the encodings still fit), rebuild; undo, rebuild."""
        from hexbundle.formats.weightdata import negate_in_place
        name, offset, nbytes = self._first_matmul_weight()
        paths = [p for p in self.layout.part_inputs(self.part) if p.suffix == ".data"]
        self.log(f"changing {name} of {self.part.tag}, rebuilding (and back) ...")
        runs = []
        for _ in range(2):
            for path in paths:
                negate_in_place(path, offset, min(nbytes, CHANGED_BYTES))
            run = self.doit("bundle")
            runs.append(run)
        expected = {f"convert:{self.part.tag}_{g.slot}" for g in self.cfg.model.graphs(self.part)}
        expected |= {f"compile:{self.part.tag}", "bundle"}
        for run in runs:
            if set(run.executed) != expected:
                raise BenchError(f"after changing {name}, doit ran {sorted(run.executed)}; "
                                 f"expected {sorted(expected)}")
        seconds = statistics.mean(r.seconds for r in runs)
        bundle_step = statistics.mean(r.step_seconds.get("bundle", 0.0) for r in runs)
        budget = full.seconds / len(self.parts) + bundle_step
        return {"weight": name, "part": self.part.index, "runs_seconds": [round(r.seconds, 2) for r in runs],
                "seconds": round(seconds, 2), "full_seconds": round(full.seconds, 2),
                "ratio": round(seconds / full.seconds, 3), "parts": len(self.parts),
                "bundle_step_seconds": round(bundle_step, 2), "budget_seconds": round(budget, 2)}

    def _first_matmul_weight(self) -> tuple:
        from hexbundle.formats.weightdata import plan_layout
        weights = _part_weights(self.cfg, self.part)
        layout = plan_layout({w.name: w.shape for w in weights})
        name = next(w.name for w in weights if w.bitwidth == self.cfg.model.quantization.decoder_linear_bitwidth
                    and w.channels > 1)
        return (name, *layout[name])

    def split_row(self) -> dict:
        """hexbundle's local split of an unsplit graph vs `cp` of its weights, side by side on the
        same files (both read from the page cache the generator left them in)."""
        from hexbundle.inputs import generate
        model = split_model(self.cfg.model, self.small)
        whole = Part(1, 1, tuple(range(model.architecture.num_layers)), True, True)
        unsplit_dir = self.build_root / "split-bench" / "unsplit"
        self.log(f"split: writing an unsplit {model.architecture.num_layers}-layer "
                 f"{self.model_name}-shaped graph ...")
        generate.generate_part(model, whole, unsplit_dir, 0)
        data = next(unsplit_dir.glob("*.data"))
        copy = unsplit_dir.parent / "cp.data"
        cp_seconds, code, _, err, cp_rss = run_measured(["cp", str(data), str(copy)],
                                                        self.root, self.env())
        copy.unlink(missing_ok=True)
        if code:
            raise BenchError(f"cp {data} failed: {err.strip()}")
        out_dir = unsplit_dir.parent / "parts"
        spec = {"layers": model.architecture.num_layers, "small": self.small, "root": str(self.root),
                "model": self.model_name, "unsplit": str(unsplit_dir), "out": str(out_dir)}
        self.log(f"split: {data.stat().st_size / GIB:.2f} GiB of weights into "
                 f"{len(SPLIT_PLAN)} parts vs cp ...")
        seconds, code, out, err, rss = run_measured(
            [sys.executable, "-c", "import json, sys; from hexbundle.bench.benchmark import "
             "split_step; split_step(json.loads(sys.argv[1]))", json.dumps(spec)],
            self.root, self.env())
        if code:
            raise BenchError(f"the split failed: {err.strip()[-2000:]}")
        written = sum(p.stat().st_size for p in out_dir.glob("*.data"))
        largest = max(w.numel * 4 for w in _all_weights(model))
        tree = self.import_row(model, out_dir)
        weights = data.stat().st_size
        shutil.rmtree(unsplit_dir.parent, ignore_errors=True)
        return {"weights_bytes": weights, "written_bytes": written,
                "split_seconds": round(seconds, 3), "cp_seconds": round(cp_seconds, 4),
                "ratio": round(seconds / max(cp_seconds, 1e-6), 2), "peak_rss_bytes": rss,
                "cp_peak_rss_bytes": cp_rss, "largest_tensor_bytes": largest,
                "layers": model.architecture.num_layers, "plan": list(SPLIT_PLAN), **tree}

    def import_row(self, model, parts_dir: Path) -> dict:
        """`import_export` of a qai-hub-models 0.55-style tree of those parts (links to them:
        the import reads structure and encodings, never weights) vs `doit list` start-up."""
        tree = parts_dir.parent / "tree"
        link_as_tree(model, parts_dir, tree)
        project = parts_dir.parent / "project"
        (project / "configs" / "models").mkdir(parents=True, exist_ok=True)
        code = ("import sys; from pathlib import Path; from hexbundle.inputs.import_export "
                "import import_export; import_export(Path(sys.argv[1]), sys.argv[2], 'bench')")
        seconds, rc, out, err, rss = run_measured(
            [sys.executable, "-c", code, str(project), str(tree)], self.root, self.env())
        if rc:
            raise BenchError(f"import_export failed: {(out + err).strip()[-2000:]}")
        lists = [self.doit("list").seconds for _ in range(3)]
        return {"import_seconds": round(seconds, 2), "import_peak_rss_bytes": rss,
                "list_seconds": round(statistics.median(lists), 3)}

    def cache_row(self, full: Run) -> dict:
        """A local BuildGrid (disk storage in the bench tree): one build uploads every convert and
        compile step; then, outputs removed, the cache-hit build fetches them all. Compared
        with the full build (same tree, same inputs, `-n 1`)."""
        from hexbundle.remote.buildgrid import BuildGrid, BuildGridError, find_bgd
        if not find_bgd():
            self.log("cache row: no BuildGrid `bgd` (HEXBUNDLE_BGD): skipped")
            return {"skipped": "no BuildGrid `bgd` (set HEXBUNDLE_BGD)"}
        try:
            server = BuildGrid.start(self.build_root / "buildgrid")
        except BuildGridError as exc:
            raise BenchError(str(exc)) from None
        try:
            url = f"remote_cache={server.url}"
            self.log("cache row: a build that uploads every step ...")
            self.remove_outputs()
            upload = self.doit("-n", "1", "bundle", url)
            if _cache_hits(upload):
                raise BenchError("the uploading build found its steps in an empty cache")
            cas_bytes = sum(p.stat().st_size for p in server.blobs())
            self.log("cache row: outputs removed, the cache-hit build ...")
            self.remove_outputs()
            hit = self.doit("-n", "1", "bundle", url)
            steps = {t for t in hit.executed if t.split(":")[0] in ("convert", "compile")}
            if _cache_hits(hit) != steps or not steps or set(hit.step_seconds) != {"bundle"}:
                raise BenchError(f"the cache-hit build ran {sorted(hit.step_seconds)} here and "
                                 f"fetched {sorted(_cache_hits(hit))}; expected every convert "
                                 "and compile step from the cache")
        finally:
            server.stop()
            shutil.rmtree(server.workdir, ignore_errors=True)
        fetched = sum(p.stat().st_size for p in self.layout.dlc_dir.iterdir()) + \
            sum(self.layout.bin(p).stat().st_size for p in self.parts)
        return {"hit_seconds": round(hit.seconds, 2), "full_seconds": round(full.seconds, 2),
                "upload_build_seconds": round(upload.seconds, 2),
                "ratio": round(full.seconds / hit.seconds, 2), "steps_fetched": len(steps),
                "fetched_bytes": fetched, "cas_bytes": cas_bytes,
                "hit_peak_rss_bytes": hit.maxrss, "server": "BuildGrid (local, disk storage)"}

    def bundle_facts(self) -> dict:
        bins = [self.layout.bundle_dir / self.layout.bin_name(p) for p in self.parts]
        return {"bins_bytes": sum(b.stat().st_size for b in bins),
                "bins_hard_linked": all(b.stat().st_nlink >= 2 for b in bins)}

    # ------------------------------------------------------------------ the whole run

    def run(self) -> dict:
        started, load_before = time.monotonic(), _load_average()
        self.check_disk()
        want = self.rows.__contains__
        full_1 = full_2 = None
        sizes_row = bundle = backend = digests = noop = md5_db = touch = change = split = None
        cache = verify = None
        try:
            inputs = self.generate_inputs()
            if self.rows & {2, 3, 4, 6, 9, 10}:
                full_1 = self.full_build(1)
                sizes_row = self.check_sizes()
                bundle = self.bundle_facts()
            if want(6):
                full_2 = self.full_build(2)
            if want(9):   # before the rows that change inputs: the tree is the full build's
                cache = self.cache_row(full_1)
            if want(10):
                verify = self.verify_row()
            if want(5):
                backend = self.backend_row()
            if want(1):
                digests = self.digest_row()
            if want(2):
                noop = self.noop_row()
            if want(3):
                md5_db = self.prepare_md5_db()
                touch = self.touch_row()
            if want(4):
                change = self.one_part_row(full_1)
            if want(7) or want(8):
                split = self.split_row()
        finally:
            shutil.rmtree(self._trace_dir, ignore_errors=True)
            if not self.keep:
                shutil.rmtree(self.build_root, ignore_errors=True)
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
            "md5_baseline": md5_db,
            "rows": [r for r in rows(digests, noop, touch, change, backend, full_1, full_2)
                     + (split_rows(split) if split else []) + cache_rows(cache)
                     + ([row_verify(verify, full_1, self.small)] if verify else [])
                     if r["id"] in self.rows],
            "bench_seconds": round(time.monotonic() - started, 1),
        }
        return results


def _load_average() -> Optional[list]:
    """1/5/15-minute load: other work on the machine skews every figure, so it is recorded."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _part_weights(cfg, part) -> list:
    from hexbundle.config.model import part_weights
    return part_weights(cfg.model.architecture, cfg.model.quantization, part)


# --------------------------------------------------------------------------- subprocess worker


def backend_step(spec: dict) -> dict:
    """Run in a fresh process by Bench.backend_row: one convert or compile of the part, outputs
    in the scratch directory. Returns its own timing (interpreter start-up excluded)."""
    from hexbundle.backends import get_backend
    from hexbundle.steps.options import compile_options, convert_options
    cfg = load_build(Path(spec["root"]), {"model": spec["model"]})
    layout = Layout(cfg)
    part = cfg.plan.parts()[spec["part"] - 1]
    graphs = cfg.model.graphs(part)
    scratch = Path(spec["scratch"])
    backend = get_backend("reference")
    started = time.monotonic()
    if spec["step"] == "convert":
        graph = next(g for g in graphs if g.slot == spec["graph"])
        out = scratch / dlc_name(graph)
        backend.convert(layout.onnx(graph), layout.encodings(graph), out, graph.name,
                        convert_options(cfg), lambda m: None)
        read = layout.onnx_data(graph).stat().st_size
    else:
        dlcs = [scratch / dlc_name(g) for g in graphs]
        out = scratch / layout.bin_name(part)
        backend.compile(dlcs, out, compile_options(cfg, part), lambda m: None)
        read = sum(p.stat().st_size for p in dlcs)
    seconds = time.monotonic() - started
    return {"step": spec["step"], "graph": spec.get("graph"), "seconds": round(seconds, 6),
            "read_bytes": read, "written_bytes": out.stat().st_size}


# --------------------------------------------------------------------------- split and import

# The unsplit graph the split row cuts: the model's shape with fewer layers (a 7B layer is ~0.9
# GB of float32; 4 layers + embedding + head is ~8 GB, x3 on disk with the parts and the cp copy,
# where the real 30 GB graph would need ~90 GB free). The split streams tensor by tensor, so its
# cost per byte does not depend on the layer count.
SPLIT_LAYERS = 4
SPLIT_PLAN = (0, 2, 2)


def split_model(model, small: bool):
    """The bench model's shape with SPLIT_LAYERS layers (qwen2-tiny has 4 already)."""
    from dataclasses import replace
    arch = replace(model.architecture, num_layers=SPLIT_LAYERS)
    return replace(model, architecture=arch)


def _all_weights(model) -> list:
    from hexbundle.config.model import part_weights
    whole = Part(1, 1, tuple(range(model.architecture.num_layers)), True, True)
    return part_weights(model.architecture, model.quantization, whole)


def split_step(spec: dict) -> None:
    """Run in a fresh process by Bench.split_row: cut every part of SPLIT_PLAN out of the
    unsplit graphs (peak RSS is this process's)."""
    from hexbundle.config.layout import GraphInputs
    from hexbundle.config.model import Plan
    from hexbundle.inputs.split import split_graphs
    cfg = load_build(Path(spec["root"]), {"model": spec["model"]})
    model = split_model(cfg.model, spec["small"])
    whole = Part(1, 1, tuple(range(spec["layers"])), True, True)
    unsplit = {g.slot: GraphInputs(*_files(Path(spec["unsplit"]), g)) for g in model.graphs(whole)}
    for part in Plan("bench", SPLIT_PLAN).parts():
        out = {g.slot: GraphInputs(*_files(Path(spec["out"]), g)) for g in model.graphs(part)}
        split_graphs(model, part, unsplit, out, lambda m: None)


def _files(directory: Path, graph) -> tuple:
    from hexbundle.config.layout import graph_files
    onnx_path, data, encodings = graph_files(directory, graph)
    return onnx_path, (data,), encodings


def link_as_tree(model, parts_dir: Path, tree: Path) -> None:
    """A qai-hub-models 0.55 tree (ar<S>_cl<C>/<slug>_w8a16_..._<i>_of_<N>.aimet/) whose files
    are symbolic links to the split parts (each ONNX records its part's .data by name)."""
    from hexbundle.config.layout import graph_files
    from hexbundle.config.model import Plan
    parts = Plan("bench", SPLIT_PLAN).parts()
    for part in parts:
        for graph in model.graphs(part):
            stem = (f"{model.slug}_w8a16_ar{graph.ar}_cl{graph.context_length}_{part.index}_of_"
                    f"{part.count}")
            d = tree / f"ar{graph.ar}_cl{graph.context_length}" / f"{stem}.aimet"
            d.mkdir(parents=True, exist_ok=True)
            onnx_path, data, encodings = graph_files(parts_dir, graph)
            for src, name in ((onnx_path, f"{stem}.onnx"), (data, data.name),
                              (encodings, f"{stem}.encodings")):
                link = d / name
                if not link.exists():
                    link.symlink_to(src)


def split_rows(split: dict) -> list:
    return [
        {"id": 7, "what": f"local split of an unsplit {split['layers']}-layer graph into "
                          f"{len(split['plan'])} parts vs `cp` of its "
                          f"{split['weights_bytes'] / GIB:.2f} GiB of weights",
         "ours": f"{split['split_seconds']:.2f} s, peak RSS {split['peak_rss_bytes'] / GIB:.2f} GiB",
         "baseline": f"{split['cp_seconds']:.2f} s",
         "ratio": f"{split['ratio']:.2f}x cp; RSS = "
                  f"{split['peak_rss_bytes'] / split['largest_tensor_bytes']:.2f}x largest tensor",
         "target": "(reported)", "met": None, "detail": split},
        {"id": 8, "what": "`import_export` of a qai-hub-models tree of those parts vs "
                          "`doit list` start-up",
         "ours": f"{split['import_seconds']:.2f} s", "baseline": f"{split['list_seconds']:.2f} s",
         "ratio": f"{split['import_seconds'] / split['list_seconds']:.2f}x",
         "target": "(reported)", "met": None, "detail": split},
    ]


# --------------------------------------------------------------------------- the table


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


def rows(digests, noop, touch, change, backend, full_1, full_2) -> list:
    """Rows 1-6, those whose measurements were taken (a --rows run leaves the others None)."""
    out = []
    for make, needs in ((row_digests, (digests,)), (row_noop, (noop,)), (row_touch, (touch,)),
                        (row_change, (change,)), (row_backend, (backend,)),
                        (row_parallel, (full_1, full_2))):
        if all(n is not None for n in needs):
            out.append(make(*needs))
    return out


def row_digests(digests) -> dict:
    return {"id": 1, "what": "file digests, same files (XXH3-128 checker vs doit MD5Checker)",
            "ours": f"{digests['ours_gib_per_s']} GiB/s",
            "baseline": f"{digests['stock_gib_per_s']} GiB/s",
            "ratio": f"{digests['ratio']}x", "target": ">= 10x", "met": digests["ratio"] >= 10,
            "detail": digests}


def row_noop(noop) -> dict:
    return {"id": 2, "what": "start-up (median): `doit list` vs `python -m doit --version`; "
                             "no-op `doit bundle` vs `doit list`",
            "ours": f"list {noop['list_seconds']:.2f} s; no-op {noop['noop_seconds']:.2f} s",
            "baseline": f"--version {noop['version_seconds']:.2f} s; list "
                        f"{noop['list_seconds']:.2f} s",
            "ratio": f"{noop['list_ratio']}x; {noop['ratio']}x", "target": "<= 1.5x; <= 1.1x",
            "met": noop["list_ratio"] <= 1.5 and noop["ratio"] <= 1.1, "detail": noop}


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


def row_change(change) -> dict:
    return {"id": 4,
            "what": f"one part's weights changed: rebuild vs full build ({change['parts']} parts)",
            "ours": f"{change['seconds']:.1f} s", "baseline": f"{change['full_seconds']:.1f} s",
            "ratio": f"{change['ratio']:.2f}x",
            "target": f"<= 1/{change['parts']} + bundle step ({change['budget_seconds']:.1f} s)",
            "met": change["seconds"] <= change["budget_seconds"], "detail": change}


def row_backend(backend) -> dict:
    return {"id": 5, "what": f"reference backend, part {backend['part']} ({backend['layers']} "
                             "layers): convert x2 + compile",
            "ours": f"{backend['gb_per_s']:.2f} GB/s fp32 weights",
            "baseline": f"peak RSS {backend['peak_rss_bytes'] / GIB:.2f} GiB",
            "ratio": f"RSS = {backend['peak_rss_bytes'] / backend['largest_tensor_bytes']:.2f}x "
                     "largest tensor",
            "target": "peak RSS < 3 GiB", "met": backend["peak_rss_bytes"] < 3 * GIB,
            "detail": backend}


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


def row_parallel(full_1, full_2) -> dict:
    n1, n2 = full_1.seconds, full_2.seconds
    return {"id": 6, "what": "full build `doit -n 2` vs `-n 1`",
            "ours": f"{n2:.1f} s", "baseline": f"{n1:.1f} s", "ratio": f"{n1 / n2:.2f}x faster",
            "target": "(reported)", "met": None,
            "detail": {"n1_seconds": round(n1, 2), "n2_seconds": round(n2, 2),
                       "n1_peak_rss_bytes": full_1.maxrss, "n2_peak_rss_bytes": full_2.maxrss}}


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
