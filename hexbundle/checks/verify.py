"""`doit verify`: prove on the host that a built bundle computes what the export's encodings
specify (docs/verify.md).

The bundle's context binaries run on the CPU (hexbundle.runtime, every activation encoding
applied) chained as Genie chains them: the bins in genie_config.json's `ctx-bins` order, part i's
main output feeding part i+1, the prompt prefilled through the prompt (AR 128) graphs in chunks,
then tokens decoded one at a time through the token (AR 1) graphs with each part's KV cache
carried between steps, the mask and RoPE cos/sin built from genie_config.json as the runtime
builds them. The reference is the export's quantized model (runtime.qdq: its ONNX with its
encodings applied, run by onnxruntime); the float ONNX runs too, for the drift.

Checks, per part (a table row each):
  topology/encodings/weights  exactly against the export's files (checks/exact.py)
  prefill/decode vs reference the bundle and the reference fed the same input: its largest
                              error at most floor_multiplier x the noise floor (the two correct
                              references' own difference, measured in the same run), in LSBs of
                              the output encoding; a float output by its relative difference
  token vs prompt             the bundle's token graph, fed the prefill's KV cache of the
                              positions before p, against its prompt graph at position p (p =
                              the last position of each chunk), output and ("... kv") the KV
                              entry; "reference token vs prompt" the same for the reference
  drift from float (chained)  the bundle against the float ONNX, each chained (reported)
and end to end: the bundle's logits against the reference's, each chained on its own, against
the two references' own chained difference (gated); the float drift and top-1 of both
(reported). A model with several context lengths is checked at each of them (rows labelled
"cl C"). No limit is a constant: each is a multiple of what the run measures (docs/verify.md).
Every comparison is decided by the difference first (compare): two identical vectors are
identical, all-zero ones too.

The sequence: `prompt_tokens` + `decode_steps` token ids of ordinary text (runtime.prompt: the
bundle's tokenizer, sentences in the seed's order), fed to both sides (teacher forcing), so the
comparison does not depend on earlier argmax choices. It runs
part by part -- the whole sequence through part 1 for every side, then part 2, ... -- which gives
exactly the numbers of a step-by-step run (part i at step t depends only on part i-1 up to t)
while only one part (its mmap'd bin and its float ONNX) is open at a time.

The runtime that runs both sides is hexbundle.runtime: `parts` opens the bins and makes a part
session over a bin or over the float ONNX (`onnx_graph`); host-side text generation, which uses
the same sessions, is hexbundle.runtime.generation. This module compares and reports.

Heavy imports (onnx, onnxruntime) happen inside the runtime's functions: dodo.py imports this
module and a no-op `doit` must stay fast.
"""
from __future__ import annotations

import math
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from hexbundle.config.build import VerifySettings
from hexbundle.config.layout import Layout
from hexbundle.formats.genie import GenieSettings, read_genie_config
from hexbundle.formats.npyrows import RowsWriter, mapped_afresh
from hexbundle.runtime.parts import (bundle_session, onnx_session, open_bundle_parts,
                                     reference_graphs, reference_session, rope_settings)
from hexbundle.runtime.prompt import ordinary_prompt
from hexbundle.support import table as tables
from hexbundle.support.atomic import temp_dir, write_json
from hexbundle.support.errors import VerifyError



# ============================================================================ the bundle's runtime config


def check_runtime_settings(layout: Layout, genie: GenieSettings) -> None:
    """The values the runtime builds its inputs from must be the ones the model was exported
    with. (A wrong rope-theta barely moves a random-weight model's numbers, so it is compared
    here rather than left to the cosines.)"""
    cfg = layout.cfg
    a = cfg.model.architecture
    htp = "dialog.engine.backend.QnnHtp"
    largest = "graphs.context_length" if len(cfg.model.context_lengths) == 1 else \
        "the largest of graphs.context_lengths"
    rope = "dialog.engine.model.positional-encoding" if genie.rope_scaling else htp
    pairs = [("dialog.context.size", genie.context_size, largest, cfg.model.context_length),
             ("dialog.context.n-vocab", genie.n_vocab, "architecture.vocab_size", a.vocab_size),
             (f"{rope}.rope-theta", genie.rope_theta, "architecture.rope_theta", a.rope_theta),
             (f"{rope}.{'rope-dim' if genie.rope_scaling else 'pos-id-dim'}", genie.pos_id_dim,
              "architecture.head_dim / 2", a.pos_id_dim),
             (f"{htp}.kv-dim", genie.head_dim, "architecture.head_dim", a.head_dim),
             ("dialog.engine.model.positional-encoding.rope-scaling",
              describe_scaling(genie.rope_scaling), "architecture.rope_scaling",
              describe_scaling(a.rope_scaling))]
    wrong = [f"'{key}' is {got} but {layout.model_config_path.name} {source} is {want}"
             for key, got, source, want in pairs if got != want]
    if wrong:
        raise VerifyError(f"{genie.path}: {'; '.join(wrong)}: the runtime would build its "
                          f"inputs from the wrong values; rebuild the bundle with `doit bundle`")


def describe_scaling(scaling) -> str:
    if scaling is None:
        return "none (plain RoPE)"
    return (f"{scaling.rope_type} (factor {scaling.factor:g}, low/high-freq-factor "
            f"{scaling.low_freq_factor:g}/{scaling.high_freq_factor:g}, original max positions "
            f"{scaling.original_max_position_embeddings})")


# ============================================================================ running a sequence


@dataclass
class SequenceRun:
    outputs: np.ndarray           # (T, width): the main output at every position
    prompt_rows: dict             # position -> (main output row, KV entry) of the prompt graph
    token_rows: dict              # position -> the same from the token graph


def run_sequence(session, x: np.ndarray, n_prompt: int,
                 spill: Optional[Path] = None) -> SequenceRun:
    """Prefill x[:n_prompt] in chunks through the prompt graph, then decode the rest one token at
    a time through the token graph; also run the token graph at the last position of each chunk
    with the cache of the positions before it (the prompt-vs-token check). One graph is open at
    a time (close() after its last use) so a part's two float graphs never coexist. `spill`: a
    .npy file the outputs are written to as they come (SequenceRows), read back mapped."""
    ar = session.ar("prompt")
    outputs = SequenceRows(x.shape[0], spill)
    forks, prompt_rows = {}, {}
    for start in range(0, n_prompt, ar):
        n = min(ar, n_prompt - start)
        chunk = session.run("prompt", x[start:start + n], n)
        outputs.add(chunk)
        last = start + n - 1
        forks[last] = session.fork(last)
        prompt_rows[last] = (np.array(chunk[n - 1]), session.kv_entry(last))
        del chunk
    _close(session.graphs["prompt"])
    token_rows = {}
    for p, fork in forks.items():
        row = fork.run("token", x[p:p + 1], 1)[0]
        token_rows[p] = (row, fork.kv_entry(p))
    del forks   # their copies of the KV cache
    for t in range(n_prompt, x.shape[0]):
        outputs.add(session.run("token", x[t:t + 1], 1))
    _close(session.graphs["token"])
    return SequenceRun(outputs.array(), prompt_rows, token_rows)


class SequenceRows:
    """A sequence's main output, a chunk of positions at a time. Without a file: the chunks,
    concatenated at the end. With one: each chunk written to it as it comes
    (formats.npyrows) and the whole read back as a read-only memmap, so a sequence held across
    later sessions is page cache, not this process's memory (a 7B logits sequence, 168 x 152064
    float32, is 97 MiB: verify keeps up to five of them while a part's 3 GiB reference runs)."""

    def __init__(self, total: int, path: Optional[Path] = None):
        self._chunks = []
        self._writer = None if path is None else RowsWriter(path, total)

    def add(self, chunk: np.ndarray) -> None:
        if self._writer is None:
            self._chunks.append(chunk)
        else:
            self._writer.add(chunk)

    def array(self) -> np.ndarray:
        return np.concatenate(self._chunks) if self._writer is None else self._writer.close()


def _close(executor) -> None:
    close = getattr(executor, "close", None)
    if close:
        close()


# ============================================================================ rows


@dataclass
class ComparisonRow:
    """One row of the table. `value` is what the row measures (in `unit`); a gated row has a
    `limit` it must stay within, with `floor` and `ratio` (value / floor) shown beside it, so a
    thin margin is visible; a reported row has none."""
    part: str                     # "part 2 of 4 (x.bin)" or "end to end"
    check: str
    what: str                     # "hidden" | "logits" | "kv" | "exact"
    positions: int
    cos_min: float
    cos_mean: float
    max_abs: float
    top1: Optional[float]         # logits only
    part_index: int = 0
    lsb: Optional[float] = None   # max_abs in units of the output encoding's scale
    rel: Optional[float] = None   # the largest relative difference of a position (compare)
    refs: Optional[float] = None  # the two references' own difference on the same positions,
                                  # in the row's unit (LSB, or rel for a float output)
    value: Optional[float] = None
    unit: str = ""
    floor: Optional[float] = None
    ratio: Optional[float] = None
    limit: str = ""               # "" : reported, not gated
    allowed: Optional[float] = None   # the limit in `unit` (a gated row's)
    span: Optional[float] = None  # the output grid's whole span in LSB (2^bitwidth - 1): no
                                  # two values on it differ by more
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def gated(self) -> bool:
        return bool(self.limit)


# A float output has no encoding's step to count its error in: its step is float32's own,
# relative to the values (2^-23), so min_floor_lsb of those is its least floor.
FLOAT32_STEP = float(np.finfo(np.float32).eps)


# positions compared at a time: float64 copies of a block of rows, never of a whole logits
# sequence (192 x 152064 of the 7B shape: 234 MB each)
COMPARE_ROWS = 16


def compare(got: np.ndarray, want: np.ndarray, logits: bool) -> dict:
    """Per position (row): the cosine and the relative difference |got - want| / max(|got|,
    |want|), both decided by the difference first: two identical rows (all-zero ones too) have
    cosine 1 and difference 0, never a ratio undefined at zero; a zero row against a non-zero
    one has cosine 0 and difference 1. A NaN anywhere stays NaN (and fails every gate)."""
    got = got.reshape(got.shape[0], -1)
    want = want.reshape(want.shape[0], -1)
    cos, rel, biggest, top1 = [], [], [], []
    for start in range(0, got.shape[0], COMPARE_ROWS):
        g = got[start:start + COMPARE_ROWS].astype(np.float64)
        w = want[start:start + COMPARE_ROWS].astype(np.float64)
        c, r, m = _compare_rows(g, w)
        cos.append(c)
        rel.append(r)
        biggest.append(m)
        if logits:
            top1.append(g.argmax(1) == w.argmax(1))
    cos, rel = np.concatenate(cos or [np.ones(0)]), np.concatenate(rel or [np.zeros(0)])
    return {"cos_min": _min(cos), "cos_mean": float(cos.mean()) if cos.size else 1.0,
            "max_abs": float(np.max(biggest)) if biggest else 0.0, "rel": _max(rel),
            "top1": float(np.concatenate(top1).mean()) if logits and top1 else None}


def _compare_rows(got: np.ndarray, want: np.ndarray) -> tuple:
    """(cosine per row, relative difference per row, largest |difference|) of a block."""
    diff = got - want
    finite = ~np.isnan(diff).any(axis=1)
    same = finite & ~np.any(diff != 0, axis=1)
    dot = np.einsum("ij,ij->i", got, want)
    g, w = np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1)
    norms, larger = g * w, np.maximum(g, w)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(same, 1.0, np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0),
                                           np.where(np.isnan(norms), np.nan, 0.0)))
        rel = np.where(same, 0.0, np.linalg.norm(diff, axis=1)
                       / np.where(larger > 0, larger, np.nan))
    np.abs(diff, out=diff)
    return cos, rel, float(diff.max()) if diff.size else 0.0


def _min(values: np.ndarray) -> float:
    """The smallest value, NaN if any is NaN (numpy's min propagates it), 1 if none."""
    return float(values.min()) if values.size else 1.0


def _max(values: np.ndarray) -> float:
    return float(values.max()) if values.size else 0.0


def cosine_distance(row) -> float:
    """1 - the row's smallest cosine, 0 for identical vectors (never below 0 by rounding)."""
    return max(0.0, 1.0 - row.cos_min) if not math.isnan(row.cos_min) else math.nan


def ratio(value: float, floor: float) -> float:
    """value / floor by the difference first: 0 when value is 0 (whatever the floor), infinite
    when only the floor is 0."""
    if value == 0:
        return 0.0
    return value / floor if floor > 0 else math.inf


def make_row(label: str, index: int, check: str, got, want, logits: bool, what: str = "",
             scale: Optional[float] = None) -> ComparisonRow:
    m = compare(got, want, logits)
    return ComparisonRow(label, check, what or ("logits" if logits else "hidden"),
                         int(got.shape[0]), m["cos_min"], m["cos_mean"], m["max_abs"],
                         m["top1"], part_index=index,
                         lsb=m["max_abs"] / scale if scale else None, rel=m["rel"])


def _main_output_encoding(session) -> Optional[dict]:
    graph = next(iter(session.graphs.values()))
    return (getattr(graph, "info", None) and graph.info.activations or {}).get(session.main_output)


def output_scale(session) -> Optional[float]:
    """The scale of the main output's activation encoding in the bin (an int encoding's step)."""
    enc = _main_output_encoding(session)
    if not enc or enc.get("dtype", "int") != "int" or len(enc["scale"]) != 1:
        return None
    return float(enc["scale"][0])


def output_span(session) -> Optional[float]:
    """The whole grid of the main output's int encoding, in its steps: 2^bitwidth - 1."""
    return _span(_main_output_encoding(session))


def kv_entry_span(session) -> Optional[float]:
    """The narrowest grid among the KV outputs' int encodings, in steps (2^bitwidth - 1)."""
    if not session.layers:
        return None
    graph = session.graphs["prompt"]
    encodings = (getattr(graph, "info", None) and graph.info.activations) or {}
    from hexbundle.runtime.conventions import kv_names
    spans = [_span(encodings.get(name)) for layer in session.layers
             for name in kv_names(layer, "out")]
    return None if None in spans else min(spans)


def _span(enc: Optional[dict]) -> Optional[float]:
    if not enc or enc.get("dtype", "int") != "int" or not enc.get("bitwidth"):
        return None
    return float(2 ** int(enc["bitwidth"]) - 1)


def refuse_vacuous_limits(rows: list, where: str) -> None:
    """A gated row whose limit reaches its output grid's whole span judges nothing: no bundle,
    however wrong, differs from the reference by more than the grid (an int output's values are
    on it). That is a failure of the verify, not a pass: the floor the limit comes from (`where`
    for the parts; the row's own notes otherwise) is as far from the reference as any output
    can be, so whatever measured it differs from the reference for a reason to find first."""
    for row in rows:
        if row.unit != "LSB" or row.allowed is None or row.span is None:
            continue
        if row.allowed >= row.span:
            source = where if row.check in ("prefill vs reference", "decode vs reference") \
                else "its floor's"
            row.problems.append(
                f"cannot judge: its limit {row.allowed:.1f} LSB reaches the output's whole "
                f"grid ({row.span:.0f} LSB), so no bundle could fail it; the floor "
                f"{row.floor:.1f} LSB ({source}) must come down before verify can say anything "
                f"of this part")


def kv_entry_scales(session) -> Optional[np.ndarray]:
    """The grid step of every element of the part's KV entry (session.kv_entry's layout: each
    layer's key then value), from the bin's encodings of past_key/value_<layer>_out; None if
    any of them is not a per-tensor int encoding (a float KV cache: judged by cosine)."""
    from hexbundle.runtime.conventions import kv_names
    if not session.layers:
        return None
    graph = session.graphs["prompt"]
    encodings = (getattr(graph, "info", None) and graph.info.activations) or {}
    if session.n_past < 1:
        return None
    pieces = []
    for layer in session.layers:
        for name, cache, axis in zip(kv_names(layer, "out"),
                                     (session._keys[layer], session._values[layer]), (-1, -2)):
            enc = encodings.get(name)
            if not enc or enc.get("dtype", "int") != "int" or len(enc["scale"]) != 1:
                return None
            size = cache.size // cache.shape[axis]
            pieces.append(np.full(size, float(enc["scale"][0])))
    return np.concatenate(pieces)


def recompiled_row(label: str, index: int, problems: list, note: str,
                   check: str = "") -> ComparisonRow:
    """An ortqnn part's exact row (checks/simulated.py): its bin against the bytes the compile
    makes from its QDQ models."""
    from hexbundle.checks.simulated import RECOMPILED
    row = ComparisonRow(label, check or RECOMPILED, "exact", 1, math.nan, math.nan, math.nan,
                        None,
                        part_index=index, limit="identical", value=float(len(problems)),
                        unit="differences", problems=list(problems))
    row.notes.append(note)
    return row


def rebuilt_row(label: str, index: int, problems: list, note: str) -> ComparisonRow:
    """An ortqnn part's other exact row: its QDQ models against their rebuild from the
    export's files (checks/simulated.rebuilt_problems)."""
    from hexbundle.checks.simulated import REBUILT
    return recompiled_row(label, index, problems, note, REBUILT)


def exact_rows(label: str, index: int, reader, graphs: list) -> list:
    """The exact checks of a part (checks/exact.py) as rows: no threshold, any difference fails."""
    from hexbundle.checks.exact import exact_checks
    rows = []
    for result in exact_checks(reader, graphs):
        row = ComparisonRow(label, result.check, "exact", result.compared, math.nan, math.nan,
                            math.nan, None, part_index=index, limit="identical",
                            value=float(len(result.problems)), unit="differences")
        row.notes.append(result.summary())
        if result.problems:
            row.problems.append(f"{len(result.problems)} difference(s): "
                                + "; ".join(result.problems[:3])
                                + (" ..." if len(result.problems) > 3 else ""))
        rows.append(row)
    return rows


@dataclass
class PartRuns:
    """A part's sequences at one context length: the bundle, the two references fed the
    bundle's input, and the float chained on its own (None: its row comes later, drift_row)."""
    bundle: SequenceRun
    reference: SequenceRun        # half-to-even rounding (onnxruntime's QuantizeLinear)
    reference2: SequenceRun       # AIMET's rounding: the second correct reference
    floats: Optional[SequenceRun] = None
    simulated: Optional[SequenceRun] = None   # ortqnn: the reference run on the simulator


def part_rows(label: str, index: int, logits: bool, n_prompt: int, runs: PartRuns,
              v: VerifySettings, scale: Optional[float],
              kv_scales: Optional[np.ndarray] = None) -> list:
    """A part's numeric rows: the bundle vs the reference (gated against the noise floor once
    every part has run: gate_against_floor), the two references against each other (the
    floor), token vs prompt relative to the reference's own, and the drift from float."""
    b, ref, ref2 = runs.bundle, runs.reference, runs.reference2
    rows = []
    spans = [("prefill", slice(0, n_prompt))]
    if b.outputs.shape[0] > n_prompt:
        spans.append(("decode", slice(n_prompt, None)))
    for name, span in spans:
        row = make_row(label, index, f"{name} vs reference", b.outputs[span],
                       ref.outputs[span], logits, scale=scale)
        # the two correct references' own difference on the same positions: a float output's
        # floor (gate_against_floor), shown beside an int output's
        refs = compare(ref2.outputs[span], ref.outputs[span], logits)
        row.refs = refs["max_abs"] / scale if scale else refs["rel"]
        rows.append(row)
    rows.append(make_row(label, index, "reference vs reference (AIMET rounding)", ref2.outputs,
                         ref.outputs, logits, scale=scale))
    rows += token_vs_prompt_rows(label, index, logits, b, ref, ref2, v, scale, kv_scales,
                                 runs.simulated)
    if runs.floats is not None:
        rows.append(drift_row(label, index, logits, b.outputs, runs.floats.outputs))
    return rows


def drift_row(label: str, index: int, logits: bool, bundle: np.ndarray,
              floats: np.ndarray) -> ComparisonRow:
    return make_row(label, index, "drift from float (chained)", bundle, floats, logits)


def _token_vs_prompt(run: SequenceRun) -> tuple:
    positions = sorted(run.prompt_rows)
    token = [run.token_rows[p] for p in positions]
    prompt = [run.prompt_rows[p] for p in positions]
    return (np.stack([t[0] for t in token]), np.stack([p[0] for p in prompt]),
            np.stack([t[1] for t in token]), np.stack([p[1] for p in prompt]))


def _max_lsb(a: np.ndarray, b: np.ndarray, scale) -> float:
    return float((np.abs(a.astype(np.float64) - b) / scale).max()) if a.size else 0.0


def token_vs_prompt_rows(label: str, index: int, logits: bool, bundle: SequenceRun,
                         reference: SequenceRun, reference2: SequenceRun, v: VerifySettings,
                         scale: Optional[float], kv_scales: Optional[np.ndarray],
                         simulated: Optional[SequenceRun] = None) -> list:
    """The token graph fed the prefill's KV cache against the prompt graph at the same position,
    output and KV entry, in LSBs of each tensor's encoding: the bundle's largest difference at
    most token_vs_prompt_factor x its floor -- the reference's own difference (an 8-bit KV cache
    fed back makes the export's two graphs differ) or, where larger, the two correct
    references' difference on the same entries, and at least min_floor_lsb (two correct
    implementations whose float order differs land on neighbouring grid points at a near-tie,
    token graph against prompt graph as much as one reference against the other). A tensor
    with no int encoding is judged by cosine, relative to the same two. `simulated` (an ortqnn
    bundle's): the reference run on the simulator, whose own token-vs-prompt difference joins
    the floor (the simulator's share, as in the noise floor)."""
    rows = []
    b_out, b_prompt, b_kv, b_kv_prompt = _token_vs_prompt(bundle)
    r_out, r_prompt, r_kv, r_kv_prompt = _token_vs_prompt(reference)
    q_out, q_prompt, q_kv, q_kv_prompt = _token_vs_prompt(reference2)
    s_out, s_prompt, s_kv, s_kv_prompt = _token_vs_prompt(simulated or reference)
    pairs = [("", logits, "", scale, (b_out, b_prompt), (r_out, r_prompt), (q_out, q_prompt),
              (s_out, s_prompt))]
    if b_kv.size:   # a part with layers: the new KV entries must agree too
        pairs.append((" kv", False, "kv", kv_scales, (b_kv, b_kv_prompt), (r_kv, r_kv_prompt),
                      (q_kv, q_kv_prompt), (s_kv, s_kv_prompt)))
    for suffix, is_logits, what, grid, (bg, bw), (rg, rw), (qg, qw), (sg, sw) in pairs:
        ours = make_row(label, index, "token vs prompt" + suffix, bg, bw, is_logits, what)
        theirs = make_row(label, index, "reference token vs prompt" + suffix, rg, rw,
                          is_logits, what)
        theirs.notes.append("the export's own property (the reference's value)")
        if grid is not None:
            theirs.value, theirs.unit = _max_lsb(rg, rw, grid), "LSB"
            refs = max(_max_lsb(qg, rg, grid), _max_lsb(qw, rw, grid))
            refs = refs if math.isfinite(refs) else 0.0   # a broken second reference: no say
            sim = _max_lsb(sg, sw, grid)
            sim = sim if math.isfinite(sim) else 0.0
            floor = max(theirs.value, refs, sim, float(v.min_floor_lsb))
            ours.value, ours.unit, ours.floor = _max_lsb(bg, bw, grid), "LSB", floor
            ours.ratio = ratio(ours.value, floor)
            allowed = ours.allowed = v.token_vs_prompt_factor * floor
            ours.limit = f"<= {v.token_vs_prompt_factor:g} x floor = {allowed:.1f} LSB"
            ours.notes.append(f"floor: the reference's own {theirs.value:.1f} LSB, the two "
                              f"references' {refs:.1f} LSB, min_floor_lsb {v.min_floor_lsb:g}"
                              + (f", the reference's on the simulator {sim:.1f} LSB"
                                 if simulated is not None else ""))
            if not (ours.value <= allowed):
                ours.problems.append(f"{ours.value:.1f} LSB > {v.token_vs_prompt_factor:g} x "
                                     f"the floor {floor:.1f} LSB (token_vs_prompt_factor)")
        else:   # a float tensor: its relative difference, against the same two
            theirs.value, theirs.unit = theirs.rel, "rel"
            refs = max(compare(qg, rg, False)["rel"], compare(qw, rw, False)["rel"])
            refs = refs if math.isfinite(refs) else 0.0
            sim = compare(sg, sw, False)["rel"]
            sim = sim if math.isfinite(sim) else 0.0
            least = v.min_floor_lsb * FLOAT32_STEP
            floor = max(theirs.rel, refs, sim, least)
            allowed = v.token_vs_prompt_factor * floor
            ours.value, ours.unit, ours.floor = ours.rel, "rel", floor
            ours.ratio = ratio(ours.value, floor)
            ours.limit = f"<= {v.token_vs_prompt_factor:g} x floor = {allowed:.3g}"
            ours.notes.append(f"floor: the reference's own {theirs.rel:.3g}, the two references' "
                              f"{refs:.3g}, min_floor_lsb float32 steps {least:.3g}")
            if not (ours.value <= allowed):
                ours.problems.append(f"relative difference {ours.value:.3g} > "
                                     f"{v.token_vs_prompt_factor:g} x the floor {floor:.3g}")
        rows += [ours, theirs]
    return rows


# the rows the noise floor L is the largest of: the two correct references' difference, and for
# an ortqnn bundle the simulator's on the reference itself (checks/simulated.py)
FLOOR_CHECKS = ("reference vs reference (AIMET rounding)", "simulated reference vs reference")


def noise_floor(rows: list, v: VerifySettings) -> tuple:
    """(L, where): the largest error between the two correct references over every part with an
    int output encoding, in LSBs of the part's output encoding, and at least min_floor_lsb. A
    part whose second reference is not finite has no say (named in `where`)."""
    measured = [(r.lsb, r.part, r.check) for r in rows
                if r.check in FLOOR_CHECKS and r.lsb is not None]
    broken = [part for lsb, part, _ in measured if not math.isfinite(lsb)]
    worst = max(((lsb, part, check) for lsb, part, check in measured if math.isfinite(lsb)),
                default=(0.0, "no part", ""))
    left_out = (f"; not measurable in {', '.join(broken)} (its second reference is not "
                "finite): left out") if broken else ""
    if worst[0] >= v.min_floor_lsb:   # named as before for the two references
        which = "reference vs reference" if worst[2] == FLOOR_CHECKS[0] else worst[2]
        return worst[0], f"{worst[1]}, {which}{left_out}"
    return float(v.min_floor_lsb), f"min_floor_lsb{left_out}"


def gate_against_floor(rows: list, floor: float, v: VerifySettings) -> None:
    """Each part's bundle-vs-reference error at most floor_multiplier x its floor: in LSBs of
    its output encoding, the noise floor L of every part; a float output (no int encoding) by
    its relative difference, against the two references' own on the same positions, at least
    min_floor_lsb float32 steps. Nothing else judges: no constant.

    A float output's floor is the two references' own difference over all of the part's
    positions, not over the row's alone: where they differ (a weight at a rounding tie, met by
    the tokens that use it) is a property of the part, and which of those tokens fall among the
    32 decode positions is the prompt's luck (a faithful Qwen3 bundle failed decode by 16x a
    floor of 0 while its prefill, at the same part, met the references' 2e-05)."""
    part_refs = _part_reference_differences(rows)
    for row in rows:
        if row.part_index and row.check in ("prefill vs reference", "decode vs reference"):
            if row.lsb is not None:
                row.value, row.unit, row.floor = row.lsb, "LSB", floor
                where = "the noise floor"
            else:
                least = v.min_floor_lsb * FLOAT32_STEP
                refs = max(_finite_or_zero(row.refs), part_refs.get(row.part_index, 0.0))
                row.value, row.unit, row.floor = row.rel, "rel", max(refs, least)
                where = "the two references' own relative difference"
                row.notes.append(f"no int output encoding: relative difference, floor the two "
                                 f"references' {refs:.3g} or min_floor_lsb float32 steps "
                                 f"{least:.3g}")
            limit = row.allowed = v.floor_multiplier * row.floor
            row.ratio = ratio(row.value, row.floor)
            row.limit = f"<= {v.floor_multiplier:g} x floor = {_in_unit(limit, row.unit)}"
            if not (row.value <= limit):   # also a NaN
                row.problems.append(f"{_in_unit(row.value, row.unit)} > {v.floor_multiplier:g} "
                                    f"x {where} {_in_unit(row.floor, row.unit)} "
                                    "(floor_multiplier)")
        elif row.check in FLOOR_CHECKS:
            row.value, row.unit = (row.lsb, "LSB") if row.lsb is not None else (row.rel, "rel")


def _finite_or_zero(value: Optional[float]) -> float:
    return value if value is not None and math.isfinite(value) else 0.0


def _part_reference_differences(rows: list) -> dict:
    """{part_index: the two references' largest relative difference over the part's positions}
    (its "reference vs reference" rows, one per context length)."""
    found: dict = {}
    for row in rows:
        if row.part_index and row.check == "reference vs reference (AIMET rounding)":
            found[row.part_index] = max(found.get(row.part_index, 0.0), _finite_or_zero(row.rel))
    return found


def _in_unit(value: float, unit: str) -> str:
    return f"{value:.1f} LSB" if unit == "LSB" else f"{value:.3g}"


def end_to_end_rows(label: str, bundle: np.ndarray, reference: np.ndarray,
                    reference2: np.ndarray, floats: np.ndarray, v: VerifySettings,
                    scale: Optional[float], simulated: Optional[np.ndarray] = None) -> list:
    """Chained through every part, each side on its own outputs: the bundle vs the reference,
    judged against the two references' own chained difference, and failing only on gross error:
    more than chained_max_ratio x theirs both in its largest error (LSBs of the output encoding,
    at least min_floor_lsb; a float output's relative difference) and in its cosine distance
    (1 - cosine). The float drift and top-1 against float of both are reported: the bundle's
    distance from float is at most the reference's plus its distance from the reference (the
    triangle inequality, per position), which the chained row gates. `simulated` (an ortqnn
    bundle's): the reference run on the simulator, chained on its own; its difference from the
    reference is a correct implementation's too, and the floor is the larger of the two."""
    chained = make_row(label, 0, "chained vs reference", bundle, reference, True, scale=scale)
    refs = make_row(label, 0, "chained reference vs reference (AIMET rounding)", reference2,
                    reference, True, scale=scale)
    extra, basis = [], refs
    if simulated is not None:
        sim = make_row(label, 0, "chained simulated reference vs reference", simulated,
                       reference, True, scale=scale)
        extra, basis = [sim], _wider(replace(refs, notes=[]), sim)
    if scale:
        floor = max(basis.lsb, float(v.min_floor_lsb)) if math.isfinite(basis.lsb) \
            else float(v.min_floor_lsb)
        chained.value, chained.unit, chained.floor = chained.lsb, "LSB", floor
        chained.allowed = v.chained_max_ratio * floor
    else:
        least = v.min_floor_lsb * FLOAT32_STEP
        floor = max(basis.rel, least) if math.isfinite(basis.rel) else least
        chained.value, chained.unit, chained.floor = chained.rel, "rel", floor
    chained.ratio = ratio(chained.value, floor)
    ours_cos, refs_cos = cosine_distance(chained), cosine_distance(basis)
    cos_ratio = ratio(ours_cos, refs_cos if math.isfinite(refs_cos) else 0.0)
    chained.limit = f"ratio <= {v.chained_max_ratio:g} or 1-cos ratio <= {v.chained_max_ratio:g}"
    chained.notes.append(f"1 - cosine {ours_cos:.3g}, the references' own {refs_cos:.3g} "
                         f"(ratio {cos_ratio:.2f})")
    if not (chained.ratio <= v.chained_max_ratio or cos_ratio <= v.chained_max_ratio):
        chained.problems.append(
            f"{_in_unit(chained.value, chained.unit)} is {chained.ratio:.1f} x and 1 - cosine "
            f"{ours_cos:.3g} is {cos_ratio:.1f} x the references' own chained difference "
            f"(> chained_max_ratio {v.chained_max_ratio:g})")
    refs.value, refs.unit = chained.floor, chained.unit
    for row in extra:
        row.value, row.unit = (row.lsb, "LSB") if scale else (row.rel, "rel")
        row.notes.append("the reference run on the simulator, chained: the floor is the larger "
                         "of this and the two references'")
    ours = make_row(label, 0, "bundle drift from float", bundle, floats, True)
    theirs = make_row(label, 0, "reference drift from float", reference, floats, True)
    ours.value, ours.unit, ours.floor = cosine_distance(ours), "1-cos", cosine_distance(theirs)
    ours.notes.append(f"top-1 vs float: the bundle's {ours.top1:.3f}, the reference's "
                      f"{theirs.top1:.3f}; bounded by the reference's drift plus the chained "
                      "difference (reported)")
    theirs.notes.append("the export's own quantization (reported)")
    return [chained, refs, *extra, ours, theirs]


def _wider(refs: ComparisonRow, sim: ComparisonRow) -> ComparisonRow:
    """(A copy of) the references' chained row with the simulator's figure where its run of the
    reference is further from the reference (largest error, relative difference, cosine): the
    end-to-end floor of an ortqnn bundle."""
    def larger(a, b):
        return b if (b is not None and math.isfinite(b) and (a is None or not math.isfinite(a)
                                                              or b > a)) else a
    refs.lsb, refs.rel = larger(refs.lsb, sim.lsb), larger(refs.rel, sim.rel)
    if math.isfinite(sim.cos_min) and not sim.cos_min >= refs.cos_min:
        refs.cos_min = sim.cos_min
    return refs


# ============================================================================ verify


def _num(value: Optional[float], digits: int) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _verdict(row: ComparisonRow) -> str:
    if not row.ok:
        return "FAIL: " + "; ".join(row.problems)
    return "ok" if row.gated else "(reported)"


def _value(row: ComparisonRow) -> str:
    if row.value is None:
        return ""
    if row.unit == "differences":
        return f"{row.value:.0f} differences"
    digits = 1 if row.unit == "LSB" else 6 if row.unit == "cos" else None
    text = f"{row.value:.{digits}f}" if digits is not None else f"{row.value:.3g}"
    return f"{text} {row.unit}"


def _short_part(row: ComparisonRow) -> str:
    """"part 2 of 4 (x.bin) cl 512" -> "part 2/4 cl 512": the terminal's part column."""
    match = re.fullmatch(r"part (\d+) of (\d+) \(.*?\)(.*)", row.part)
    return f"part {match[1]}/{match[2]}{match[3]}" if match else row.part


def _short_limit(row: ComparisonRow) -> str:
    """The limit as a number (the full rule is in report.json and the docs)."""
    return row.limit.split(" = ")[-1] if " = " in row.limit else \
        row.limit.split(" or ")[0] if row.unit != "differences" else row.limit


def _wrapped(text: str) -> list:
    """A header line within TERMINAL_COLUMNS, its continuations indented."""
    import textwrap
    return textwrap.wrap(text, TERMINAL_COLUMNS, subsequent_indent="    ",
                         break_on_hyphens=False) or [""]


def json_safe(value):
    """`value` with every NaN and infinity as null: report.json and `verify --json` are strict
    JSON (JavaScript's parser, among others, refuses NaN), and a number that is not one says
    "not measured" here (the row's problems and notes say why)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# what runs a reference-backend bundle (hexbundle.runtime); an ortqnn bundle's executor is read
# from its bins and DLLs (backends/ortqnn_sim.describe_executor)
INTERPRETER = "hexbundle.runtime's interpreter of the bins (numpy, on the CPU)"
SIMULATOR_DIR = "simulator"     # under the verify directory: an ortqnn bundle's own bins
SIMULATED_REFERENCE = "simulated reference vs reference"   # checks/simulated.py's

# the terminal's width the verdict table is kept within
TERMINAL_COLUMNS = 120


@dataclass
class Report:
    model: str
    bundle: str
    prompt_tokens: int
    decode_steps: int
    rows: list
    seconds: float
    noise_floor_lsb: float = 0.0
    noise_floor_from: str = ""
    seed: int = 0
    prompt_text: str = ""          # the ordinary text the token ids were taken from
    prompt_ids: list = field(default_factory=list)   # every id fed (prompt and decode)
    executor: str = ""             # what produced the bundle's outputs
    timings: dict = field(default_factory=dict)      # part label -> {what: seconds}

    @property
    def failures(self) -> list:
        return [r for r in self.rows if not r.ok]

    @property
    def ok(self) -> bool:
        return not self.failures

    def first_divergence(self) -> list:
        """The failing rows of the earliest failing part (end to end only if no part failed)."""
        failing = self.failures
        if not failing:
            return []
        first = min(r.part_index or math.inf for r in failing)
        return [r for r in failing if (r.part_index or math.inf) == first]

    def _header(self) -> list:
        preview = self.prompt_text.replace("\n", " ")
        room = TERMINAL_COLUMNS - 60
        preview = preview if len(preview) <= room else preview[:room - 3] + "..."
        return [f"verify {self.model}: {self.bundle}",
                f"{self.prompt_tokens} prompt tokens + {self.decode_steps} decode steps: "
                f"{len(self.prompt_ids)} ids of ordinary text (seed {self.seed})",
                f"  {preview!r}",
                *_wrapped(f"bundle outputs by: {self.executor}"),
                f"noise floor {self.noise_floor_lsb:.1f} LSB: {self.noise_floor_from}"]

    def table(self, report_path: str = "") -> str:
        """The terminal's verdict table: every gated row, one short line each (within
        TERMINAL_COLUMNS), then each failure in full. The full table, reported rows and notes
        too, is report.json's (full_table() prints it)."""
        body = [(_short_part(r), r.check, _value(r),
                 "" if r.floor is None else f"{r.floor:.3g}",
                 "" if r.ratio is None or math.isnan(r.ratio) else f"{r.ratio:.2f}",
                 _short_limit(r), "ok" if r.ok else "FAIL")
                for r in self.rows if r.gated]
        lines = self._header() + tables.table(
            ("part", "check", "value", "floor", "ratio", "limit", "verdict"), body,
            right={3, 4})
        lines += self.timing_lines()
        lines += [f"FAIL {_short_part(r)}, {r.check}: {'; '.join(r.problems)}"
                  for r in self.failures]
        where = f"; every row, with the reported ones: {report_path}" if report_path else ""
        lines.append(f"{'ok' if self.ok else 'FAILED'} in {self.seconds:.1f}s{where}")
        return "\n".join(lines)

    def timing_lines(self) -> list:
        """One line per part: what took how long (seconds; "runs": how many graph runs)."""
        out = []
        for label, seconds in self.timings.items():
            match = re.fullmatch(r"part (\d+) of (\d+) \(.*?\)", label)
            name = f"part {match[1]}/{match[2]}" if match else label
            out += _wrapped(f"time {name}: " + ", ".join(
                f"{what} {value:.0f}" if what == "runs" else f"{what} {value:.1f}s"
                for what, value in seconds.items()))
        return out

    def full_table(self) -> str:
        """Every row and column (what report.json holds), as text: wide."""
        body = [(r.part, r.check, r.what, r.positions, _num(r.cos_min, 6), _num(r.max_abs, 4),
                 "" if r.lsb is None else f"{r.lsb:.1f}", _value(r),
                 "" if r.floor is None else f"{r.floor:.3g}",
                 "" if r.ratio is None else f"{r.ratio:.2f}", r.limit, "; ".join(r.notes),
                 _verdict(r)) for r in self.rows]
        return "\n".join(self._header() + tables.table(
            ("part", "check", "out", "n", "cos min", "max|err|", "LSB", "value", "floor",
             "ratio", "limit", "notes", "verdict"), body, right={3, 4, 5, 6, 8, 9}))

    def failure_message(self) -> str:
        rows = self.first_divergence()
        checks = "; ".join(f"{r.check}: {', '.join(r.problems)}" for r in rows)
        if all(p.startswith("cannot judge") for r in rows for p in r.problems):
            return (f"verify failed: it cannot judge {rows[0].part} ({checks}). "
                    f"{len(self.failures)} check(s) failed in all; see the table above")
        return (f"verify failed: {rows[0].part} diverged first ({checks}). "
                f"{len(self.failures)} check(s) failed in all; see the table above")

    def to_json(self) -> dict:
        return json_safe({**{k: v for k, v in asdict(self).items() if k != "rows"},
                          "ok": self.ok, "rows": [{**asdict(r), "ok": r.ok, "gated": r.gated}
                                                  for r in self.rows]})


def _run_reference(bp, layout: Layout, cl: int, scratch: Path, rounding: str, x_same,
                   x_chain, n_prompt: int, float_bitwidth: int, spill: Path,
                   derived: Optional[dict] = None,
                   also: Optional[Callable[[dict], None]] = None) -> tuple:
    """(fed the bundle's input, chained on its own) through the part's reference with
    `rounding`, their outputs spilled to spill-same.npy and spill-chained.npy; its scratch
    files removed after. `derived`: an ortqnn bundle's extra encodings (reference_graphs);
    `also(graphs)`: run before the graphs' files go (the simulator's run of them)."""
    cfg = layout.cfg
    graphs = reference_graphs(bp.part, cfg.model, layout.every_graph_files(), cl, scratch,
                              rounding, float_bitwidth, derived)
    try:
        if also is not None:
            also(graphs)
        same = run_sequence(reference_session(bp.part, cfg, graphs), x_same, n_prompt,
                            _named(spill, "same"))
        chained = same if x_chain is x_same else run_sequence(
            reference_session(bp.part, cfg, graphs), x_chain, n_prompt,
            _named(spill, "chained"))
    finally:
        for graph in graphs.values():
            _close(graph)
        shutil.rmtree(scratch / f"cl{cl}-{rounding}", ignore_errors=True)
    return same, chained


def _named(spill: Path, what: str, suffix: str = ".npy") -> Path:
    """scratch/part2-cl4096 + "bundle": scratch/part2-cl4096-bundle.npy."""
    return spill.with_name(f"{spill.name}-{what}{suffix}")


def compare_bundle_with_onnx(layout: Layout, options, bundle_dir: Optional[Path] = None,
                             log: Callable[[str], None] = print) -> Report:
    """Run the checks with the verify step's options (steps/options.py verify_options: its
    settings, token counts and the context lengths); return the report (callers decide what a
    failure means). Per part: the exact checks, then the bundle, the two references fed the
    bundle's input and chained on their own, the float chained on its own (one part open at a
    time); then every part's error is gated against the noise floor of all of them."""
    from hexbundle.checks.exact import PartGraph
    from hexbundle.runtime.qdq import AIMET, HALF_EVEN
    cfg = layout.cfg
    began = time.monotonic()
    bundle_dir = Path(bundle_dir or layout.bundle_dir)
    v = options.settings
    genie = read_genie_config(bundle_dir)
    check_runtime_settings(layout, genie)
    rope = rope_settings(genie)
    n_prompt, total = v.prompt_tokens, v.prompt_tokens + v.decode_steps
    prompt = ordinary_prompt(genie.tokenizer, genie.n_vocab, v.seed, total)
    ids = prompt.ids
    log(f"verify: {total} token ids of ordinary text (seed {v.seed}): {prompt.text[:60]!r}...")
    simulated = options.backend == "ortqnn"
    if not simulated:
        opened = open_bundle_parts(cfg, genie)
    lengths = options.context_lengths
    chains = {cl: (ids, ids, ids, ids) for cl in lengths}   # bundle, reference, ref 2, float
    sim_chains = {cl: ids for cl in lengths}   # ortqnn: the reference on the simulator
    rows, scales, spans, timings = [], {}, {}, {}
    executor = INTERPRETER
    layout.verify_report.parent.mkdir(parents=True, exist_ok=True)
    # every sequence is spilled to the scratch directory (SequenceRows): only the part's session
    # is in memory while it runs, not the sequences kept for the next part and the end
    with temp_dir(layout.verify_report.parent, "reference") as scratch:
        scratch = Path(scratch)
        if simulated:   # checks/simulated.py: each bin recompiled, each graph's own bin run
            from hexbundle.checks.simulated import close_session, open_simulated_parts
            opened, recompiles = open_simulated_parts(
                layout, options, genie, layout.verify_report.parent / SIMULATOR_DIR, scratch, log)
        try:
            for bp in opened:
                log(f"verify: {bp.label}: exact checks")
                if simulated:
                    rows.append(recompiled_row(bp.label, bp.part.index,
                                               *recompiles[bp.part.index]))
                else:
                    rows += exact_rows(bp.label, bp.part.index, bp.reader, [
                        PartGraph(g.name, layout.onnx(g), layout.encodings(g))
                        for cl in lengths for g in cfg.model.graphs(bp.part, cl)])
                bp.reader.release_pages()
                seconds = getattr(bp, "seconds", {})
                for cl in lengths:   # every length's graphs of the part, the same tokens
                    label = bp.label + (f" cl {cl}" if len(lengths) > 1 else "")
                    log(f"verify: {label}")
                    spill = scratch / f"part{bp.part.index}-cl{cl}"
                    x_bundle, x_ref, x_ref2, x_float = chains[cl]
                    started = time.monotonic()
                    if simulated:
                        from hexbundle.checks.simulated import executor_text, simulated_session
                        session = simulated_session(bp, layout, rope, cl,
                                                    scratch / f"sim-{bp.part.index}-{cl}", log)
                        try:
                            b = run_sequence(session, x_bundle, n_prompt,
                                             _named(spill, "bundle"))
                        finally:
                            close_session(session, bp)
                        executor = executor_text(session)
                    else:
                        session = bundle_session(bp, cfg, rope, cl)
                        b = run_sequence(session, x_bundle, n_prompt, _named(spill, "bundle"))
                        seconds["bundle"] = seconds.get("bundle", 0.0) \
                            + time.monotonic() - started
                    scales[cl] = output_scale(session)
                    spans[cl] = output_span(session)
                    kv_scales, kv_span = kv_entry_scales(session), kv_entry_span(session)
                    del session
                    # the bin's pages, left resident by the run, would sit under the reference's
                    # and the float's weights (the peak RSS): drop them, keeping the mmap
                    bp.reader.release_pages()
                    started = time.monotonic()
                    derived, simulate, on_sim = None, None, []
                    if simulated:   # the references in the form ortqnn compiles, and run
                        from hexbundle.checks.simulated import (derived_for, rebuilt_problems,
                                                                simulated_reference)
                        derived = derived_for(layout, bp.part, cl, options.float_bitwidth,
                                              scratch / "derive")
                        seconds["derive encodings"] = time.monotonic() - started
                        started = time.monotonic()

                        def simulate(graphs, bp=bp, cl=cl, on_sim=on_sim):
                            """The reference on the simulator: fed the bundle's input, and
                            chained on its own (the end-to-end floor)."""
                            begun = time.monotonic()
                            for x in (x_bundle, sim_chains[cl]):
                                sim = simulated_reference(
                                    bp, graphs, rope, scratch / f"simref-{bp.part.index}-{cl}",
                                    log)
                                if not on_sim:
                                    rows.append(rebuilt_row(
                                        label, bp.part.index,
                                        *rebuilt_problems(layout, bp.part, cl, sim.whole)))
                                try:
                                    on_sim.append(run_sequence(sim, x, n_prompt,
                                                               _named(spill, f"sim{len(on_sim)}")))
                                finally:
                                    close_session(sim, bp, "reference on the simulator")
                            bp.seconds["reference on the simulator"] = \
                                time.monotonic() - begun
                    same, chained = _run_reference(bp, layout, cl, scratch, HALF_EVEN, x_bundle,
                                                   x_ref, n_prompt, options.float_bitwidth,
                                                   _named(spill, HALF_EVEN, ""), derived,
                                                   simulate)
                    same2, chained2 = _run_reference(bp, layout, cl, scratch, AIMET, x_bundle,
                                                     x_ref2, n_prompt, options.float_bitwidth,
                                                     _named(spill, AIMET, ""), derived)
                    if on_sim:
                        rows.append(make_row(label, bp.part.index, SIMULATED_REFERENCE,
                                             on_sim[0].outputs, same.outputs, bp.part.has_head,
                                             scale=scales[cl]))
                        rows[-1].notes.append("the reference run on the simulator: its share "
                                              "of the noise floor")
                        sim_chains[cl] = mapped_afresh(on_sim[1].outputs)
                    seconds["references"] = seconds.get("references", 0.0) \
                        + time.monotonic() - started - seconds.get("reference on the simulator", 0)
                    new = part_rows(label, bp.part.index, bp.part.has_head, n_prompt,
                                    PartRuns(b, same, same2,
                                             simulated=on_sim[0] if on_sim else None),
                                    v, scales[cl], kv_scales)
                    for row in new:
                        row.span = kv_span if row.what == "kv" else spans[cl]
                    rows += new
                    del on_sim[:]
                    # the references fed the bundle's input are compared: only the chains stay,
                    # mapped afresh (the pages the comparisons read are given back)
                    b.outputs = mapped_afresh(b.outputs)
                    chains[cl] = (b.outputs, mapped_afresh(chained.outputs),
                                  mapped_afresh(chained2.outputs))
                    del same, same2, chained, chained2
                    started = time.monotonic()
                    session = onnx_session(bp.part, layout.cfg.model, layout.every_graph_files(), cl)
                    f = run_sequence(session, x_float, n_prompt, _named(spill, "float"))
                    seconds["float"] = seconds.get("float", 0.0) + time.monotonic() - started
                    rows.append(drift_row(label, bp.part.index, bp.part.has_head, b.outputs,
                                          f.outputs))
                    chains[cl] = (*(mapped_afresh(c) for c in chains[cl]),
                                  mapped_afresh(f.outputs))
                    del b, f
                timings[bp.label] = dict(seconds)
                bp.reader.close()
            if simulated:   # the own bins of earlier QDQ models, toolchains or options
                from hexbundle.backends.ortqnn_sim import prune_own_bins
                prune_own_bins(layout.verify_report.parent / SIMULATOR_DIR,
                               set().union(*(bp.used for bp in opened)))
        finally:
            for bp in opened:
                bp.reader.close()
        floor, where = noise_floor(rows, v)
        gate_against_floor(rows, floor, v)
        for cl in lengths:
            label = "end to end" + (f" cl {cl}" if len(lengths) > 1 else "")
            ends = end_to_end_rows(label, *chains[cl], v, scales.get(cl),
                                   sim_chains[cl] if simulated else None)
            for row in ends:
                row.span = spans.get(cl)
            rows += ends
        refuse_vacuous_limits(rows, where)
        del chains, sim_chains   # the spilled sequences' maps, before their files are removed
    return Report(cfg.model.name, layout.rel(bundle_dir), n_prompt, v.decode_steps, rows,
                  time.monotonic() - began, floor, where, v.seed, prompt.text,
                  [int(i) for i in ids], executor, timings)


def run_verify(layout: Layout, options) -> None:
    """Print the table, write the JSON report; a failure names the first bad part. `options`:
    the verify step's (steps/options.py), the same value its task is keyed on."""
    if options.backend not in ("reference", "ortqnn"):
        raise VerifyError(f"verify runs the open-format context binaries of the reference "
                          f"backend, or an ortqnn bundle's graphs on Qualcomm's simulator; "
                          f"backend {options.backend!r} bins are QNN binaries that only a "
                          f"device runs. Verify the same model with backend=reference or "
                          f"backend=ortqnn")
    try:
        report = compare_bundle_with_onnx(layout, options)
    except VerifyError as exc:
        raise VerifyError(f"verify failed: {exc}") from None
    print(report.table(layout.rel(layout.verify_report)), flush=True)
    write_json(layout.verify_report, report.to_json())
    if not report.ok:
        raise VerifyError(report.failure_message())
