"""verify's gates in isolation (issue 34), each in both directions: what a faithful build
can show passes, what a broken one shows fails. The numbers are the shapes seen on real
exports: a chained end-to-end difference of ~400 LSB that two correct references share, a
token-vs-prompt KV cosine of 0.99988 that the reference itself has, top-1 vs float of 0.43."""
import numpy as np
import pytest

from hexbundle.checks.exact import aimet_quantize
from hexbundle.checks.verify import (SequenceRun, end_to_end_rows, gate_against_floor, make_row,
                                     noise_floor, token_vs_prompt_rows)
from hexbundle.config.build import VERIFY_SCHEMA, VerifySettings
from hexbundle.config.schema import check_value

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


def test_the_backstop_cosine_still_fails_a_gross_error_under_a_huge_floor():
    from hexbundle.checks.verify import part_rows, PartRuns
    rng = np.random.default_rng(2)
    x = signal(rng, n=4)
    run = lambda out: SequenceRun(out, {0: (out[0], np.zeros(0))}, {0: (out[0], np.zeros(0))})
    garbage = signal(rng, n=4)
    rows = part_rows("part 2", 2, False, 4, PartRuns(run(garbage), run(x), run(x), run(x)),
                     settings(), SCALE)
    prefill = [r for r in rows if r.check == "prefill vs reference"][0]
    assert not prefill.ok and "min_cosine_reference" in prefill.problems[0]


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
    assert ours.cos_min < 0.999 and ours.ratio > 20 and not ours.ok


def logits_agreeing(floats, share, rng):
    """Logits whose argmax is the float's at `share` of the positions (elsewhere another)."""
    out = floats.copy()
    n, width = floats.shape
    moved = rng.permutation(n)[:int(round((1 - share) * n))]
    for i in moved:
        other = (int(floats[i].argmax()) + 1 + rng.integers(width - 1)) % width
        out[i, other] = floats[i].max() + 1.0
    return out


def test_top1_against_float_is_judged_relative_to_the_references_own():
    rng = np.random.default_rng(4)
    floats = signal(rng, n=400)
    reference = logits_agreeing(floats, 0.43, rng)   # what the reference itself reaches
    v = settings(max_drift_margin=2.0)               # top-1 alone judged here
    rows = {r.check: r for r in end_to_end_rows("end to end", reference.copy(), reference,
                                                reference, floats, v, SCALE)}
    ours = rows["bundle drift from float"]
    assert ours.top1 == pytest.approx(0.43) and ours.ok, ours.problems
    worse = logits_agreeing(floats, 0.38, rng)
    rows = {r.check: r for r in end_to_end_rows("end to end", worse, reference, reference,
                                                floats, v, SCALE)}
    ours = rows["bundle drift from float"]
    assert not ours.ok and any("top1_tolerance 0.02" in p for p in ours.problems), ours.problems


def test_top1_tolerance_has_a_floor_of_two_percent():
    from hexbundle.support.errors import ConfigError
    with pytest.raises(ConfigError):
        check_value(0.01, VERIFY_SCHEMA["top1_tolerance"], "build.toml", "verify.top1_tolerance")


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


def test_a_second_reference_that_is_not_finite_leaves_the_parts_to_the_backstop_and_says_so():
    rng = np.random.default_rng(6)
    v = settings()
    ref = signal(rng)
    broken = ref.copy()
    broken[0, 0] = np.nan
    rows = [make_row("part 2", 2, "prefill vs reference", off_by(ref, 300, rng), ref, False,
                     scale=SCALE),
            make_row("part 2", 2, "reference vs reference (AIMET rounding)", broken, ref, False,
                     scale=SCALE)]
    floor, where = noise_floor(rows, v)
    assert np.isnan(floor) and where.startswith("not measurable: the second reference is not "
                                                "finite in part 2")
    gate_against_floor(rows, floor, v)
    assert rows[0].limit == "cos >= 0.9999" and rows[0].ok
    assert "noise floor not measurable" in rows[0].notes[0]
    rows[0] = make_row("part 2", 2, "prefill vs reference", signal(rng), ref, False, scale=SCALE)
    gate_against_floor(rows, floor, v)
    assert rows[0].limit == "cos >= 0.9999"
