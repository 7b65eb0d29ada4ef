"""The size model: reproduces the seeds' measured Qwen2.5-7B figures; judges built sizes."""
from pathlib import Path

import pytest

from hexbundle.checks import sizes
from hexbundle.config.build import load_model
from hexbundle.support.errors import SizeError

ROOT = Path(__file__).resolve().parent.parent
MIB = sizes.MIB


@pytest.fixture(scope="module")
def qwen7b():
    model, _ = load_model(ROOT, "qwen2.5-7b-instruct")
    return model


def within(actual, expected, pct):
    return abs(actual - expected) <= expected * pct / 100


def test_eleven_split_parts_match_the_seed_within_one_percent(qwen7b):
    plan = qwen7b.plans["eleven"]
    exp = sizes.expect(qwen7b, plan)
    got = [e.packed / MIB for e in exp]
    for i, (g, seed) in enumerate(zip(got, plan.expected_part_mib), start=1):
        assert within(g, seed, 1.0), f"part {i}: model {g:.1f} MiB vs seed {seed} MiB"
    assert within(sum(got), 4710.4, 1.0)


def test_six_split_total_matches_the_seed_within_one_percent(qwen7b):
    total = sum(e.packed for e in sizes.expect(qwen7b, qwen7b.plans["six"])) / MIB
    assert within(total, 4710.4, 1.0), total


def test_unpacked_decoder_parts_are_about_twice(qwen7b):
    exp = sizes.expect(qwen7b, qwen7b.plans["eleven"])
    ratio = exp[1].unpacked / exp[1].packed
    assert 1.95 < ratio < 2.0, ratio        # seed: 672.6 / 337.3 = 1.994
    assert within(exp[1].unpacked / MIB, 672.6, 1.0)
    assert exp[0].unpacked == exp[0].packed  # the 16-bit embedding has nothing to pack


def judge_one(model, plan, factor_by_part):
    exp = sizes.expect(model, plan)
    actual = {e.part.index: int(e.packed * factor_by_part.get(e.part.index, 1.0)) for e in exp}
    rows = sizes.judge_sizes(model, plan, actual)
    return rows, sizes.format_table(model, plan, rows)


def test_judge_names_unpacked_weights(qwen7b):
    plan = qwen7b.plans["six"]
    exp = sizes.expect(qwen7b, plan)
    actual = {e.part.index: e.packed for e in exp}
    actual[3] = exp[2].unpacked
    rows = sizes.judge_sizes(qwen7b, plan, actual)
    assert [r.verdict for r in rows] == ["ok", "ok", "NOT PACKED", "ok", "ok", "ok"]
    table = sizes.format_table(qwen7b, plan, rows)
    with pytest.raises(SizeError, match=r"part\(s\) 3: 4-bit weights were not packed"):
        sizes.raise_on_failure(qwen7b, plan, rows, table)


def test_judge_names_unshared_weights_and_other_deviations(qwen7b):
    plan = qwen7b.plans["six"]
    exp = sizes.expect(qwen7b, plan)
    actual = {e.part.index: e.packed for e in exp}
    actual[2] = exp[1].unshared
    rows = sizes.judge_sizes(qwen7b, plan, actual)
    with pytest.raises(SizeError, match="stored twice"):
        sizes.raise_on_failure(qwen7b, plan, rows, "")
    actual[2] = int(exp[1].packed * 1.1)
    rows = sizes.judge_sizes(qwen7b, plan, actual)
    assert rows[1].verdict == "OFF"
    with pytest.raises(SizeError, match="outside tolerance"):
        sizes.raise_on_failure(qwen7b, plan, rows, "")


def test_within_tolerance_passes_and_prints_a_table(qwen7b):
    plan = qwen7b.plans["six"]
    rows, table = judge_one(qwen7b, plan, {2: 1.01})
    sizes.raise_on_failure(qwen7b, plan, rows, table)
    assert "total" in table and "(a known-good build measured 4710.4)" in table
