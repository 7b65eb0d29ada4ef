"""scripts/bench.py --small runs end to end and writes a well-formed table and results file.
The figures themselves are never asserted (they are measurements); only what is deterministic:
the rows are there, the second run after a touch hashes nothing, the MD5 runs do hash."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.heavy   # `doit bench --small`, every row: the full suite (`pytest --full`)

ROW_KEYS = {"id", "what", "ours", "baseline", "ratio", "target", "met", "detail"}


@pytest.fixture(scope="module")
def small_bench(tmp_path_factory):
    """`doit bench --small` (which runs scripts/bench.py) in a throwaway copy of the project."""
    from conftest import PROJECT_FILES, copy_project
    # requirements/: the ortqnn kit's pins (row 13)
    project = copy_project(tmp_path_factory.mktemp("bench") / "proj",
                           (*PROJECT_FILES, "requirements"))
    run = project.doit("bench", "--small", env=_kit_env(), check=False)
    return project, run, project.root / "build" / "bench" / "results.json"


def _kit_env() -> dict:
    """Row 13 runs the ortqnn kit: its wheelhouse when it is here (without it the row says
    skipped, which test_the_simulator_row refuses under CI)."""
    from test_ortqnn import KIT_ENV, _kit_available
    return {} if _kit_available() else dict(KIT_ENV)


def test_small_bench_runs_and_prints_one_table(small_bench):
    project, run, _ = small_bench
    assert run.code == 0, run.out + run.err
    table = [line for line in run.out.splitlines() if line.startswith("|")]
    assert [c.strip() for c in table[0].split("|")[1:-1]] == [
        "#", "measured", "hexbundle", "baseline", "ratio", "target", "met"]
    assert [line.split("|")[1].strip() for line in table[2:]] == [str(i) for i in range(1, 14)]
    assert "machine:" in run.out
    assert not (project.root / "build" / "bench" / "small-tree").exists()   # cleaned up


def test_results_json_is_well_formed(small_bench):
    _, run, out = small_bench
    assert run.code == 0
    results = json.loads(out.read_text())
    assert results["mode"] == "small" and results["model"] == "qwen2-tiny"
    assert {"cpu", "cores", "ram_gib", "os", "python", "doit", "numpy"} <= set(results["machine"])
    rows = results["rows"]
    assert [r["id"] for r in rows] == list(range(1, 14))
    for row in rows:
        assert ROW_KEYS <= set(row), row
        assert row["met"] in (True, False, None)
    digests = rows[0]["detail"]
    assert digests["ours_seconds"] > 0 and digests["stock_seconds"] > 0 and digests["bytes"] > 0
    startup = rows[1]["detail"]   # `doit list` beside `python -m doit --version`, no-op beside list
    assert startup["version_seconds"] > 0 and startup["list_seconds"] > 0
    assert len(startup["version_all"]) == len(startup["list_all"]) == len(startup["noop_all"])
    assert rows[1]["ratio"] == f"{startup['list_ratio']}x; {startup['ratio']}x"
    assert rows[4]["detail"]["peak_rss_bytes"] > 0
    assert results["sizes"]["passed"] is True
    assert results["full_build"]["bins_hard_linked"] is True
    split = rows[6]["detail"]   # the local split wrote every weight once, measured beside cp
    assert split["written_bytes"] >= split["weights_bytes"] > 0 and split["cp_seconds"] > 0
    assert split["peak_rss_bytes"] > 0 and split["plan"] == [0, 2, 2]
    assert rows[7]["detail"]["import_seconds"] > 0 and rows[7]["detail"]["list_seconds"] > 0
    verify = rows[9]["detail"]   # doit verify of the built bundle, its own process
    assert verify["seconds"] > 0 and verify["peak_rss_bytes"] > 0 and rows[9]["met"] is None
    checkpoint = rows[10]["detail"]   # import_export of a quantize checkpoint, its own process
    assert checkpoint["seconds"] > 0 and checkpoint["peak_rss_bytes"] > 0
    assert checkpoint["data_bytes"] > 0 and rows[10]["met"] in (True, False)


def test_touch_rows_count_what_each_checker_hashed(small_bench):
    _, _, out = small_bench
    touch = json.loads(out.read_text())["rows"][2]["detail"]
    assert touch["ours_1"]["files_hashed"] > 0
    assert touch["ours_2"]["files_hashed"] == 0          # ours: hashed once, then stat-only
    assert touch["md5_1"]["files_hashed"] == touch["md5_2"]["files_hashed"] > 0   # stock: every run


def test_comparison_checker_is_md5_only(project):
    # a build resolves the checker (a plain `doit list` resolves nothing: graph.loader)
    run = project.doit("bundle", env={"HEXBUNDLE_BENCH_CHECKER": "sha1"}, check=False)
    assert run.code == 3 and "only comparison checker is 'md5'" in run.err
    assert not (project.root / "build").exists()   # refused before anything was built


def test_the_cache_row_fetches_every_convert_and_compile_step(small_bench):
    """Row 9: a build through a local BuildGrid uploads, the next (outputs removed) fetches."""
    import os
    _, _, out = small_bench
    cache = json.loads(out.read_text())["rows"][8]["detail"]
    if "skipped" in cache:
        assert not os.environ.get("CI"), "under CI .ci/run provides BuildGrid"
        pytest.skip(cache["skipped"])
    assert cache["steps_fetched"] == 12   # qwen2-tiny: 8 converts, 4 compiles
    assert cache["fetched_bytes"] > 0 and cache["cas_bytes"] >= cache["fetched_bytes"]
    assert cache["hit_seconds"] > 0 and cache["full_seconds"] > 0


def test_the_remote_execution_row_builds_on_both_workers_byte_identically(small_bench):
    """Row 12: the full build on a fresh grid's 2 workers, beside the local `-n 1` build. Under
    CI (BuildGrid and PostgreSQL provided by .ci/run) it must have run, not been skipped."""
    import os
    _, run, out = small_bench
    row = json.loads(out.read_text())["rows"][11]
    remote = row["detail"]
    if "skipped" in remote:
        assert not os.environ.get("CI"), "under CI .ci/run provides BuildGrid and PostgreSQL"
        pytest.skip(remote["skipped"])
    assert remote["bundle_byte_identical"] is True
    assert remote["steps_remote"] == 12   # qwen2-tiny: 8 converts, 4 compiles, all on workers
    assert set(remote["steps_per_worker"]) == {"w1", "w2"}
    assert all(n > 0 for n in remote["steps_per_worker"].values()), remote
    assert sum(remote["steps_per_worker"].values()) == remote["steps_remote"]
    assert remote["remote_seconds"] > 0 and remote["local_n1_seconds"] > 0
    cost = remote["per_action"]   # an action's time beside its step's work, per action
    assert cost["actions"] == remote["steps_remote"] and cost["work"] > 0, cost
    assert f"per action {cost['work']:.1f} s of work" in row["ours"], row["ours"]
    # the verdict is computed from the two measurements, never assumed (each figure is
    # rounded to 0.01 in the results, hence the tolerance)
    ratio = remote["local_n1_seconds"] / remote["remote_seconds"]
    assert remote["ratio"] == pytest.approx(ratio, rel=0.01, abs=0.01)
    assert remote["met"] is (remote["ratio"] >= 1.8)
    assert row["met"] is remote["met"] and f"{remote['ratio']:.2f}x" in row["ratio"]


def test_rows_selects_what_the_bench_measures(project):
    run = project.doit("bench", "--small", "--rows", "1", check=False)
    assert run.code == 0, run.out + run.err
    table = [line for line in run.out.splitlines() if line.startswith("|")]
    assert [line.split("|")[1].strip() for line in table[2:]] == ["1"]
    assert "rows measured: 1 (--rows)" in run.out
    bad = project.doit("bench", "--small", "--rows", "0,14", check=False)
    assert bad.code != 0 and "--rows '0,14': expected row numbers among 1, 2" in bad.out + bad.err
    assert "12, 13," in bad.out + bad.err


@pytest.fixture(scope="module")
def simulator_bench(tmp_path_factory):
    """`doit bench --small --rows 13`: Qualcomm's simulator on the tiny model's largest part."""
    from conftest import PROJECT_FILES, copy_project
    project = copy_project(tmp_path_factory.mktemp("bench-sim") / "proj",
                           (*PROJECT_FILES, "requirements"))
    run = project.doit("bench", "--small", "--rows", "13", env=_kit_env(), check=False)
    return project, run, project.root / "build" / "bench" / "results.json"


def test_the_simulator_row(simulator_bench):
    """Row 13 alone: the part's own bins, prompt chunks and token steps on the simulator beside
    onnxruntime CPU on the same QDQ graphs, their ratios computed from the two in the same run,
    the whole verify of the part extrapolated and labelled so; no full build. Under CI (the kit
    provided by .ci/run) it must have run, not been skipped."""
    import os
    _, run, out = simulator_bench
    assert run.code == 0, run.out + run.err
    results = json.loads(out.read_text())
    assert results["rows_measured"] == [13] and results["full_build"] is None
    assert "full build -n 1" not in run.out
    [row] = results["rows"]
    assert ROW_KEYS <= set(row) and row["id"] == 13 and row["met"] is None
    sim = row["detail"]
    if "skipped" in sim:
        assert os.environ.get("CI") != "true", "under CI .ci/run provides the ortqnn kit"
        pytest.skip(sim["skipped"])
    assert sim["part"] == 2 and sim["layers"] == 2 and sim["qdq_bytes"] > 0   # qwen2-tiny
    k, s, c = sim["compile"], sim["simulator"], sim["cpu"]
    # every run was timed: CHUNKS prompt chunks; a fork per chunk, then STEPS decode steps
    for side in (s, c):
        assert len(side["prompt_runs"]) == sim["chunks"] == 2
        assert len(side["token_runs"]) == sim["chunks"] + sim["steps"]
        assert side["chunk_seconds"] > 0 and side["step_seconds"] > 0 and side["maxrss"] > 0
    assert k["own_bins_seconds"] > 0 and k["recompile_seconds"] > 0 and k["own_bins_bytes"] > 0
    assert k["maxrss"] > 0 and sim["converted"] is True and sim["convert_seconds"] > 0
    assert set(s["start_seconds"]) == {"prompt", "token"}
    assert sim["chunk_ratio"] == pytest.approx(s["chunk_seconds"] / c["chunk_seconds"], abs=0.01)
    assert sim["step_ratio"] == pytest.approx(s["step_seconds"] / c["step_seconds"], abs=0.01)
    assert f"chunk {sim['chunk_ratio']:.2f}x, step {sim['step_ratio']:.2f}x" in row["ratio"]
    assert sim["max_difference_lsb"] >= 0
    estimate = sim["verify_estimate"]   # [verify] of qwen2-tiny: 160 prompt tokens, 32 steps
    assert estimate["extrapolated"] is True and "(extrapolated)" in row["ours"]
    assert estimate["chunks"] == 3 * 2 and estimate["token_steps"] == 3 * (2 + 32)
    assert estimate["seconds"] > estimate["runs_seconds"] > 0
