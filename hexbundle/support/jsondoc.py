"""Every JSON document hexbundle reads is decoded here, within bounds: the one decode step.

Python's json module takes anything: a 400-digit integer (an OverflowError where it meets a
float), `1e400` (infinity), NaN and Infinity (not JSON at all), nesting 100,000 deep (a
RecursionError in the parser, or later in whatever walks the value), a file of any size. A
reader here refuses each of them with an error naming the file, what is wrong and what to do,
before any value reaches the code that uses it:

  size     at most `max_bytes` (the caller's cap for its kind of file; the readers below read
           no further than it);
  depth    at most MAX_DEPTH levels of arrays and objects (hexbundle's deepest document, a
           tokenizer.json, has 6), checked before the parser runs;
  numbers  integers within +-2**64 (the widest field any number ends in), floats finite;
           NaN and Infinity refused unless the caller judges them itself (`allow_nan`: the
           encodings reader names the tensor and the channel);
  text     UTF-8.

What a document holds, key by key, is checked by config.schema's Fields (check_json): the
same machinery as the TOML configs. JsonDocError is a ValueError as well, so a reader that
takes an unreadable state file as absent (a cache) still does.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Union

from hexbundle.support.errors import InputError
from hexbundle.support.files import named, read_named_file, read_state

MAX_DEPTH = 64
INT_LIMIT = 2 ** 64
# hexbundle's own state and records (digest cache, doit's DB, reports): bounded, but roomy
STATE_MAX_BYTES = 512 << 20


class JsonDocError(InputError, ValueError):
    """A JSON document that is not JSON, or is out of bounds: the message names the file, what
    is wrong and what to do."""


def _refusal(value, depth: int, max_depth: int, allow_nan: bool):
    """Why a decoded value is out of bounds, or None."""
    kind = type(value)
    if kind is float and value - value != 0 and not allow_nan:   # inf - inf, NaN - NaN: NaN
        return f"{value!r}: a finite number is expected (JSON has no NaN or Infinity)"
    if kind is int and not -INT_LIMIT <= value <= INT_LIMIT:
        return (f"an integer of {len(str(abs(value)))} digits, outside +-2**64 (the widest "
                "field any number here ends in)")
    if (kind is dict or kind is list) and depth > max_depth:
        return (f"nested more than {max_depth} arrays and objects deep, deeper than any such "
                "file")
    return None


def _out_of_bounds(doc, max_depth: int, allow_nan: bool):
    """(key path, why) of a value out of bounds, or None: walked with a stack, never recursion
    (the value may be as deep as the parser let it be). Strings, bools and small numbers, the
    bulk of any document, cost one type test each."""
    if type(doc) is not dict and type(doc) is not list:
        why = _refusal(doc, 1, max_depth, allow_nan)
        return ("(the top level)", why) if why else None
    stack = [(doc, 1, None, None)]
    while stack:
        value, depth, parent, key = stack.pop()
        why = _refusal(value, depth, max_depth, allow_nan)
        if why:
            return _path(parent, key), why
        if type(value) is dict:
            items = value.items()
        elif type(value) is list:
            if _in_bounds_list(value, allow_nan):
                continue
            items = enumerate(value)
        else:
            continue
        here = (parent, key)
        for k, v in items:
            kind = type(v)
            if kind is dict or kind is list or (kind is float and v - v != 0) or \
                    (kind is int and not -INT_LIMIT <= v <= INT_LIMIT):
                stack.append((v, depth + 1, here, k))
    return None


_SCALARS = frozenset({str, bool, type(None)})


def _in_bounds_list(values: list, allow_nan: bool) -> bool:
    """True if no element of the list needs a look, judged over the whole list at C speed (an
    encodings file is mostly long lists of scales and offsets); False sends it through the walk,
    which then names the first element out of bounds. A sum of floats is finite only if every
    one is (NaN or an infinity makes it NaN or infinite; a finite sum that overflows only sends
    the list through the walk)."""
    kinds = set(map(type, values))
    if kinds <= _SCALARS:
        return True
    if kinds <= _SCALARS | {float}:
        if allow_nan:
            return True
        floats = values if kinds == {float} else [v for v in values if type(v) is float]
        return math.isfinite(sum(floats))
    if kinds <= {int}:
        return -INT_LIMIT <= min(values) and max(values) <= INT_LIMIT
    return False


def _path(parent, key) -> str:
    parts = []
    while parent is not None:
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
        parent, key = parent
    text = "".join(reversed(parts)).lstrip(".")
    if len(text) > 100:   # the start says where, the end which key
        text = f"{text[:40]}...{text[-57:]}"
    return text or "(the top level)"


def parse_json(data: Union[bytes, str], where: str, fix: str = "", *,
               max_bytes: int = STATE_MAX_BYTES, max_depth: int = MAX_DEPTH,
               allow_nan: bool = False) -> Any:
    """The decoded document, or JsonDocError "WHERE: what is wrong; FIX". `where` names the
    file (and the option that gave it); `fix` says what to do."""
    fix = f"; {fix}" if fix else ""
    if len(data) > max_bytes:
        raise JsonDocError(f"{where}: {len(data)} bytes, more than this file can be (at most "
                           f"{max_bytes >> 20} MiB){fix}")
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonDocError(f"{where}: not UTF-8 text (byte {exc.start}){fix}") from None

    try:   # NaN and Infinity decode as floats; the walk refuses them by key
        doc = json.loads(data)
    except RecursionError:
        raise JsonDocError(f"{where}: arrays and objects nested more than {max_depth} deep, "
                           f"deeper than any such file{fix}") from None
    except ValueError as exc:
        why = "an integer of more than 4300 digits" if "integer string conversion" in str(exc) \
            else exc
        raise JsonDocError(f"{where}: not valid JSON ({why}){fix}") from None
    found = _out_of_bounds(doc, max_depth, allow_nan)
    if found:
        key, why = found
        raise JsonDocError(f"{where}: key '{key}' is {why}{fix}")
    return doc


def read_json(path: Union[str, Path], what: str, max_bytes: int, fix: str = "",
              argument: str = "", **bounds) -> Any:
    """A JSON file a user named or a bundle holds (support.files.read_named_file: a regular
    file, read no further than `max_bytes`), decoded within bounds."""
    data = read_named_file(path, what, max_bytes, argument)
    return parse_json(data, named(path, argument), fix, max_bytes=max_bytes, **bounds)


def read_state_json(path: Union[str, Path], fix: str = "", max_bytes: int = STATE_MAX_BYTES,
                    **bounds) -> Any:
    """One of hexbundle's own JSON files (support.files.read_state: never through a link),
    decoded within bounds. FileNotFoundError / OSError as read_state raises them."""
    data = read_state(path, max_bytes + 1)
    return parse_json(data, str(path), fix, max_bytes=max_bytes, **bounds)
