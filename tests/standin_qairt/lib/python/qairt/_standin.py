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


class Config:
    """Declared fields with defaults; an unknown field is an error (pydantic extra='forbid')."""

    FIELDS: dict = {}

    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - set(self.FIELDS))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown field(s) {unknown} "
                            "(extra fields not permitted)")
        self.set_fields = dict(kwargs)
        for name, default in self.FIELDS.items():
            setattr(self, name, kwargs.get(name, default))

    def __repr__(self):
        inner = ", ".join(f"{k}={v!r}" for k, v in self.set_fields.items())
        return f"{type(self).__name__}({inner})"
