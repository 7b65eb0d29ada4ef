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
  encodings vs the export's   the bin's activation and weight encodings against the file's
  prefill/decode vs reference the bundle and the reference fed the same input (gated:
                              min_cosine_reference; max error also in output-encoding LSBs)
  token vs prompt             the bundle's token graph, fed the prefill's KV cache of the
                              positions before p, against its prompt graph at position p (p =
                              the last position of each chunk), output and ("... kv") the KV
                              entry; "reference token vs prompt" the same for the reference
  drift from float (chained)  the bundle against the float ONNX, each chained (reported)
and end to end: the bundle's logits against the reference's, each chained on its own (gated);
the float drift of both, the bundle's allowed max_drift_margin more than the reference's; top-1
against float (gated only if min_top1_agreement > 0). A model with several context lengths is
checked at each of them (rows labelled "cl C").

The sequence: `prompt_tokens` + `decode_steps` token ids drawn from a fixed seed, fed to both
sides (teacher forcing), so the comparison does not depend on earlier argmax choices. It runs
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
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from hexbundle.config.build import VerifySettings
from hexbundle.config.layout import Layout
from hexbundle.formats.genie import GenieSettings, read_genie_config
from hexbundle.runtime.parts import (bundle_session, onnx_session, open_bundle_parts,
                                     reference_graphs, reference_session, rope_settings)
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


def run_sequence(session, x: np.ndarray, n_prompt: int) -> SequenceRun:
    """Prefill x[:n_prompt] in chunks through the prompt graph, then decode the rest one token at
    a time through the token graph; also run the token graph at the last position of each chunk
    with the cache of the positions before it (the prompt-vs-token check). One graph is open at
    a time (close() after its last use) so a part's two float graphs never coexist."""
    ar = session.ar("prompt")
    outputs, forks, prompt_kv = [], {}, {}
    for start in range(0, n_prompt, ar):
        n = min(ar, n_prompt - start)
        outputs.append(session.run("prompt", x[start:start + n], n))
        last = start + n - 1
        forks[last] = session.fork(last)
        prompt_kv[last] = session.kv_entry(last)
    _close(session.graphs["prompt"])
    token_rows = {}
    for p, fork in forks.items():
        row = fork.run("token", x[p:p + 1], 1)[0]
        token_rows[p] = (row, fork.kv_entry(p))
    for t in range(n_prompt, x.shape[0]):
        outputs.append(session.run("token", x[t:t + 1], 1))
    _close(session.graphs["token"])
    out = np.concatenate(outputs)
    return SequenceRun(out, {p: (out[p], prompt_kv[p]) for p in forks}, token_rows)


def _close(executor) -> None:
    close = getattr(executor, "close", None)
    if close:
        close()


# ============================================================================ metrics and thresholds


@dataclass
class ComparisonRow:
    part: str                     # "part 2 of 4 (x.bin)" or "end to end"
    check: str
    what: str                     # "hidden" | "logits" | "kv"
    positions: int
    cos_min: float
    cos_mean: float
    max_abs: float
    top1: Optional[float]         # logits only
    min_cos: Optional[float]      # None: reported, not gated
    min_top1: Optional[float]
    part_index: int = 0
    lsb: Optional[float] = None   # max_abs in units of the output encoding's scale
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def compare(got: np.ndarray, want: np.ndarray, logits: bool) -> dict:
    got = got.reshape(got.shape[0], -1).astype(np.float64)
    want = want.reshape(want.shape[0], -1).astype(np.float64)
    dot = (got * want).sum(axis=1)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    cos = np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0), 0.0)
    return {"cos_min": float(cos.min()), "cos_mean": float(cos.mean()),
            "max_abs": float(np.abs(got - want).max()),
            "top1": float((got.argmax(1) == want.argmax(1)).mean()) if logits else None}


def judge_row(row: ComparisonRow) -> ComparisonRow:
    if row.min_cos is not None and not (row.cos_min >= row.min_cos):      # also catches NaN
        row.problems.append(f"{row.what} cosine {row.cos_min:.6f} < {row.min_cos}")
    if row.top1 is not None and row.min_top1 and not (row.top1 >= row.min_top1):
        row.problems.append(f"top-1 agreement {row.top1:.3f} < {row.min_top1}")
    return row


def make_row(label: str, index: int, check: str, got, want, logits: bool,
             min_cos: Optional[float], min_top1: Optional[float] = None, what: str = "",
             scale: Optional[float] = None) -> ComparisonRow:
    m = compare(got, want, logits)
    row = ComparisonRow(label, check, what or ("logits" if logits else "hidden"),
                        int(got.shape[0]), m["cos_min"], m["cos_mean"], m["max_abs"], m["top1"],
                        min_cos, min_top1 if logits else None, part_index=index,
                        lsb=m["max_abs"] / scale if scale else None)
    return judge_row(row)


def output_scale(session) -> Optional[float]:
    """The scale of the main output's activation encoding in the bin (an int encoding's step)."""
    graph = next(iter(session.graphs.values()))
    enc = (getattr(graph, "info", None) and graph.info.activations or {}).get(session.main_output)
    if not enc or enc.get("dtype", "int") != "int" or len(enc["scale"]) != 1:
        return None
    return float(enc["scale"][0])


def part_rows(label: str, index: int, logits: bool, n_prompt: int, bundle: SequenceRun,
              same: SequenceRun, floats: SequenceRun, v: VerifySettings,
              scale: Optional[float]) -> list:
    """A part's rows: the bundle vs the reference fed the same input (gated), each side's token
    vs prompt graphs (gated), the bundle's drift from float, chained (reported)."""
    rows = [make_row(label, index, "prefill vs reference", bundle.outputs[:n_prompt],
                     same.outputs[:n_prompt], logits, v.min_cosine_reference, scale=scale)]
    if bundle.outputs.shape[0] > n_prompt:
        rows.append(make_row(label, index, "decode vs reference", bundle.outputs[n_prompt:],
                             same.outputs[n_prompt:], logits, v.min_cosine_reference,
                             scale=scale))
    for check, run in (("token vs prompt", bundle), ("reference token vs prompt", same)):
        positions = sorted(run.prompt_rows)
        token = [run.token_rows[p] for p in positions]
        prompt = [run.prompt_rows[p] for p in positions]
        rows.append(make_row(label, index, check, np.stack([t[0] for t in token]),
                             np.stack([p[0] for p in prompt]), logits,
                             v.min_cosine_prompt_vs_token))
        if token[0][1].size:   # a part with layers: the new KV entries must agree too
            rows.append(make_row(label, index, check + " kv", np.stack([t[1] for t in token]),
                                 np.stack([p[1] for p in prompt]), False,
                                 v.min_cosine_prompt_vs_token, what="kv"))
    rows.append(make_row(label, index, "drift from float (chained)", bundle.outputs,
                         floats.outputs, logits, None))
    return rows


def encoding_problems(reader, graph_name: str, onnx_path: Path, encodings_path: Path) -> tuple:
    """(problems, how many encodings compared): the bin's graph against the export's encodings
    file -- every activation encoding present with the file's bit width, type, scale and offset
    (the device runs at those), every encoded weight stored at its bit width with its scales.
    Numbers alone cannot show an ignored 16-bit encoding (it moves the output by < 1 LSB); this
    names it."""
    from hexbundle.formats.encodings import load_encodings
    from hexbundle.formats.onnxfile import load_structure
    info = reader.graph(graph_name)
    initializers = {i.name for i in load_structure(onnx_path).graph.initializer}
    spec = load_encodings(encodings_path).for_graph(initializers)
    stored, problems = info.activations or {}, []
    for name, enc in sorted(spec.activations.items()):
        got = stored.get(name)
        want = f"{enc.bitwidth}-bit {enc.dtype}"
        if got is None:
            problems.append(f"activation '{name}': no encoding in the bin (the export's {want})")
        elif (got["bitwidth"], got.get("dtype", "int")) != (enc.bitwidth, enc.dtype):
            problems.append(f"activation '{name}': {got['bitwidth']}-bit "
                            f"{got.get('dtype', 'int')} in the bin, {want} in "
                            f"{encodings_path.name}")
        elif enc.is_int and not (np.allclose(got["scale"], enc.scale, rtol=1e-6, atol=0)
                                 and np.allclose(got["offset"], enc.offset, rtol=0, atol=1e-6)):
            problems.append(f"activation '{name}': scale/offset {got['scale'][:1]}/"
                            f"{got['offset'][:1]} in the bin, {list(enc.scale[:1])}/"
                            f"{list(enc.offset[:1])} in {encodings_path.name}")
    weights = set(info.weights)
    for name, enc in sorted(spec.params.items()):
        if name not in weights or not enc.is_int:
            continue
        q = reader.quant_params(graph_name, name)
        if q is None:
            problems.append(f"weight '{name}': stored float, {enc.bitwidth}-bit in "
                            f"{encodings_path.name}")
        elif enc.is_blockwise or enc.lpbq:
            continue   # stored per block as the backend expands them: present is what is checked
        elif q.bitwidth != enc.bitwidth:
            problems.append(f"weight '{name}': stored at {q.bitwidth} bits, {enc.bitwidth} in "
                            f"{encodings_path.name}")
        elif q.scale.size == enc.scale.size and not np.allclose(q.scale, enc.scale, rtol=1e-6,
                                                                atol=0):
            problems.append(f"weight '{name}': its scales differ from {encodings_path.name}")
    return problems, len(spec.activations) + len(spec.params)


def encodings_row(label: str, index: int, bp, graphs, layout: Layout) -> ComparisonRow:
    """One row per part: its graphs' encodings in the bin vs the export's files."""
    problems, count = [], 0
    for g in graphs:
        found, n = encoding_problems(bp.reader, g.name, layout.onnx(g), layout.encodings(g))
        problems += [f"{g.name}: {p}" for p in found]
        count += n
    row = ComparisonRow(label, "encodings vs the export's", "enc", count, math.nan, math.nan,
                        math.nan, None, None, None, part_index=index)
    if problems:
        row.problems.append(f"{len(problems)} encoding(s) not as the export specifies: "
                            + "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else ""))
    return row


def end_to_end_rows(label: str, bundle: np.ndarray, reference: np.ndarray, floats: np.ndarray,
                    v: VerifySettings, scale: Optional[float]) -> list:
    """Chained through every part: the bundle's logits vs the reference's (gated); the float
    drift of each, the bundle's gated relative to the reference's (max_drift_margin); top-1 vs
    float gated only when min_top1_agreement > 0."""
    rows = [make_row(label, 0, "chained vs reference", bundle, reference, True,
                     v.min_cosine_reference, scale=scale)]
    ours = make_row(label, 0, "bundle drift from float", bundle, floats, True, None,
                    v.min_top1_agreement)
    theirs = make_row(label, 0, "reference drift from float", reference, floats, True, None)
    allowed = (1 - theirs.cos_min) + v.max_drift_margin
    if not (1 - ours.cos_min <= allowed):
        ours.problems.append(f"drift {1 - ours.cos_min:.6f} > the reference's "
                             f"{1 - theirs.cos_min:.6f} + max_drift_margin {v.max_drift_margin}")
    return rows + [ours, theirs]


# ============================================================================ verify


def _num(value: float, digits: int) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _verdict(row: ComparisonRow) -> str:
    if not row.ok:
        return "FAIL: " + "; ".join(row.problems)
    gated = row.min_cos is not None or (row.top1 is not None and row.min_top1) \
        or row.check.startswith("bundle drift") or row.what == "enc"
    return "ok" if gated else "(reported)"


@dataclass
class Report:
    model: str
    bundle: str
    prompt_tokens: int
    decode_steps: int
    rows: list
    seconds: float

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

    def table(self) -> str:
        lines = [f"verify {self.model}: {self.bundle}, {self.prompt_tokens} prompt tokens + "
                 f"{self.decode_steps} decode steps vs the export's quantized reference (its "
                 "encodings applied, onnxruntime) and the float ONNX"]
        body = [(r.part, r.check, r.what, r.positions, _num(r.cos_min, 6), _num(r.cos_mean, 6),
                 _num(r.max_abs, 4), "" if r.lsb is None else f"{r.lsb:.1f}",
                 "" if r.top1 is None else f"{r.top1:.3f}", _verdict(r)) for r in self.rows]
        lines += tables.table(("part", "check", "out", "pos", "cos min", "cos mean", "max|err|",
                               "LSB", "top-1", "verdict"), body, right={3, 4, 5, 6, 7, 8})
        lines.append(f"{'ok' if self.ok else 'FAILED'} in {self.seconds:.1f}s")
        return "\n".join(lines)

    def failure_message(self) -> str:
        rows = self.first_divergence()
        checks = "; ".join(f"{r.check}: {', '.join(r.problems)}" for r in rows)
        return (f"verify failed: {rows[0].part} diverged first ({checks}). "
                f"{len(self.failures)} check(s) failed in all; see the table above")

    def to_json(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"},
                "ok": self.ok, "rows": [asdict(r) for r in self.rows]}


def compare_bundle_with_onnx(layout: Layout, options, bundle_dir: Optional[Path] = None,
                             log: Callable[[str], None] = print) -> Report:
    """Run the checks with the verify step's options (steps/options.py verify_options: its
    thresholds, token counts and the context lengths); return the report (callers decide what a
    failure means). Per part: the bundle, the reference fed the bundle's input, the reference
    chained on its own outputs, the float ONNX chained on its own (one part open at a time)."""
    cfg = layout.cfg
    started = time.monotonic()
    bundle_dir = Path(bundle_dir or layout.bundle_dir)
    v = options.settings
    genie = read_genie_config(bundle_dir)
    check_runtime_settings(layout, genie)
    rope = rope_settings(genie)
    opened = open_bundle_parts(cfg, genie)
    n_prompt, total = v.prompt_tokens, v.prompt_tokens + v.decode_steps
    ids = np.random.default_rng(v.seed).integers(0, genie.n_vocab, total).astype(np.int32)
    lengths = options.context_lengths
    chains = {cl: (ids, ids, ids) for cl in lengths}   # per length: bundle, reference, float
    rows, scales = [], {}
    layout.verify_report.parent.mkdir(parents=True, exist_ok=True)
    try:
        with temp_dir(layout.verify_report.parent, "reference") as scratch:
            for bp in opened:
                for cl in lengths:   # every length's graphs of the part, the same tokens
                    label = bp.label + (f" cl {cl}" if len(lengths) > 1 else "")
                    log(f"verify: {label}")
                    x_bundle, x_ref, x_float = chains[cl]
                    rows.append(encodings_row(label, bp.part.index, bp,
                                              cfg.model.graphs(bp.part, cl), layout))
                    session = bundle_session(bp, cfg, rope, cl)
                    scales[cl] = output_scale(session)
                    b = run_sequence(session, x_bundle, n_prompt)
                    # the bin's pages, left resident by the run, would sit under the reference's
                    # and the float's weights (the peak RSS): drop them, keeping the mmap
                    bp.reader.release_pages()
                    reference = reference_graphs(bp.part, layout, cl, Path(scratch))
                    same = run_sequence(reference_session(bp.part, cfg, reference), x_bundle,
                                        n_prompt)
                    chained = same if x_ref is x_bundle else run_sequence(
                        reference_session(bp.part, cfg, reference), x_ref, n_prompt)
                    f = run_sequence(onnx_session(bp.part, layout, cl), x_float, n_prompt)
                    rows += part_rows(label, bp.part.index, bp.part.has_head, n_prompt, b, same,
                                      f, v, scales[cl])
                    chains[cl] = (b.outputs, chained.outputs, f.outputs)
                    shutil.rmtree(Path(scratch) / f"cl{cl}", ignore_errors=True)
                bp.reader.close()
    finally:
        for bp in opened:
            bp.reader.close()
    for cl in lengths:
        label = "end to end" + (f" cl {cl}" if len(lengths) > 1 else "")
        rows += end_to_end_rows(label, *chains[cl], v, scales.get(cl))
    return Report(cfg.model.name, layout.rel(bundle_dir), n_prompt, v.decode_steps, rows,
                  time.monotonic() - started)


def run_verify(layout: Layout, options) -> None:
    """Print the table, write the JSON report; a failure names the first bad part. `options`:
    the verify step's (steps/options.py), the same value its task is keyed on."""
    if options.backend != "reference":
        raise VerifyError(f"verify runs the open-format context binaries of the reference backend; "
                          f"backend {options.backend!r} bins are QNN binaries that only a device runs. "
                          f"Verify the same model with backend=reference")
    try:
        report = compare_bundle_with_onnx(layout, options)
    except VerifyError as exc:
        raise VerifyError(f"verify failed: {exc}") from None
    print(report.table(), flush=True)
    write_json(layout.verify_report, report.to_json())
    if not report.ok:
        raise VerifyError(report.failure_message())
