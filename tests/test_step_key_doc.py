"""docs/step-key.md is precise enough for another client: its rule, implemented here from the
page alone (not through hexbundle.formats.stepkey), gives the page's example texts and key and
the same text as hexbundle for every step's real options."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
from pathlib import Path

import pytest

from conftest import ROOT
from hexbundle.config.backend_options import ConvertOptions
from hexbundle.config.build import load_build
from hexbundle.config.layout import Layout
from hexbundle.formats import stepkey
from hexbundle.steps import options

DOC = (ROOT / "docs" / "step-key.md").read_text()


def encode(value):
    """The page's table, row by row."""
    if value is None:
        return {"type": "null", "value": None}
    if isinstance(value, bool):
        return {"type": "bool", "value": value}
    if isinstance(value, int):
        return {"type": "int", "value": value}
    if isinstance(value, float):
        return {"type": "float", "value": "%016x" % struct.unpack(">Q", struct.pack(">d", value))[0]}
    if isinstance(value, str):
        return {"type": "str", "value": value}
    if isinstance(value, (list, tuple)):
        return {"type": "list", "value": [encode(v) for v in value]}
    if dataclasses.is_dataclass(value):
        return {"type": "record", "value": {f.name: encode(getattr(value, f.name))
                                            for f in dataclasses.fields(value)}}
    return {"type": "map", "value": {k: encode(v) for k, v in value.items()}}


def text(value) -> str:
    """Sorted keys, no whitespace, non-ASCII escaped: written out, not json.dumps's options."""
    def write(v) -> str:
        if isinstance(v, dict):
            return "{" + ",".join(write(k) + ":" + write(v[k]) for k in sorted(v)) + "}"
        if isinstance(v, list):
            return "[" + ",".join(write(x) for x in v) + "]"
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        out = '"'
        for ch in v:
            if ch in '"\\':
                out += "\\" + ch
            elif ch in "\n\r\t\b\f":
                out += {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}[ch]
            elif ord(ch) < 0x20 or ord(ch) > 0x7e:
                units = ch.encode("utf-16-be")
                out += "".join("\\u%04x" % int.from_bytes(units[i:i + 2], "big")
                               for i in range(0, len(units), 2))
            else:
                out += ch
        return out + '"'
    return write(encode(value))


def test_the_pages_examples_follow_from_its_rule():
    example = {"step": "convert", "arguments": {"part": 1, "graph": "prompt"},
               "options": ConvertOptions(float_bitwidth=16, unencoded_weights="refuse",
                                         truncate_64bit_io=True, quantize_io=False,
                                         quantize_full_type=""),
               "code": "0123abcd", "pins": {},
               "toolchain": {"backend": "reference", "version": "hexbundle-reference 2"}}
    block = re.search(r"```\n(\{.*?\})\n```", DOC, re.S).group(1)
    assert text(example) == block == stepkey.canonical(example)
    key = re.search(r"the step key `([0-9a-f]{64})`", DOC).group(1)
    assert hashlib.sha256(block.encode()).hexdigest() == key
    small = re.search(r"has the text\n`(\{.*?\})`", DOC, re.S).group(1)
    assert text({"x": 0.5, "y": [True, None], "z": "é"}) == small


@pytest.fixture(scope="module")
def cfg():
    return load_build(ROOT)


def every_steps_options(cfg) -> dict:
    found = {name: getattr(options, name)(cfg) for name in
             ("generate_options", "tokenizer_options", "convert_options", "verify_options")}
    found.update({f"compile_options {p.tag}": options.compile_options(cfg, p)
                  for p in cfg.plan.parts()})
    layout = Layout(cfg)   # the described steps' options (config.step_options)
    found.update({name: getattr(options, name)(layout) for name in
                  ("split_options", "bundle_options")})
    found.update({f"compile_step_options {p.tag}": options.compile_step_options(layout, p)
                  for p in cfg.plan.parts()})
    found.update({f"convert_step_options {g.name}": options.convert_step_options(layout, g)
                  for p in cfg.plan.parts() for g in cfg.model.graphs(p)})
    return found


def test_every_steps_real_options_give_the_same_text_by_the_pages_rule(cfg):
    for name, value in every_steps_options(cfg).items():
        assert text(value) == stepkey.canonical(value), name
        assert json.loads(stepkey.canonical(value)) == encode(value), name


def test_a_float_is_its_bits_and_nothing_else_is_repr():
    assert stepkey.encode(0.1) == {"type": "float", "value": "3fb999999999999a"}
    assert stepkey.encode(-0.0) != stepkey.encode(0.0)
    with pytest.raises(stepkey.StepKeyError, match="options.where: a PosixPath"):
        stepkey.encode({"where": Path("/tmp")})
    with pytest.raises(stepkey.StepKeyError, match="set"):
        stepkey.encode({1, 2})
