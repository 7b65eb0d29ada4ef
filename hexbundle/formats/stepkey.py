"""The step key: a build step's typed options (and what else its outputs depend on besides its
files) as canonical JSON, the one writer and reader of it. docs/step-key.md is the rule, byte
for byte, so that another client can compute the same key.

Every value is written as {"type": T, "value": V}:

  null    None                 "value": null
  bool    True / False         "value": true / false
  int     int (not bool)       "value": the integer, in decimal
  float   float                "value": the IEEE-754 binary64 bits, 16 lower-case hex digits,
                               big-endian (0.5 -> "3fe0000000000000"): exact, and no client's
                               float formatting can differ
  str     str                  "value": the string
  list    tuple or list        "value": [each element, encoded], in order
  map     a mapping, str keys  "value": {key: value encoded}
  record  a dataclass          "value": {field name: value encoded}, every field

Anything else (a Path, an enum, a set, a mapping with other keys) is refused: a key must never
hold `repr` text, which changes with the Python version and the class's repr. The text is
`json.dumps(encoded, sort_keys=True, separators=(",", ":"), ensure_ascii=True)`; the key is the
SHA-256 of that text (ASCII) in lower-case hex.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from collections.abc import Mapping

from hexbundle.support.jsondoc import parse_json


class StepKeyError(TypeError):
    """A value that has no step-key encoding (a programming error: options are plain data)."""


def encode(value, where: str = "options"):
    """`value` as typed JSON data (see the module's docstring)."""
    if value is None:
        return {"type": "null", "value": None}
    if isinstance(value, bool):
        return {"type": "bool", "value": value}
    if isinstance(value, int) and type(value) is int:
        return {"type": "int", "value": value}
    if isinstance(value, float) and type(value) is float:
        return {"type": "float", "value": struct.pack(">d", value).hex()}
    if isinstance(value, str) and type(value) is str:
        return {"type": "str", "value": value}
    if isinstance(value, (tuple, list)):
        return {"type": "list", "value": [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": "record", "value": {f.name: encode(getattr(value, f.name),
                                                           f"{where}.{f.name}")
                                            for f in dataclasses.fields(value)}}
    if isinstance(value, Mapping):
        if not all(type(k) is str for k in value):
            raise StepKeyError(f"{where}: a mapping whose keys are not all strings")
        return {"type": "map", "value": {k: encode(v, f"{where}.{k}") for k, v in value.items()}}
    raise StepKeyError(f"{where}: a {type(value).__name__} ({value!r}) has no step-key "
                       "encoding: give the step plain data (bool, int, float, str, tuple, "
                       "mapping, dataclass)")


def canonical(value) -> str:
    """The canonical text of `value`, encoded."""
    return dumps(encode(value))


def dumps(encoded) -> str:
    """The canonical text of already encoded data."""
    return json.dumps(encoded, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def key_of(text: str) -> str:
    """The key: SHA-256 of the canonical text, lower-case hex."""
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def decode_leaf(encoded) -> object:
    """A leaf's Python value (a float from its bits), for messages."""
    kind, value = encoded.get("type"), encoded.get("value")
    if kind == "float":
        return struct.unpack(">d", bytes.fromhex(value))[0]
    return value


def shown(encoded) -> str:
    """A value as a message shows it: JSON's true/false/null, floats by repr, containers whole."""
    if not isinstance(encoded, dict) or encoded.get("type") not in ("null", "bool", "int",
                                                                    "float", "str"):
        return json.dumps(plain(encoded), sort_keys=True)
    value = decode_leaf(encoded)
    if isinstance(value, float):
        return repr(value)
    return value if isinstance(value, str) else json.dumps(value)


def plain(encoded):
    """Encoded data back to plain JSON values (floats decoded): for messages only."""
    if not isinstance(encoded, dict) or "type" not in encoded:
        return encoded
    kind, value = encoded["type"], encoded.get("value")
    if kind == "list":
        return [plain(v) for v in value]
    if kind in ("map", "record"):
        return {k: plain(v) for k, v in value.items()}
    return decode_leaf(encoded)


def differences(old, new, path: str = "") -> list:
    """(dotted path, old encoded, new encoded) of each leaf or container that differs, the
    deepest first found: what changed between two encoded values (None: absent)."""
    if old == new:
        return []
    if (isinstance(old, dict) and isinstance(new, dict) and old.get("type") == new.get("type")
            and old.get("type") in ("map", "record")):
        a, b = old["value"], new["value"]
        out = []
        for k in sorted(set(a) | set(b)):
            out += differences(a.get(k), b.get(k), f"{path}.{k}" if path else k)
        return out
    if (isinstance(old, dict) and isinstance(new, dict) and old.get("type") == "list"
            and new.get("type") == "list" and len(old["value"]) == len(new["value"])):
        out = []
        for i, (x, y) in enumerate(zip(old["value"], new["value"])):
            out += differences(x, y, f"{path}[{i}]")
        return out
    return [(path, old, new)]


def loads(text: str):
    """Canonical text back to encoded data; None when it is not a step key's text."""
    try:
        data = parse_json(text, "step key")
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) and "type" in data else None
