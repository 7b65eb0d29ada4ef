"""tokenizer.json (Hugging Face tokenizers): the reader, and the byte-level BPE writer the input
generator uses (byte_level_bpe, tokenizer_bytes). What a bundle needs of it: the special
tokens' ids, checked against the tokenizer itself and the model's vocabulary.

Genie loads tokenizer.json on the device; a file that only looks right there fails late or, worse,
feeds wrong ids. So the file is read as the `tokenizers` library reads it, and refused, naming
the file and the key, when:
  * it is not a regular file (a FIFO would hang the read), starts with a byte-order mark, is not
    UTF-8 or not JSON, or has a top-level key a tokenizer.json does not have;
  * the library does not load it;
  * an added token's id is not an integer (JSON `true` is not an id) or two added tokens share
    one id (so special tokens of different content always have different ids);
  * a special token of the model config's [tokenizer] table is not among the added tokens, or
    its id there is not the id the tokenizer maps its content to, or it is >= vocab_size;
  * any token's id is >= vocab_size (the logits width, Genie's n-vocab): a vocabulary wider
    than the model.
"""
from __future__ import annotations

import codecs
import json
from pathlib import Path

from hexbundle.support.errors import InputError
from hexbundle.support.files import TOKENIZER_MAX_BYTES, read_named_file
from hexbundle.support.jsondoc import parse_json

# The top-level keys tokenizers writes (tokenizers' TokenizerImpl serialization).
KNOWN_KEYS = ("version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
              "model", "post_processor", "decoder")
BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE, codecs.BOM_UTF32_LE,
        codecs.BOM_UTF32_BE)
REPLACE = "replace it with the model's Hugging Face tokenizer.json"


def special_token_ids(tokenizer: Path, specials: dict, vocab_size: int) -> dict:
    """{"bos": id, ...}: each special token's id, looked up by content and checked (above)."""
    text = _read_text(tokenizer)
    data = _parse(tokenizer, text)
    added = _added_tokens(tokenizer, data)
    _model_vocab_ids_distinct(tokenizer, data)
    loaded = _load_with_library(tokenizer, text)
    out = {}
    for role, content in specials.items():
        tid = added.get(content)
        if tid is None:
            raise InputError(f"{tokenizer}: special token {content!r} ({role}, from the model "
                             "config's [tokenizer] table) is not among its added_tokens; fix "
                             "that table or use the model's own tokenizer.json")
        mapped = loaded.token_to_id(content)
        if mapped != tid:
            raise InputError(f"{tokenizer}: added_tokens gives {role} token {content!r} id {tid}, "
                             f"but the tokenizer maps {content!r} to {mapped}"
                             f"{_why_renumbered(data, content, mapped)}; the file contradicts "
                             f"itself: {REPLACE}")
        if not 0 <= tid < vocab_size:
            raise InputError(f"{tokenizer}: {role} token {content!r} has id {tid}, outside the "
                             f"model's vocab_size {vocab_size} (the logits width)")
        out[role] = tid
    _check_vocab_width(tokenizer, loaded, vocab_size)
    return out


def added_token_contents(tokenizer: Path) -> dict:
    """id -> content of the added tokens (the special tokens a config.json names by id)."""
    added = _added_tokens(tokenizer, _parse(tokenizer, _read_text(tokenizer)))
    return {tid: content for content, tid in added.items()}


def _why_renumbered(data: dict, content: str, mapped) -> str:
    """Why the library's id differs, when it is the usual cause: the library numbers an added
    token that model.vocab lacks from the vocabulary's end, ignoring the id written for it."""
    vocab = (data.get("model") or {}).get("vocab")
    if not isinstance(vocab, dict) or content in vocab or not isinstance(mapped, int):
        return ""
    return (f" (model.vocab has {len(vocab)} entries and lacks {content!r}: the tokenizers library "
            f"numbers such added tokens from the vocabulary's end, so their ids must follow it "
            f"without a gap)")


def _read_text(tokenizer: Path) -> str:
    if not tokenizer.exists():
        raise InputError(f"{tokenizer}: tokenizer.json is missing; put the model's Hugging Face "
                         "tokenizer.json there")
    raw = read_named_file(tokenizer, "tokenizer.json", TOKENIZER_MAX_BYTES)
    if raw.startswith(BOMS):
        raise InputError(f"{tokenizer}: starts with a byte-order mark, which a JSON reader "
                         "(Genie's included) takes for garbage; save it as UTF-8 without a BOM")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{tokenizer}: not UTF-8 text (byte {exc.start}); {REPLACE}") from None


def _parse(tokenizer: Path, text: str) -> dict:
    try:
        data = parse_json(text, "", max_bytes=TOKENIZER_MAX_BYTES)
    except ValueError as exc:   # support.jsondoc's JsonDocError: not JSON, or out of bounds
        raise InputError(f"{tokenizer}: not a valid tokenizer.json ({str(exc)[2:]}); "
                         f"{REPLACE}") from None
    if not isinstance(data, dict):
        raise InputError(f"{tokenizer}: not a valid tokenizer.json (the top level is not an "
                         f"object); {REPLACE}")
    unknown = [k for k in data if k not in KNOWN_KEYS]
    if unknown:
        raise InputError(f"{tokenizer}: unknown top-level key {unknown[0]!r} (a tokenizer.json "
                         f"has {', '.join(KNOWN_KEYS)}); {REPLACE}")
    return data


def _added_tokens(tokenizer: Path, data: dict) -> dict:
    """content -> id of the added tokens, every id an integer and no id given twice."""
    added = data.get("added_tokens")
    if not isinstance(added, list):
        raise InputError(f"{tokenizer}: no 'added_tokens' list: not a Hugging Face "
                         f"tokenizer.json; {REPLACE}")
    by_content, by_id = {}, {}
    for index, token in enumerate(added):
        key = f"added_tokens[{index}]"
        if not isinstance(token, dict) or not isinstance(token.get("content"), str):
            raise InputError(f"{tokenizer}: {key} is not an object with a 'content' string; "
                             f"{REPLACE}")
        if not token["content"]:
            raise InputError(f"{tokenizer}: {key} has empty content: an added token must be "
                             f"text (it could never be matched, nor decoded); {REPLACE}")
        tid = token.get("id")
        if type(tid) is not int:   # bool is an int subclass: `true` must not pass as 1
            raise InputError(f"{tokenizer}: {key}.id ({token['content']!r}) is "
                             f"{json.dumps(tid)}, not an integer id; {REPLACE}")
        if tid in by_id:
            raise InputError(f"{tokenizer}: added_tokens give id {tid} to both "
                             f"{by_id[tid]!r} and {token['content']!r}; ids must be distinct: "
                             f"{REPLACE}")
        by_id[tid] = token["content"]
        by_content[token["content"]] = tid
    return by_content


def _load_with_library(tokenizer: Path, text: str):
    """The tokenizer as the `tokenizers` library builds it (imported here: a no-op doit run
    does not pay for it)."""
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:   # the library raises a bare Exception with serde's message
        raise InputError(f"{tokenizer}: the tokenizers library does not load it ({exc}); "
                         f"{REPLACE}") from None


def _model_vocab_ids_distinct(tokenizer: Path, data: dict) -> None:
    """Two tokens of the model's vocabulary (model.vocab, token -> id) with one id: decoding
    that id would give either; the library takes such a file silently."""
    vocab = (data.get("model") or {}).get("vocab") if isinstance(data.get("model"), dict) \
        else None
    if not isinstance(vocab, dict):
        return   # a list (Unigram) numbers its entries itself
    seen = {}
    for token, tid in vocab.items():
        if tid in seen:
            raise InputError(f"{tokenizer}: model.vocab gives id {tid} to both {seen[tid]!r} "
                             f"and {token!r}; ids must be distinct: {REPLACE}")
        seen[tid] = token


def _check_vocab_width(tokenizer: Path, loaded, vocab_size: int) -> None:
    vocab = loaded.get_vocab(with_added_tokens=True)
    if not vocab:
        return
    token, tid = max(vocab.items(), key=lambda kv: kv[1])
    if tid >= vocab_size:
        raise InputError(f"{tokenizer}: token {token!r} has id {tid}, but the model's vocab_size "
                         f"(n-vocab, the logits width) is {vocab_size}: its vocabulary is wider "
                         "than the model; use the tokenizer.json of this model")


# ============================================================================ the writer

def byte_level_bpe(vocab: dict, merges: list, added: list) -> dict:
    """A byte-level BPE tokenizer.json document: `vocab` token -> id, `merges` (left, right)
    pairs in rank order, `added` (id, content) special tokens. The tokenizers library numbers
    an added token that is not in model.vocab from the vocabulary's end, whatever id the file
    gives: so `added` must take the ids right after `vocab`'s, or the file contradicts itself."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": token_id, "content": content, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False, "special": True}
                         for token_id, content in added],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": {**byte_level, "trim_offsets": False},
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab,
                  "merges": [f"{left} {right}" for left, right in merges]},
    }


def tokenizer_bytes(doc: dict) -> bytes:
    """The bytes of a tokenizer.json as hexbundle writes one (UTF-8, not ASCII-escaped)."""
    return (json.dumps(doc, ensure_ascii=False, indent=2) + "\n").encode("utf-8")
