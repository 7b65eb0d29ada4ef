"""The JSON profile `genie-t2t-run --profile OUT.json` writes (reader only: Genie writes it).

What hexbundle reads (Genie's profiling tutorial in the SDK docs): a query event's
`time-to-first-token` (microseconds) and `token-generation-rate` (tokens per second), each
{"value": N, "unit": ...}, in components[].events[]. The last query event that has both counts.
"""
from __future__ import annotations

import json

from hexbundle.support.errors import FormatError


def read_profile(data: bytes, where: str) -> tuple:
    """(time to first token in us, token rate in tokens/s)."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise FormatError(f"{where}: the Genie profile is not JSON ({exc})") from None
    found = None
    for component in doc.get("components", []) if isinstance(doc, dict) else []:
        for event in component.get("events", []) if isinstance(component, dict) else []:
            ttft = _value(event, "time-to-first-token")
            rate = _value(event, "token-generation-rate")
            if ttft is not None and rate is not None:
                found = (ttft, rate)
    if found is None:
        raise FormatError(f"{where}: no event with time-to-first-token and "
                          "token-generation-rate in the Genie profile")
    return found


def _value(event, key: str):
    entry = event.get(key) if isinstance(event, dict) else None
    value = entry.get("value") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, (int, float)) else None
