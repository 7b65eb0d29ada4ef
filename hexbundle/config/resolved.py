"""The resolved config as JSON: the one writer (`dump`) and the one reader (`load`).

A build step receives the configuration the doit run resolved (config.build.load_build: build.toml,
HEXBUNDLE_* variables, the command line, the model, device and plan), not the command line to
resolve again: `steps.executor.step_spec` carries `dump(cfg)` and `steps.runner` rebuilds the
same frozen values with `load`, in this process or in the toolchain container (which mounts the
project and the build root at the same absolute paths, so the resolved paths hold there too).

Every value is tagged with what it is, so `load(dump(cfg)) == cfg` for every config
(tests/test_resolved_config.py): a dataclass as {"@type": "module:Name", field: value, ...}
(only hexbundle.config's own types: a spec names no other code to import), a tuple, a Path, a
FrozenMap and a dict each under their own tag; str, int, float, bool and None as JSON has them.
"""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

from hexbundle.config.schema import SECTION_TYPES, FrozenMap
from hexbundle.support.errors import HexbundleError

MODULE_PREFIX = "hexbundle.config."
TYPE, TUPLE, PATH, MAP, DICT = "@type", "@tuple", "@path", "@frozenmap", "@dict"


class SpecError(HexbundleError):
    """A step spec's config is not one `dump` wrote (a bug, or a spec from another version)."""


def dump(value):
    """A resolved config (or any value inside one) as JSON-able data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        out = {TYPE: f"{cls.__module__}:{cls.__qualname__}"}
        out.update({f.name: dump(getattr(value, f.name)) for f in dataclasses.fields(value)})
        return out
    if isinstance(value, tuple):
        return {TUPLE: [dump(v) for v in value]}
    if isinstance(value, Path):
        return {PATH: str(value)}
    if isinstance(value, FrozenMap):
        return {MAP: {k: dump(v) for k, v in value.items()}}
    if isinstance(value, dict):
        # as pairs: a dict's order is part of its repr (a spec's JSON may be key-sorted)
        return {DICT: [[_key(k), dump(v)] for k, v in value.items()]}
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise SpecError(f"resolved config: a {type(value).__name__} has no JSON form "
                    f"({value!r}); config.resolved writes dataclasses, tuples, paths and maps")


def _key(key) -> str:
    if not isinstance(key, str):
        raise SpecError(f"resolved config: map key {key!r} is not a string")
    return key


def load(data):
    """The value `dump` wrote, rebuilt: the same frozen dataclasses, tuples, paths and maps."""
    if isinstance(data, dict):
        if TYPE in data:
            return _dataclass(data)
        if len(data) == 1:
            (tag, inner), = data.items()
            if tag == TUPLE and isinstance(inner, list):
                return tuple(load(v) for v in inner)
            if tag == PATH and isinstance(inner, str):
                return Path(inner)
            if tag == MAP and isinstance(inner, dict):
                return FrozenMap({k: load(v) for k, v in inner.items()})
            if tag == DICT and isinstance(inner, list):
                return {_key(k): load(v) for k, v in inner}
        raise SpecError(f"resolved config: untagged table {sorted(data)[:4]}; not written by "
                        "config.resolved.dump")
    if isinstance(data, list):
        raise SpecError("resolved config: an untagged list; not written by config.resolved.dump")
    return data


def _dataclass(data: dict):
    cls = type_named(data[TYPE])
    values = {k: load(v) for k, v in data.items() if k != TYPE}
    names = {f.name for f in dataclasses.fields(cls)}
    if set(values) != names:
        raise SpecError(f"resolved config: {data[TYPE]} has fields {sorted(names)}, the spec "
                        f"gives {sorted(values)}: the spec comes from another hexbundle version")
    return cls(**values)


def type_named(name: str) -> type:
    """One of hexbundle.config's dataclasses (a section type included) by its "module:Name"."""
    module, _, qualname = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not module.startswith(MODULE_PREFIX) or not qualname:
        raise SpecError(f"resolved config: type {name!r} is not one of hexbundle.config's")
    try:
        found = vars(importlib.import_module(module))
    except ImportError:
        raise SpecError(f"resolved config: no module {module}") from None
    cls = SECTION_TYPES.get((module, qualname)) or found.get(qualname)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise SpecError(f"resolved config: {name} is not a dataclass of {module}")
    return cls
