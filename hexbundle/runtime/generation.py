"""Host-side text generation, the host's `genie-t2t-run`: prompt text -> the bundle's
tokenizer.json -> prefill -> sample N tokens with the bundle's sampler settings (or greedily) ->
text and tokens/s, through the bundle's context binaries or, for comparison, through the float
ONNX. `scripts/generate.py` is its command line.

Heavy imports (onnx, onnxruntime, tokenizers) happen inside the functions.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from hexbundle.config.build import BuildConfig
from hexbundle.formats.genie import read_genie_config
from hexbundle.runtime.parts import bundle_session, onnx_session, open_bundle_parts, rope_settings
from hexbundle.support.errors import VerifyError


@dataclass
class Generation:
    prompt_ids: list
    token_ids: list
    text: str
    prefill_seconds: float
    decode_seconds: float
    stopped: str                  # "max tokens" | "eos" | "context full"

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.decode_seconds if self.decode_seconds > 0 else 0.0


class Sampler:
    """Genie's sampler settings: temperature, top-k, top-p, seeded; greedy when temp is 0."""

    def __init__(self, settings: dict, greedy: bool):
        self.greedy = greedy or float(settings["temp"]) == 0.0
        self.temp, self.top_k = float(settings["temp"]), int(settings["top-k"])
        self.top_p = float(settings["top-p"])
        self.rng = np.random.default_rng(int(settings["seed"]))

    def __call__(self, logits: np.ndarray) -> int:
        logits = logits.astype(np.float64).reshape(-1)
        if self.greedy:
            return int(np.argmax(logits))
        top = np.argsort(-logits, kind="stable")[:max(1, self.top_k)]
        p = np.exp((logits[top] - logits[top[0]]) / self.temp)
        p /= p.sum()
        keep = max(1, int(np.searchsorted(np.cumsum(p), self.top_p) + 1))
        p = p[:keep] / p[:keep].sum()
        return int(top[self.rng.choice(keep, p=p)])


def load_tokenizer(path: Path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise VerifyError("tokenizing a prompt needs the `tokenizers` package: python3 -m pip "
                          "install -e '.[verify]'") from None
    if not path.is_file():
        raise VerifyError(f"{path}: the bundle's tokenizer is missing; rebuild with `doit bundle`")
    return Tokenizer.from_file(str(path))


def generate_text(cfg: BuildConfig, bundle_dir: Path, files: dict, prompt: str,
                  max_tokens: Optional[int] = None, engine: str = "bundle", greedy: bool = False,
                  on_text: Optional[Callable[[str], None]] = None) -> Generation:
    """Tokenize `prompt` with the bundle's tokenizer (the bundle in `bundle_dir`), prefill,
    then sample up to max_tokens (default: the bundle's max-num-tokens) through every part, step
    by step as Genie does. engine "bundle" runs the context binaries; "onnx" the float ONNX (the
    reference: `files`, graph name -> GraphInputs)."""
    if engine not in ("bundle", "onnx"):
        raise VerifyError(f"engine {engine!r}: use 'bundle' or 'onnx'")
    genie = read_genie_config(Path(bundle_dir))
    tokenizer = load_tokenizer(genie.tokenizer)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    if not prompt_ids:
        raise VerifyError("the prompt is empty after tokenization; give some text")
    rope = rope_settings(genie)
    opened = open_bundle_parts(cfg, genie)
    try:
        if engine == "bundle":
            sessions = [bundle_session(bp, cfg, rope) for bp in opened]
        else:
            sessions = [onnx_session(bp.part, cfg.model, files) for bp in opened]
        return _generate(sessions, genie, tokenizer, prompt_ids,
                         genie.max_num_tokens if max_tokens is None else max_tokens,
                         Sampler(genie.sampler, greedy), on_text)
    finally:
        for bp in opened:
            bp.reader.close()


def _through_parts(sessions: list, kind: str, x: np.ndarray, n: int) -> np.ndarray:
    for session in sessions:
        x = session.run(kind, x, n)
    return x


def _generate(sessions, genie, tokenizer, prompt_ids, max_tokens, sample, on_text) -> Generation:
    ids = np.asarray(prompt_ids, dtype=np.int32)
    if ids.size >= genie.context_size:
        raise VerifyError(f"the prompt has {ids.size} tokens; the context holds "
                          f"{genie.context_size}")
    ar = sessions[0].ar("prompt")
    started = time.monotonic()
    for start in range(0, ids.size, ar):
        n = min(ar, ids.size - start)
        logits = _through_parts(sessions, "prompt", ids[start:start + n], n)[-1]
    prefill = time.monotonic() - started
    out, stopped, shown, started = [], "max tokens", "", time.monotonic()
    while len(out) < max_tokens:
        token = sample(logits)
        if token in genie.stop_tokens:
            stopped = "eos"
            break
        out.append(token)
        if on_text:
            # byte-level BPE: a character may span tokens; show text once it is whole
            text = tokenizer.decode(out, skip_special_tokens=False)
            if not text.endswith("\ufffd") and text.startswith(shown):
                on_text(text[len(shown):])
                shown = text
        if ids.size + len(out) >= genie.context_size:
            stopped = "context full"
            break
        if len(out) < max_tokens:
            logits = _through_parts(sessions, "token", np.array([token], np.int32), 1)[-1]
    seconds = time.monotonic() - started
    text = tokenizer.decode(out, skip_special_tokens=False)
    if on_text and text != shown:
        on_text(text[len(shown):] if text.startswith(shown) else "\n" + text)
    return Generation(list(map(int, prompt_ids)), out, text, prefill, seconds, stopped)
