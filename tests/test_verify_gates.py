"""verify's gates in isolation (issues 34 and 46), each in both directions: what a faithful build
can show passes, what a broken one shows fails. The numbers are the shapes seen on real
exports: a chained end-to-end difference of ~400 LSB that two correct references share, a
token-vs-prompt KV cosine of 0.99988 that the reference itself has, top-1 vs float of 0.43."""
import json

import numpy as np
import pytest

from conftest import ROOT
from hexbundle.checks.exact import aimet_quantize
from hexbundle.checks.verify import (SequenceRun, end_to_end_rows, gate_against_floor, make_row,
                                     noise_floor, token_vs_prompt_rows)
from hexbundle.config.build import VERIFY_SCHEMA, VerifySettings

SCALE = 1e-3   # the output encoding's step: values below are in LSBs of it


def settings(**changes):
    values = {key: f.default for key, f in VERIFY_SCHEMA.items()}
    values.update(changes)
    return VerifySettings(**values)


def signal(rng, n=64, width=256):
    return rng.standard_normal((n, width)).astype(np.float64)


def off_by(x, lsb, rng, where=0.02):
    """x with a few elements moved by `lsb` LSBs (the shape of rounding noise: sparse, large)."""
    y = x.copy()
    mask = rng.random(x.shape) < where
    y[mask] += lsb * SCALE * rng.choice([-1, 1], mask.sum())
    return y


def part_rows_with(bundle_lsb, floor_lsb, rng, part=2):
    ref = signal(rng)
    rows = [make_row(f"part {part}", part, "prefill vs reference", off_by(ref, bundle_lsb, rng),
                     ref, False, scale=SCALE),
            make_row(f"part {part}", part, "reference vs reference (AIMET rounding)",
                     off_by(ref, floor_lsb, rng), ref, False, scale=SCALE)]
    return rows


# ------------------------------------------------------------------------------ the noise floor


def test_a_part_within_k_times_the_measured_floor_passes_and_beyond_it_fails():
    rng = np.random.default_rng(0)
    v = settings(floor_multiplier=2.0)
    rows = part_rows_with(70, 40, rng) + part_rows_with(5, 3, rng, part=3)
    floor, where = noise_floor(rows, v)
    assert floor == pytest.approx(40, abs=1e-6) and "part 2" in where
    gate_against_floor(rows, floor, v)
    assert all(r.ok for r in rows), [r.problems for r in rows]
    assert rows[0].ratio == pytest.approx(70 / 40, rel=1e-6) and "80.0 LSB" in rows[0].limit

    rows = part_rows_with(90, 40, rng) + part_rows_with(5, 3, rng, part=3)
    gate_against_floor(rows, noise_floor(rows, v)[0], v)
    assert not rows[0].ok and "90.0 LSB > 2 x the noise floor 40.0 LSB" in rows[0].problems[0]


def test_the_floor_is_at_least_min_floor_lsb():
    rng = np.random.default_rng(1)
    v = settings(floor_multiplier=2.0)
    rows = part_rows_with(15, 1, rng)
    floor, where = noise_floor(rows, v)
    assert (floor, where) == (8.0, "min_floor_lsb")
    gate_against_floor(rows, floor, v)
    assert rows[0].ok
    rows = part_rows_with(17, 1, rng)
    gate_against_floor(rows, noise_floor(rows, v)[0], v)
    assert not rows[0].ok


def part_runs(bundle, ref, ref2=None):
    from hexbundle.checks.verify import PartRuns
    run = lambda out: SequenceRun(out, {0: (out[0], np.zeros(0))}, {0: (out[0], np.zeros(0))})
    return PartRuns(run(bundle), run(ref), run(ref if ref2 is None else ref2), run(ref))


def gated_part(bundle, ref, ref2=None, scale=SCALE, v=None):
    """A part's rows gated as verify gates them (its floor measured from its own rows)."""
    from hexbundle.checks.verify import part_rows
    v = v or settings()
    rows = part_rows("part 2", 2, False, len(ref), part_runs(bundle, ref, ref2), v, scale)
    gate_against_floor(rows, noise_floor(rows, v)[0], v)
    return {r.check: r for r in rows}


def test_a_gross_error_fails_by_the_floor_with_no_constant_behind_it():
    """What the cosine backstop (min_cosine_reference) caught is caught relative to the floor:
    garbage is far more than floor_multiplier x the references' own difference, in LSBs and,
    for a float output, in relative difference."""
    rng = np.random.default_rng(2)
    x, garbage = signal(rng, n=4), signal(rng, n=4)
    for scale, unit in ((SCALE, "LSB"), (None, "rel")):
        row = gated_part(garbage, x, off_by(x, 3, rng), scale=scale)["prefill vs reference"]
        assert row.unit == unit and not row.ok and "floor_multiplier" in row.problems[0]
        row = gated_part(x.copy(), x, off_by(x, 3, rng), scale=scale)["prefill vs reference"]
        assert row.ok and row.value == 0, row.problems


def test_a_float_output_is_judged_against_the_two_references_own_difference():
    """The issue-46 shape: a faithful bundle whose error equals what two correct references
    differ by passes whatever its cosine; k x more fails; with identical references, the floor
    is min_floor_lsb float32 steps (the float output's own resolution)."""
    rng = np.random.default_rng(8)
    x = signal(rng, n=8)
    ref2 = x * (1 + 2e-4 * rng.standard_normal(x.shape))     # cosine ~0.99998
    row = gated_part(x * (1 + 2e-4 * rng.standard_normal(x.shape)), x, ref2,
                     scale=None)["prefill vs reference"]
    assert row.ok and row.unit == "rel" and 0.5 < row.ratio < 2, (row.ratio, row.problems)
    assert not gated_part(x * (1 + 3e-3 * rng.standard_normal(x.shape)), x, ref2,
                          scale=None)["prefill vs reference"].ok
    eps = float(np.finfo(np.float32).eps)
    tiny = gated_part(x * (1 + 4 * eps), x, scale=None)["prefill vs reference"]
    assert tiny.ok and tiny.floor == pytest.approx(8 * eps), tiny.problems
    assert not gated_part(x * (1 + 100 * eps), x, scale=None)["prefill vs reference"].ok


def test_identical_vectors_are_identical_even_all_zero():
    """Issue 46: a pad row of zeros made a part's output all zeros in the bundle and both
    references, and the cosine of two zero vectors came out 0 ("diverged"). Judged by their
    difference, two identical vectors agree; a zero against a non-zero one does not."""
    from hexbundle.checks.verify import compare
    zeros = np.zeros((3, 16))
    m = compare(zeros, zeros.copy(), True)
    assert (m["cos_min"], m["rel"], m["max_abs"]) == (1.0, 0.0, 0.0)
    ones = np.ones((3, 16))
    m = compare(zeros, ones, False)
    assert (m["cos_min"], m["rel"]) == (0.0, 1.0)
    m = compare(np.vstack([ones[:2], zeros[:1]]), ones, False)   # one zero row among others
    assert m["cos_min"] == 0.0 and m["cos_mean"] == pytest.approx(2 / 3)
    nan = ones.copy()
    nan[1, 3] = np.nan
    assert np.isnan(compare(nan, ones, False)["cos_min"])
    for scale in (SCALE, None):   # an all-zero part in bundle and references passes
        rows = gated_part(np.zeros((4, 32)), np.zeros((4, 32)), scale=scale)
        assert all(r.ok for r in rows.values()), {k: r.problems for k, r in rows.items()}
        assert rows["prefill vs reference"].cos_min == 1.0
        bad = gated_part(np.ones((4, 32)), np.zeros((4, 32)), scale=scale)
        assert not bad["prefill vs reference"].ok


# ------------------------------------------------------------------------------ end to end


def chained(bundle_lsb, refs_lsb, seed=3):
    rng = np.random.default_rng(seed)
    ref = signal(rng)
    return end_to_end_rows("end to end", off_by(ref, bundle_lsb, rng, 0.3), ref,
                           off_by(ref, refs_lsb, rng, 0.3), ref + 0.05 * signal(rng), settings(),
                           SCALE)


def test_chained_fails_only_on_gross_error():
    rows = {r.check: r for r in chained(400, 397)}   # the two references 397 LSB apart
    ours = rows["chained vs reference"]
    assert ours.cos_min < 0.9999 and ours.ok, ours.problems    # the old gate failed this
    assert ours.ratio == pytest.approx(400 / 397, rel=0.05)
    rows = {r.check: r for r in chained(4000, 100)}
    ours = rows["chained vs reference"]
    assert ours.ratio > 20 and not ours.ok
    assert "chained_max_ratio 20" in ours.problems[0], ours.problems


def test_chained_judges_the_cosine_relative_to_the_references_own():
    """No constant cosine (chained_min_cosine): a large LSB ratio passes when the bundle's
    cosine distance is within chained_max_ratio x the references' own (a single far element,
    as a flip at a near-tie fed forward makes), and fails when it is not."""
    rng = np.random.default_rng(9)
    ref = signal(rng, n=32)
    ref2 = off_by(ref, 20, rng, 0.5)                   # references: small and everywhere
    one_far = ref.copy()
    one_far[3, 5] += 500 * SCALE                       # 25 x their largest, in one element
    rows = {r.check: r for r in end_to_end_rows("end to end", one_far, ref, ref2, ref,
                                                settings(), SCALE)}
    assert rows["chained vs reference"].ratio > 20 and rows["chained vs reference"].ok
    everywhere = off_by(ref, 500, rng, 0.5)
    rows = {r.check: r for r in end_to_end_rows("end to end", everywhere, ref, ref2, ref,
                                                settings(), SCALE)}
    assert not rows["chained vs reference"].ok


def test_float_drift_and_top1_are_reported_not_gated():
    """A random model agrees with float on few tokens whoever builds it, and the bundle's drift
    is bounded by the reference's plus the chained difference (gated): both reported."""
    rng = np.random.default_rng(4)
    floats = signal(rng, n=400)
    reference = logits_agreeing(floats, 0.43, rng)
    rows = {r.check: r for r in end_to_end_rows("end to end", reference.copy(), reference,
                                                reference, floats, settings(), SCALE)}
    ours = rows["bundle drift from float"]
    assert ours.top1 == pytest.approx(0.43) and ours.ok and not ours.gated
    assert "top-1 vs float: the bundle's 0.430, the reference's 0.430" in ours.notes[0]


def logits_agreeing(floats, share, rng):
    """Logits whose argmax is the float's at `share` of the positions (elsewhere another)."""
    out = floats.copy()
    n, width = floats.shape
    moved = rng.permutation(n)[:int(round((1 - share) * n))]
    for i in moved:
        other = (int(floats[i].argmax()) + 1 + rng.integers(width - 1)) % width
        out[i, other] = floats[i].max() + 1.0
    return out


@pytest.mark.parametrize("key", ["min_cosine_reference", "chained_min_cosine",
                                 "max_drift_margin", "top1_tolerance"])
def test_a_constant_gate_of_before_is_refused_naming_what_replaced_it(key):
    from hexbundle.config.schema import validate
    from hexbundle.support.errors import ConfigError
    values = {k: f.default for k, f in VERIFY_SCHEMA.items()}
    with pytest.raises(ConfigError, match=rf"key 'verify.{key}' is no longer read: .*remove it"):
        validate({**values, key: 0.5}, VERIFY_SCHEMA, "build.toml", "verify.")


# ------------------------------------------------------------------------------ token vs prompt


def sequence(out, kv):
    return SequenceRun(out, {p: (out[p], kv[p]) for p in range(len(out))},
                       {p: (out[p], kv[p]) for p in range(len(out))})


def token_rows(bundle_lsb, reference_lsb, references_lsb=0, seed=5):
    """Token-vs-prompt rows where the token graph's KV entries differ from the prompt graph's
    by the given LSBs (8-bit KV grid, step KV_STEP), in the bundle and in the reference, and
    the second reference differs from the first by references_lsb."""
    rng = np.random.default_rng(seed)
    out = np.round(signal(rng, n=4) / SCALE) * SCALE
    kv = np.round(signal(rng, n=4) / KV_STEP) * KV_STEP

    def run(lsb, base_kv=kv):
        s = sequence(out, base_kv)
        moved = base_kv.copy()
        moved[:, 3] += lsb * KV_STEP
        s.token_rows = {p: (out[p], moved[p]) for p in s.prompt_rows}
        return s
    second = kv.copy()
    second[:, 7] += references_lsb * KV_STEP
    return {r.check: r for r in token_vs_prompt_rows(
        "part 2", 2, False, run(bundle_lsb), run(reference_lsb), run(reference_lsb, second),
        settings(), SCALE, np.full(kv.shape[1], KV_STEP))}


KV_STEP = 0.05


def test_token_vs_prompt_is_relative_to_the_references_own():
    # the export's own graphs differ by 30 LSB (an 8-bit KV cache fed back): the bundle's 40 is
    # within 2 x its floor, though its cosine is below the old 0.9999
    rows = token_rows(40, 30)
    ours = rows["token vs prompt kv"]
    assert ours.ok and ours.floor == pytest.approx(30) and ours.ratio == pytest.approx(40 / 30)
    assert not token_rows(70, 30)["token vs prompt kv"].ok
    assert rows["reference token vs prompt kv"].ok   # a fact about the export, reported


def test_token_vs_prompt_floor_is_the_two_references_or_min_floor_lsb():
    # a reference whose two graphs agree exactly: the floor is what two correct references
    # differ by on the same entries, and never below min_floor_lsb (8)
    assert token_rows(1, 0)["token vs prompt kv"].ok        # one flip at a near-tie
    assert token_rows(16, 0)["token vs prompt kv"].ok
    assert not token_rows(17, 0)["token vs prompt kv"].ok
    rows = token_rows(30, 0, references_lsb=20)
    assert rows["token vs prompt kv"].floor == pytest.approx(20) and rows["token vs prompt kv"].ok


# ------------------------------------------------------------------------------ AIMET's rounding


def test_aimet_quantize_rounds_half_up_and_reports_the_ties():
    w = np.array([0.5, 1.5, 2.5, -0.5, 0.49999997, 2.2], np.float32)
    q, tie = aimet_quantize(w, np.float32(1.0), np.float32(-8.0), 4)
    assert q.tolist() == [9, 10, 11, 8, 8, 10]        # floor(w + 0.5) - (-8)
    assert tie.tolist() == [True, True, True, True, False, False]
    # a fractional (shifted) offset: rounding after it
    q, tie = aimet_quantize(np.array([1.0], np.float32), np.float32(1.0), np.float32(-7.5), 4)
    assert q.tolist() == [9] and tie.tolist() == [True]


def test_a_second_reference_that_is_not_finite_has_no_say_in_the_floor_and_says_so():
    rng = np.random.default_rng(6)
    v = settings()
    ref = signal(rng)
    broken = ref.copy()
    broken[0, 0] = np.nan
    rows = [make_row("part 2", 2, "prefill vs reference", off_by(ref, 30, rng), ref, False,
                     scale=SCALE),
            make_row("part 2", 2, "reference vs reference (AIMET rounding)", broken, ref, False,
                     scale=SCALE)] + part_rows_with(5, 20, rng, part=3)
    floor, where = noise_floor(rows, v)
    assert floor == pytest.approx(20) and "part 3" in where
    assert "not measurable in part 2 (its second reference is not finite): left out" in where
    gate_against_floor(rows, floor, v)
    assert rows[0].ok and rows[0].unit == "LSB"
    rows[0] = make_row("part 2", 2, "prefill vs reference", signal(rng), ref, False, scale=SCALE)
    gate_against_floor(rows, floor, v)
    assert not rows[0].ok


# ------------------------------------------------------------------------------ the report


def report_with_nan():
    from hexbundle.checks.verify import Report, exact_rows
    rng = np.random.default_rng(10)
    ref = signal(rng, n=4)
    rows = part_rows_with(10, 20, rng)
    nan = ref.copy()
    nan[0, 0] = np.nan
    rows.append(make_row("part 3 of 3 (x_part_3_of_3.bin)", 3, "prefill vs reference", nan,
                         ref, True, scale=SCALE))
    gate_against_floor(rows, noise_floor(rows, settings())[0], settings())
    rows += end_to_end_rows("end to end", ref, ref, ref, ref, settings(), None)
    return Report("m", "build/m/bundle", 4, 0, rows, 1.0, 20.0, "part 2", 0,
                  "Some ordinary text.", [1, 2, 3, 4])


def strict_json(text: str):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_the_report_is_strict_json_a_nan_written_as_null():
    from hexbundle.support.atomic import json_bytes
    report = report_with_nan()
    assert not report.ok   # the NaN row fails
    doc = strict_json(json_bytes(report.to_json()).decode())
    nan_row = [r for r in doc["rows"] if r["part_index"] == 3][0]
    assert nan_row["cos_min"] is None and nan_row["ok"] is False
    assert doc["prompt_text"] == "Some ordinary text." and doc["prompt_ids"] == [1, 2, 3, 4]


def test_the_terminal_table_fits_120_columns_and_names_each_failure():
    report = report_with_nan()
    lines = report.table("build/m/verify/report.json").splitlines()
    table = [line for line in lines if not line.startswith("FAIL ")]
    assert all(len(line) <= 120 for line in table), max(table, key=len)
    assert any(line.startswith("FAIL part 3/3, prefill vs reference: ") for line in lines)
    assert lines[-1].endswith("every row, with the reported ones: build/m/verify/report.json")
    assert len(report.full_table().splitlines()[-1]) > 120   # the full one is report.json's


# ------------------------------------------------------------------------------ the prompt


TOKENIZERS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "data").glob(
    "qaihm*/*/tokenizer.json"))


@pytest.mark.parametrize("path", TOKENIZERS)
def test_the_prompt_is_ordinary_text_of_the_bundles_tokenizer(path):
    """Issue 46: random ids hit pad and special ids whose embedding rows an export may set to
    zero. The ids verify feeds are ordinary text's, no special (added) token among them, the
    seed picks the sentences' order, and the text they came from is kept for the report."""
    from tokenizers import Tokenizer
    from hexbundle.runtime.prompt import ordinary_prompt
    tokenizer = Tokenizer.from_file(str(ROOT / path))
    special = set(tokenizer.get_added_tokens_decoder())
    n_vocab = tokenizer.get_vocab_size()
    first = ordinary_prompt(ROOT / path, n_vocab, 0, 192)
    assert first.ids.dtype == np.int32 and len(first.ids) == 192
    assert not special & set(first.ids.tolist()) and first.ids.max() < n_vocab
    assert tokenizer.decode(first.ids.tolist()).strip() in first.text
    again = ordinary_prompt(ROOT / path, n_vocab, 0, 192)
    assert again.text == first.text and (again.ids == first.ids).all()
    other = ordinary_prompt(ROOT / path, n_vocab, 1, 192)
    assert other.text != first.text
    long = ordinary_prompt(ROOT / path, n_vocab, 2, 5000)   # longer than the text: round again
    assert len(long.ids) == 5000 and not special & set(long.ids.tolist())


def test_a_tokenizer_that_maps_ordinary_text_past_the_vocabulary_is_refused():
    from hexbundle.runtime.prompt import ordinary_prompt
    from hexbundle.support.errors import VerifyError
    path = ROOT / TOKENIZERS[0]
    with pytest.raises(VerifyError, match=rf"{path}: none of verify's ordinary sentences"):
        ordinary_prompt(path, 3, 0, 16)


# ------------------------------------------------------------------------------ interrupted


def test_an_interrupted_verify_says_what_is_true_for_verify():
    """`doit verify` keeps no partial result: the line an interrupt prints says so and names
    the command to run again, not `doit bundle` (graph.loader remembers the command line)."""
    from hexbundle.graph import interrupts
    try:
        interrupts.remember_command(["verify", "model=smollm2"])
        line = interrupts.what_next()
        assert "`doit verify model=smollm2` runs it again from the start" in line, line
        assert "verify itself keeps no partial result" in line and "bundle" not in line
        interrupts.remember_command(["convert:part_1_of_4_prompt"])
        assert interrupts.what_next().endswith(
            "the next `doit convert:part_1_of_4_prompt` carries on from there")
        interrupts.remember_command(None)   # `doit`: its default task
        assert "the next `doit bundle` carries on" in interrupts.what_next()
    finally:
        interrupts.remember_command(None)


# ------------------------------------------------------- an ortqnn bundle: the simulator's share


def test_the_simulators_run_of_the_reference_raises_the_floor_and_nothing_else():
    """An ortqnn bundle's floor L is the largest of the two references' difference and the
    simulator's run of the reference ("simulated reference vs reference", checks/simulated.py):
    a bundle 300 LSB off passes against a simulator measured 50 LSB off the reference, and
    fails without that row (the two references alone: min_floor_lsb). End to end, the simulated
    reference's chained difference joins the floor the same way."""
    from hexbundle.checks.verify import ComparisonRow
    v = settings()

    def part_rows(sim_lsb):
        rows = [ComparisonRow("part 2 of 4 (x.bin)", "reference vs reference (AIMET rounding)",
                              "hidden", 8, 1.0, 1.0, 0.0, None, part_index=2, lsb=3.0),
                ComparisonRow("part 2 of 4 (x.bin)", "prefill vs reference", "hidden", 8, 1.0,
                              1.0, 0.0, None, part_index=2, lsb=300.0)]
        if sim_lsb is not None:
            rows.append(ComparisonRow("part 2 of 4 (x.bin)", "simulated reference vs reference",
                                      "hidden", 8, 1.0, 1.0, 0.0, None, part_index=2,
                                      lsb=sim_lsb))
        return rows

    with_sim = part_rows(50.0)
    floor, where = noise_floor(with_sim, v)
    assert floor == 50.0 and "simulated reference vs reference" in where
    gate_against_floor(with_sim, floor, v)
    assert with_sim[1].ok and with_sim[1].ratio == 6.0
    alone = part_rows(None)
    floor, where = noise_floor(alone, v)
    assert floor == v.min_floor_lsb and where == "min_floor_lsb"
    gate_against_floor(alone, floor, v)
    assert not alone[1].ok and "floor_multiplier" in alone[1].problems[0]

    rng = np.random.default_rng(7)
    ref = signal(rng)
    bundle = off_by(ref, 600, rng, 0.3)
    ref2 = off_by(ref, 10, rng, 0.3)
    simulated = off_by(ref, 600, rng, 0.3)   # the simulator's own chained difference
    rows = {r.check: r for r in end_to_end_rows("end to end", bundle, ref, ref2, ref, v, SCALE,
                                                simulated)}
    assert rows["chained vs reference"].ok, rows["chained vs reference"].problems
    assert rows["chained simulated reference vs reference"].value == pytest.approx(600, rel=0.01)
    rows = {r.check: r for r in end_to_end_rows("end to end", bundle, ref, ref2, ref, v, SCALE)}
    assert not rows["chained vs reference"].ok


def test_a_limit_that_reaches_the_outputs_whole_grid_is_a_failure_not_a_pass():
    """Qualcomm's qwen3_4b checkpoint on the simulator (issue 48): the simulated reference was
    39,175 LSB from the reference in part 2, so each part's limit (floor_multiplier x that) was
    313,400 LSB, beyond a 16-bit output's whole grid of 65,535: no bundle could fail it, and
    verify said PASSED. Such a row now fails as "cannot judge", naming the floor's source; a
    floor whose limit stays inside the grid (the tiny model's 50 LSB) judges as before, and an
    8-bit output (grid 255) is judged by its own span."""
    from hexbundle.checks.verify import ComparisonRow, refuse_vacuous_limits
    v = settings()

    def gated(sim_lsb, bundle_lsb, bits):
        rows = [ComparisonRow("part 2 of 4 (x.bin)", "reference vs reference (AIMET rounding)",
                              "hidden", 8, 1.0, 1.0, 0.0, None, part_index=2, lsb=3.0),
                ComparisonRow("part 2 of 4 (x.bin)", "prefill vs reference", "hidden", 8, 1.0,
                              1.0, 0.0, None, part_index=2, lsb=bundle_lsb),
                ComparisonRow("part 2 of 4 (x.bin)", "simulated reference vs reference",
                              "hidden", 8, 1.0, 1.0, 0.0, None, part_index=2, lsb=sim_lsb)]
        for row in rows:
            row.span = float(2 ** bits - 1)
        floor, where = noise_floor(rows, v)
        gate_against_floor(rows, floor, v)
        refuse_vacuous_limits(rows, where)
        return rows[1]

    vacuous = gated(39175.0, 39175.0, 16)          # the faithful q3 bundle's own figures
    assert not vacuous.ok and "cannot judge" in vacuous.problems[0]
    assert "65535 LSB" in vacuous.problems[0]
    assert "simulated reference vs reference" in vacuous.problems[0]
    assert gated(50.0, 300.0, 16).ok                # the tiny model's: judged, and within
    assert not gated(50.0, 500.0, 16).ok            # ... and beyond 8 x 50 it fails as before
    # the span is exact: the limit one step below the grid judges, at the grid it cannot
    below = 65534.0 / v.floor_multiplier
    assert gated(below, below, 16).ok
    assert not gated(65535.0 / v.floor_multiplier, 1.0, 16).ok
    assert not gated(40.0, 1.0, 8).ok               # 8 x 40 = 320 > an 8-bit grid's 255
    assert gated(31.0, 1.0, 8).ok                   # 8 x 31 = 248


def test_end_to_end_and_token_vs_prompt_limits_are_judged_by_their_grid_too():
    """The chained row passes when either its LSB or its cosine ratio is small: with a floor
    whose LSB limit spans the grid, the LSB leg passes anything, so the row cannot judge."""
    from hexbundle.checks.verify import refuse_vacuous_limits
    v = settings()
    rng = np.random.default_rng(3)
    ref = signal(rng)
    far = off_by(ref, 30000, rng, 0.3)            # the simulator's chained run, grossly off
    rows = end_to_end_rows("end to end", far, ref, ref, ref, v, SCALE, far)
    for row in rows:
        row.span = 65535.0
    refuse_vacuous_limits(rows, "")
    chained = {r.check: r for r in rows}["chained vs reference"]
    assert not chained.ok and "cannot judge" in chained.problems[-1]
    near = off_by(ref, 40, rng, 0.3)
    rows = end_to_end_rows("end to end", near, ref, ref, ref, v, SCALE, near)
    for row in rows:
        row.span = 65535.0
    refuse_vacuous_limits(rows, "")
    assert {r.check: r for r in rows}["chained vs reference"].ok
