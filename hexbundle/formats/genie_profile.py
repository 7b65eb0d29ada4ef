"""The JSON profile `genie-t2t-run --profile OUT.json` writes (reader only: Genie writes it).

What hexbundle reads (Genie's profiling tutorial in the SDK docs): a query event's
`time-to-first-token` (microseconds) and `token-generation-rate` (tokens per second), each
{"value": N, "unit": ...}, in components[].events[]. The last query event that has both counts.

It comes from the board, so it is data to judge: decoded within support.jsondoc's bounds, and
each value a measurement can be (config.schema's Field: a finite number >= 0, not true/false):
anything else is refused by key, never reported as a time or a rate.
"""
from __future__ import annotations

from hexbundle.config.schema import FLOAT32_MAX, Field, check_value
from hexbundle.support.errors import ConfigError, FormatError
from hexbundle.support.files import JSON_CONFIG_MAX_BYTES
from hexbundle.support.jsondoc import parse_json

# a duration in microseconds, a rate in tokens per second: finite, not negative
MEASUREMENT = Field(float, min=0.0, max=FLOAT32_MAX)
KEYS = ("time-to-first-token", "token-generation-rate")


def read_profile(data: bytes, where: str) -> tuple:
    """(time to first token in us, token rate in tokens/s)."""
    doc = parse_json(data, where, "the board's Genie profile; run again",
                     max_bytes=JSON_CONFIG_MAX_BYTES)
    found = None
    components = doc.get("components", []) if isinstance(doc, dict) else []
    for c, component in enumerate(components if isinstance(components, list) else []):
        events = component.get("events", []) if isinstance(component, dict) else []
        for e, event in enumerate(events if isinstance(events, list) else []):
            values = [_value(event, key, where, f"components[{c}].events[{e}].{key}.value")
                      for key in KEYS]
            if None not in values:
                found = tuple(values)
    if found is None:
        raise FormatError(f"{where}: no event with time-to-first-token and "
                          "token-generation-rate in the Genie profile")
    return found


def _value(event, key: str, where: str, path: str):
    """The event's measurement of `key`; None if it has none; FormatError if it is one no
    measurement can be (NaN, infinite, negative, true/false, not a number)."""
    entry = event.get(key) if isinstance(event, dict) else None
    if not isinstance(entry, dict) or "value" not in entry:
        return None
    try:
        return check_value(entry["value"], MEASUREMENT, where, path)
    except ConfigError as exc:
        raise FormatError(f"{exc}: not a measurement; the board's genie-t2t-run wrote "
                          "something else than a profile") from None
