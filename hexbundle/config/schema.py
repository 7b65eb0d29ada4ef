"""A small declarative TOML schema: enough to validate and to explain.

An unknown key, a wrong type or an out-of-range value is an error naming the file, the key and
what is allowed (with a "did you mean" for a near miss) -- the opposite of the QAIRT CLI, which
logs "Unknown Key" and carries on.
"""
from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, make_dataclass, replace
from pathlib import Path
from typing import Any, Optional

import tomli

from hexbundle.support.errors import ConfigError


# The ranges of the fields numbers end in (a config number gets its destination's: a value past
# it would wrap, or be read as another number, where it lands).
U32 = 2 ** 32 - 1            # Genie's counts and seeds (its parser reads them as 32-bit)
U64 = 2 ** 64 - 1            # byte budgets; numpy's seeds
I64 = 2 ** 63 - 1            # docker's byte sizes (int64)
FLOAT32_MAX = 3.4028234663852886e38   # a float Genie or the backend holds in 32 bits
PORT = (1, 65535)
# A string with no control character (C0, DEL, C1): what a special token or a name printed in a
# config may hold (a NUL in a token ends its string in C).
NO_CONTROL = r"[^\x00-\x1f\x7f-\x9f]+"


# A Field of this type takes any value: a JSON document's keys hexbundle does not read
ANY = object


@dataclass(frozen=True)
class Field:
    type: Any                      # bool, int, float, str, list (of `item`), a dict schema, ANY
    default: Any = ...             # ... = required
    choices: tuple = ()
    min: Optional[float] = None
    max: Optional[float] = None
    item: Any = None               # element type for lists
    pattern: str = ""              # regex a str must fully match
    doc: str = ""
    # another valid value, where none can be derived from the type, choices, range or pattern
    # (tests/test_every_setting.py changes every setting to another valid value)
    example: Any = None
    # How the steps run (where, their limits, the cache they consult), never what they write:
    # in no step's key; a nested build (`doit release`) is given it as the command line gave it.
    run_setting: bool = False

    @property
    def required(self) -> bool:
        return self.default is ...


def _describe(f: Field) -> str:
    if isinstance(f.type, dict):
        return "a table"
    if f.type is ANY:
        return "any value"
    name = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            list: f"a list of {_describe(Field(f.item)) if f.item else 'values'}"}[f.type]
    if f.choices:
        name += " (one of " + ", ".join(repr(c) for c in f.choices) + ")"
    if f.min is not None or f.max is not None:
        name += f" in [{f.min if f.min is not None else '-inf'}, {f.max if f.max is not None else 'inf'}]"
    if f.pattern:
        name += f" matching {f.pattern}"
    return name


def _type_ok(value: Any, t: Any) -> bool:
    if t is ANY:
        return True
    if t is bool:
        return isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t is str:
        return isinstance(value, str)
    if t is list:
        return isinstance(value, list)
    if isinstance(t, dict):
        return isinstance(value, dict)
    return False


def shown(value: Any, limit: int = 80) -> str:
    """repr(value) for a message, cut short: a 100 KB value is named, not printed."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit // 2]}... ({len(text)} characters)"


def check_value(value: Any, f: Field, where: str, key: str) -> Any:
    if not _type_ok(value, f.type):
        raise ConfigError(f"{where}: key '{key}' is {type(value).__name__} {shown(value)}; "
                          f"expected {_describe(f)}")
    if f.type is float:
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{where}: key '{key}' must be finite, got {value!r}")
    if isinstance(f.type, dict):
        return validate(value, f.type, where, key + ".")
    if f.type is list:
        if f.item is not None:
            each = Field(f.item, min=f.min, max=f.max, pattern=f.pattern)   # per element
            value = [check_value(v, each, where, f"{key}[{i}]")
                     for i, v in enumerate(value)]
        return value
    if f.choices and value not in f.choices:
        raise ConfigError(f"{where}: key '{key}' is {shown(value)}; allowed: "
                          + ", ".join(repr(c) for c in f.choices))
    if f.min is not None and value < f.min or f.max is not None and value > f.max:
        raise ConfigError(f"{where}: key '{key}' is {shown(value)}; expected {_describe(f)}")
    if f.pattern and not re.fullmatch(f.pattern, value):
        raise ConfigError(f"{where}: key '{key}' is {shown(value)}; expected {_describe(f)}")
    return value


# Keys a config may still hold from an older hexbundle, by dotted path: refused with what replaced
# them, rather than as unknown keys (config.build retires them).
RETIRED_KEYS: dict = {}


def retire(path: str, replaced_by: str) -> None:
    RETIRED_KEYS[path] = replaced_by


def validate(data: dict, schema: dict, where: str, prefix: str = "") -> dict:
    """Check `data` against `schema`; return a copy with defaults filled in."""
    out = {}
    for key in data:
        if prefix + key in RETIRED_KEYS and key not in schema:
            raise ConfigError(f"{where}: key '{prefix}{key}' is no longer read: "
                              f"{RETIRED_KEYS[prefix + key]}")
        if key not in schema and "*" not in schema:
            hint = difflib.get_close_matches(key, list(schema), n=1)
            allowed = ", ".join(k for k in schema)
            raise ConfigError(f"{where}: unknown key '{prefix}{key}'"
                              + (f" (did you mean '{prefix}{hint[0]}'?)" if hint else "")
                              + f"; allowed here: {allowed}")
    for key, f in schema.items():
        if key == "*":
            for k, v in data.items():
                if k not in schema:
                    out[k] = check_value(v, f, where, prefix + k)
            continue
        if key not in data:
            if isinstance(f.type, dict) and f.required and not _has_required(f.type):
                f = Field(f.type, {})  # a table whose keys all have defaults may be left out
            if f.required:
                raise ConfigError(f"{where}: missing key '{prefix}{key}' ({_describe(f)}"
                                  + (f": {f.doc}" if f.doc else "") + ")")
            # an optional table (default {}) still gets its own defaults filled in
            out[key] = validate(f.default, f.type, where, prefix + key + ".") \
                if isinstance(f.type, dict) else f.default
            continue
        out[key] = check_value(data[key], f, where, prefix + key)
    return out


def _has_required(schema: dict) -> bool:
    return any(k != "*" and f.required for k, f in schema.items())


def read_toml(path: Path, schema: dict) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        with open(path, "rb") as fh:
            data = tomli.load(fh)
    except tomli.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}; fix it there") from None
    except RecursionError:   # tomli refuses inline arrays/tables nested > 400 deep this way
        raise ConfigError(f"{path}: not valid TOML: nested too deeply; fix it") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save "
                          "it as UTF-8 TOML") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return validate(data, schema, str(path))


def check_json(doc: Any, schema: dict, where: str, fix: str = "") -> dict:
    """A decoded JSON document (support.jsondoc: already within its size, depth and number
    bounds) against `schema`, as read_toml checks a TOML config: ConfigError naming the file
    and the key, and `fix`, what to do. `doc` itself is returned (defaults are not filled in:
    a document's absent key is absent)."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: a JSON {_json_kind(doc)}, not an object" +
                          (f"; {fix}" if fix else ""))
    try:
        validate(doc, schema, where)
    except ConfigError as exc:
        raise ConfigError(f"{exc}" + (f"; {fix}" if fix else "")) from None
    return doc


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number"}.get(type(value), "null")


# ---------------------------------------------------------------------------------------------
# Loaded tables as frozen, typed values: read by attribute, never by string key.

class FrozenMap(Mapping):
    """A read-only table whose keys are data, not settings (e.g. [inputs.pins]: file name ->
    pin): looked up by key, hashable, and its repr is canonical (sorted), so it can be part of a
    step's key."""

    def __init__(self, items=()):
        self._items = tuple(sorted(dict(items).items()))
        self._index = dict(self._items)

    def __getitem__(self, key):
        return self._index[key]

    def __iter__(self):
        return iter(self._index)

    def __len__(self):
        return len(self._items)

    def __hash__(self):
        return hash(self._items)

    def __eq__(self, other):
        return isinstance(other, FrozenMap) and self._items == other._items

    def __repr__(self):
        return f"FrozenMap({dict(self._items)!r})"


_PYTHON_TYPES = {bool: bool, int: int, float: float, str: str, list: tuple}
# Every section type made, by (module, name): config.resolved rebuilds a nested section (whose
# class is no module attribute) by its name.
SECTION_TYPES: dict = {}


def _title(key: str) -> str:
    return key.title().replace("_", "")


def run_settings(schema: dict) -> dict:
    """`schema` with every field marked a run setting (Field.run_setting)."""
    return {key: replace(f, run_setting=True) for key, f in schema.items()}


def section_type(name: str, schema: dict, module: str = __name__) -> type:
    """A frozen dataclass with one field per key of `schema`, in the schema's order (so its repr,
    which a step's key may hold, is canonical): the schema stays the one list of a table's keys.
    A nested table is a section of its own; a table of '*' keys is a FrozenMap (of sections,
    when its values are tables). Lists become tuples."""
    fields, entries = [], {}
    for key, f in schema.items():
        if isinstance(f.type, dict) and "*" in f.type:
            inner = f.type["*"]
            if isinstance(inner.type, dict):
                entries[key] = section_type(name + _title(key) + "Entry", inner.type, module)
            kind = FrozenMap
        elif isinstance(f.type, dict):
            kind = section_type(name + _title(key), f.type, module)
        else:
            kind = _PYTHON_TYPES[f.type]
        fields.append((key, kind))
    cls = make_dataclass(name, fields, frozen=True)
    cls.__module__ = module
    cls.schema, cls.entries = schema, entries
    SECTION_TYPES[(module, name)] = cls
    return cls


def to_section(cls: type, table: dict):
    """A validated table (validate()'s output: every key present) as a `cls` (section_type)."""
    values = {}
    for key in cls.schema:
        value, kind = table[key], cls.__dataclass_fields__[key].type
        if kind is FrozenMap:
            entry = cls.entries.get(key)
            value = FrozenMap({k: to_section(entry, v) if entry else _plain(v)
                               for k, v in value.items()})
        elif hasattr(kind, "schema"):
            value = to_section(kind, value)
        else:
            value = _plain(value)
        values[key] = value
    return cls(**values)


def _plain(value):
    return tuple(value) if isinstance(value, list) else value


def table_of(section) -> dict:
    """A section (to_section) back as a plain table, for JSON: what a manifest or provenance
    records of the settings, key for key as the TOML spells them."""
    def plain(value):
        if hasattr(value, "schema"):
            return table_of(value)
        if isinstance(value, FrozenMap):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value
    return {key: plain(getattr(section, key)) for key in section.schema}
