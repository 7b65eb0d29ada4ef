"""Recording and the strict config base class of the stand-in QAIRT SDK (tests only)."""
import enum
import json
import os


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
