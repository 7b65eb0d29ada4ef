"""tokenizer.json (Hugging Face tokenizers): the reader. What a bundle needs of it: the special
tokens' ids, checked against the model's vocabulary."""
from __future__ import annotations

import json
from pathlib import Path

from hexbundle.support.errors import InputError


def special_token_ids(tokenizer: Path, specials: dict, vocab_size: int) -> dict:
    """{"bos": id, ...} looked up by content among the tokenizer's added tokens."""
    try:
        data = json.loads(tokenizer.read_bytes())
    except FileNotFoundError:
        raise InputError(f"{tokenizer}: tokenizer.json is missing; put the model's Hugging Face "
                         "tokenizer.json there") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"{tokenizer}: not a valid tokenizer.json ({exc}); replace it with the "
                         "model's Hugging Face tokenizer.json") from None
    added = data.get("added_tokens") if isinstance(data, dict) else None
    if not isinstance(added, list):
        raise InputError(f"{tokenizer}: no 'added_tokens' list: not a Hugging Face "
                         "tokenizer.json; replace it with the model's tokenizer.json")
    by_content = {t.get("content"): t.get("id") for t in added if isinstance(t, dict)}
    out = {}
    for role, content in specials.items():
        tid = by_content.get(content)
        if not isinstance(tid, int):
            raise InputError(f"{tokenizer}: special token {content!r} ({role}, from the model "
                             "config's [tokenizer] table) is not among its added_tokens; fix "
                             "that table or use the model's own tokenizer.json")
        if not 0 <= tid < vocab_size:
            raise InputError(f"{tokenizer}: {role} token {content!r} has id {tid}, outside the "
                             f"model's vocab_size {vocab_size} (the logits width)")
        out[role] = tid
    return out
