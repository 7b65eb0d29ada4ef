"""Recording and the strict config base class of the stand-in QAIRT SDK (tests only)."""
import enum
import json
import os
import re
from pathlib import Path


def serialize(value):
    if isinstance(value, Config):
        return {"class": f"{type(value).__module__}.{type(value).__qualname__}",
                "set": {k: serialize(v) for k, v in value.set_fields.items()}}
    if isinstance(value, enum.Enum):
        return {"enum": f"{type(value).__module__}.{type(value).__qualname__}",
                "member": value.name}
    if isinstance(value, (list, tuple)):
        return [serialize(v) for v in value]
    if hasattr(value, "standin_record"):
        return value.standin_record()
    return value


def record(call: str, *args, **kwargs) -> None:
    path = os.environ.get("STANDIN_QAIRT_RECORD")
    if not path:
        return
    with open(path, "a") as fh:
        fh.write(json.dumps({"call": call, "args": serialize(list(args)),
                             "kwargs": {k: serialize(v) for k, v in kwargs.items()}},
                            sort_keys=True) + "\n")


def mode() -> str:
    return os.environ.get("STANDIN_QAIRT_MODE", "ok")


# The build strings real QAIRT releases print (qnn-context-binary-utility's buildId) and carry
# in their libraries, by the sdk.yaml version (read from the onnxruntime-qnn wheels' files).
REAL_BUILDS = {"2.42.0.251225": "v2.42.0.251225135753_193295",
               "2.45.40.260406": "v2.45.40.260406130939",
               "2.51.0.260929": "v2.51.0.260929181845"}


def sdk_build() -> str:
    """The long-form build string of the release this stand-in SDK says it is (its sdk.yaml,
    as hexbundle reads it): what a real compile writes into its context binaries."""
    root = Path(__file__).resolve().parents[3]
    text = (root / "sdk.yaml").read_text()
    version = re.search(r"^version:\s*(\S+)", text, re.MULTILINE).group(1)
    return REAL_BUILDS.get(version, f"v{version}000000")


REQUIRED = object()


class Config:
    """Declared fields with defaults; an unknown field, a missing required one or a value its
    check() refuses is an error, at construction and on assignment (pydantic extra='forbid',
    validate_assignment=True)."""

    FIELDS: dict = {}

    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - set(self.FIELDS))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown field(s) {unknown} "
                            "(extra fields not permitted)")
        missing = [k for k, v in self.FIELDS.items() if v is REQUIRED and k not in kwargs]
        if missing:
            raise ValueError(f"{type(self).__name__}: field(s) {missing} required")
        object.__setattr__(self, "set_fields", dict(kwargs))
        for name, default in self.FIELDS.items():
            object.__setattr__(self, name, kwargs.get(name, default))
        self.check()

    def check(self):
        pass

    def __setattr__(self, name, value):
        if name not in self.FIELDS:
            raise TypeError(f"{type(self).__name__}: unknown field {name!r}")
        old = getattr(self, name)
        object.__setattr__(self, name, value)
        try:
            self.check()
        except Exception:
            object.__setattr__(self, name, old)
            raise
        self.set_fields[name] = value

    def __repr__(self):
        inner = ", ".join(f"{k}={v!r}" for k, v in self.set_fields.items())
        return f"{type(self).__name__}({inner})"
