"""Fuzzed inputs through real `doit bundle` runs: nothing is ever built from invalid data.

The inputs are Qualcomm's own export (tests/data/qaihm/export, written by qai-hub-models 0.55.0),
imported as it comes. Each case mutates ONE file of a copy of it -- ONNX bytes or structure, the
external `.data`, the AIMET encodings, tokenizer.json, or puts a special file (FIFO, directory,
device) where a file belongs -- and runs a real `doit bundle` in a subprocess. It must end in one
of two ways:
  - a clean error: non-zero exit, no traceback, the mutated file named, and the bundle that was
    there before the run left byte for byte as it was;
  - a bundle, and then an independent judge (onnx.checker's full check + onnxruntime loading the
    graph, every weight finite, the `tokenizers` library, the encodings' numbers finite and
    positive where they must be) accepts the mutated input: the mutation was harmless.
A run that hangs (a FIFO read forever) is killed after HANG_S and fails the case.

The cases are drawn once from a fixed seed, so a failing id reproduces on its own:
`pytest tests/test_fuzz_inputs.py -k onnx-flip-07`. Every case restores its file afterwards.
"""
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import ROOT, copy_project
from hexbundle.support.hashing import file_digest

pytestmark = pytest.mark.heavy   # 221 real doit runs, ~10 minutes: the full suite (`pytest --full`)

DATA = ROOT / "tests" / "data" / "qaihm" / "export"
SLUG = "qwen2_5_7b_instruct"
MODEL = "fuzzed"
HANG_S = 60
SEED = 20261203


def graph_stem(ar: int, part: int) -> str:
    stem = f"{SLUG}_w8a16_ar{ar}_cl256_{part}_of_6"
    return f"ar{ar}_cl256/{stem}.aimet/{stem}"


# The graphs mutated: a decoder part's prompt and token graphs, the embedding's token graph, the
# LM head's prompt graph (4-bit, 16-bit gather and 8-bit weights between them).
GRAPHS = [graph_stem(128, 2), graph_stem(1, 2), graph_stem(1, 1), graph_stem(128, 6)]
TOKENIZER = "tokenizer.json"


# ---- the cases ---------------------------------------------------------------------------------

def _float_constants(source) -> list:
    """The float Constant nodes of a graph (a path or a model)."""
    g = (onnx.load(str(source), load_external_data=False) if isinstance(source, Path)
         else source).graph
    return [n for n in g.node if n.op_type == "Constant" and n.attribute
            and n.attribute[0].type == onnx.AttributeProto.TENSOR
            and n.attribute[0].t.data_type == onnx.TensorProto.FLOAT]


def _inline_floats(source) -> list:
    """The float initializers a graph keeps inline (not in its .data)."""
    g = (onnx.load(str(source), load_external_data=False) if isinstance(source, Path)
         else source).graph
    return [t for t in g.initializer if t.data_location != onnx.TensorProto.EXTERNAL
            and t.data_type == onnx.TensorProto.FLOAT]


def _cases() -> list:
    rng = random.Random(SEED)
    cases = []

    def add(cid, kind, rel, **params):
        cases.append(pytest.param(kind, rel, params, id=cid))

    def graph():
        return rng.choice(GRAPHS)

    def size(rel):
        return (DATA / rel).stat().st_size

    # ONNX bytes: the protobuf itself damaged.
    for i in range(30):
        rel = graph() + ".onnx"
        add(f"onnx-flip-{i:02d}", "flip", rel, offset=rng.randrange(size(rel)), xor=rng.randrange(1, 256))
    for i in range(10):
        rel = graph() + ".onnx"
        add(f"onnx-truncate-{i:02d}", "truncate", rel, length=rng.randrange(size(rel)))
    for i in range(10):
        rel = graph() + ".onnx"
        add(f"onnx-insert-{i:02d}", "insert", rel, offset=rng.randrange(size(rel)),
            data=rng.randbytes(rng.randrange(1, 9)).hex())
    for i in range(10):
        rel = graph() + ".onnx"
        add(f"onnx-zero-{i:02d}", "zero", rel, offset=rng.randrange(size(rel) - 16), length=16)

    # ONNX structure: a valid protobuf that is not a valid graph (or not the graph it should be).
    structural = [("drop-node", 8), ("dangling-input", 6), ("unknown-op", 4), ("input-dim", 6),
                  ("input-dtype", 4), ("output-dim", 4), ("duplicate-initializer", 3),
                  ("drop-initializer", 3), ("data-offset", 3), ("bad-attribute", 3)]
    for name, n in structural:
        for i in range(n):
            add(f"onnx-{name}-{i:02d}", name, graph() + ".onnx", pick=rng.randrange(1 << 30))
    for name, location in (("location-non-utf8", b"\xff\xfe.data"),
                           ("location-absolute", b"/etc/passwd"),
                           ("location-traversal", b"../../../outside.data"),
                           ("location-missing", b"nowhere.data")):
        add(f"onnx-{name}", "location", graph() + ".onnx", location=location.hex())
    for opset in (99, 1):
        add(f"onnx-opset-{opset}", "opset", graph() + ".onnx", opset=opset)
    for part in (2, 6):     # the AR-1 token graph copied over the AR-128 prompt graph
        add(f"onnx-token-over-prompt-{part}", "token-over-prompt", graph_stem(128, part) + ".onnx",
            part=part)

    # .data: the weights' bytes.
    for i in range(8):
        add(f"data-nan-{i:02d}", "float", graph() + ".data", pick=rng.randrange(1 << 30), value="nan")
    for i in range(6):
        add(f"data-inf-{i:02d}", "float", graph() + ".data", pick=rng.randrange(1 << 30),
            value=rng.choice(["inf", "-inf"]))
    for i in range(6):
        add(f"data-huge-{i:02d}", "float", graph() + ".data", pick=rng.randrange(1 << 30),
            value=rng.choice(["1e5", "-7e4", "3e38"]))
    for i in range(10):
        rel = graph() + ".data"
        add(f"data-flip-{i:02d}", "flip", rel, offset=rng.randrange(size(rel)), xor=rng.randrange(1, 256))
    for i in range(5):
        rel = graph() + ".data"
        add(f"data-truncate-{i:02d}", "truncate", rel, length=rng.randrange(size(rel)))
    for i in range(5):
        rel = graph() + ".data"
        add(f"data-extend-{i:02d}", "insert", rel, offset=size(rel),
            data=rng.randbytes(rng.randrange(1, 4097)).hex())

    # Encodings: AIMET's JSON.
    for i in range(4):
        rel = graph() + ".encodings"
        add(f"enc-truncate-{i:02d}", "truncate", rel, length=rng.randrange(size(rel)))
    add("enc-non-utf8", "insert", graph() + ".encodings", offset=1, data="ff")
    add("enc-bom", "insert", graph() + ".encodings", offset=0, data="efbbbf")
    add("enc-empty", "truncate", graph() + ".encodings", length=0)
    json_edits = [("drop-params", 2), ("drop-activations", 1), ("scale-zero", 2),
                  ("scale-negative", 2), ("scale-nan", 2), ("scale-huge", 1), ("scale-string", 1),
                  ("bitwidth-0", 1), ("bitwidth-3", 1), ("bitwidth-33", 1), ("bitwidth-string", 1),
                  ("bitwidth-bool", 1), ("offset-huge", 2), ("offset-null", 2), ("drop-entry", 3),
                  ("dtype-bogus", 2), ("is-sym-string", 2), ("version-bogus", 1),
                  ("scale-list-short", 3), ("unknown-tensor", 2)]
    for name, n in json_edits:
        for i in range(n):
            add(f"enc-{name}-{i:02d}", "encodings", graph() + ".encodings", edit=name,
                pick=rng.randrange(1 << 30))

    # tokenizer.json.
    add("tok-bom", "insert", TOKENIZER, offset=0, data="efbbbf")
    add("tok-non-utf8", "insert", TOKENIZER, offset=2, data="ff")
    add("tok-empty", "truncate", TOKENIZER, length=0)
    for i in range(2):
        add(f"tok-truncate-{i:02d}", "truncate", TOKENIZER, length=rng.randrange(size(TOKENIZER)))
    for name in ("unknown-key", "special-id-shifted", "special-id-bool", "special-id-string",
                 "special-id-negative", "special-id-beyond-vocab", "special-ids-same",
                 "no-added-tokens", "vocab-wider", "vocab-id-beyond", "special-content",
                 "model-type", "deep-nesting", "special-id-float"):
        add(f"tok-{name}", "tokenizer", TOKENIZER, edit=name)

    # Special files where a file belongs.
    for what, rel in (("onnx", GRAPHS[0] + ".onnx"), ("data", GRAPHS[0] + ".data"),
                      ("encodings", GRAPHS[0] + ".encodings"), ("tokenizer", TOKENIZER)):
        add(f"special-fifo-{what}", "fifo", rel)
        add(f"special-dir-{what}", "directory", rel)
    add("special-dev-zero-data", "device", GRAPHS[1] + ".data", device="/dev/zero")
    add("special-dev-null-onnx", "device", GRAPHS[1] + ".onnx", device="/dev/null")
    # Non-finite constants outside the .data (issue 26, item 1); drawn last, so the cases
    # above keep the draws they had: a float Constant node's value,
    # an inline float initializer (raw_data or float_data).
    with_constants = [g for g in GRAPHS if _float_constants(DATA / (g + ".onnx"))]
    with_inline = [g for g in GRAPHS if _inline_floats(DATA / (g + ".onnx"))]
    for i in range(6):
        add(f"onnx-constant-nonfinite-{i:02d}", "constant-nonfinite",
            rng.choice(with_constants) + ".onnx", pick=rng.randrange(1 << 30),
            value=rng.choice(["nan", "inf", "-inf"]))
    for i in range(4):
        add(f"onnx-inline-nonfinite-{i:02d}", "inline-nonfinite", rng.choice(with_inline) + ".onnx",
            pick=rng.randrange(1 << 30), value=rng.choice(["nan", "inf", "-inf"]),
            field=rng.choice(["raw_data", "float_data"]))
    # Links where a file belongs (issue 26, items 7 and 8): a loop, and a link to nothing; no
    # draw, so every case above keeps its own.
    for what, rel in (("onnx", GRAPHS[0] + ".onnx"), ("data", GRAPHS[0] + ".data"),
                      ("encodings", GRAPHS[0] + ".encodings"), ("tokenizer", TOKENIZER)):
        add(f"special-loop-{what}", "symlink-loop", rel)
        add(f"special-dangling-{what}", "dangling", rel)

    return cases


CASES = _cases()


def test_there_are_enough_cases():
    assert len(CASES) >= 200


# ---- the mutations -----------------------------------------------------------------------------

def _rewrite(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def _model(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path), load_external_data=False)


def _save(path: Path, model: onnx.ModelProto) -> None:
    _rewrite(path, model.SerializeToString())


def _mutate_graph(path: Path, kind: str, pick: int) -> None:
    model = _model(path)
    g = model.graph
    nodes = list(g.node)
    node = nodes[pick % len(nodes)]
    if kind == "drop-node":
        g.node.remove(node)
    elif kind == "dangling-input":
        inputs = [i for i, name in enumerate(node.input) if name] or [0]
        if not node.input:
            node.input.append("")
        node.input[inputs[pick % len(inputs)]] = "no_such_tensor_anywhere"
    elif kind == "unknown-op":
        node.op_type = "NotAnOnnxOp"
    elif kind == "input-dim":
        inp = g.input[pick % len(g.input)]
        dims = inp.type.tensor_type.shape.dim
        dims[(pick >> 8) % len(dims)].dim_value = [1, 3, 4096][(pick >> 16) % 3]
    elif kind == "input-dtype":
        inp = g.input[pick % len(g.input)]
        inp.type.tensor_type.elem_type = [onnx.TensorProto.INT8, onnx.TensorProto.DOUBLE,
                                          onnx.TensorProto.FLOAT16][(pick >> 8) % 3]
    elif kind == "output-dim":
        out = g.output[pick % len(g.output)]
        dims = out.type.tensor_type.shape.dim
        dims[(pick >> 8) % len(dims)].dim_value = 7
    elif kind == "duplicate-initializer":
        g.initializer.append(g.initializer[pick % len(g.initializer)])
    elif kind == "drop-initializer":
        g.initializer.remove(g.initializer[pick % len(g.initializer)])
    elif kind == "data-offset":
        external = [t for t in g.initializer if t.external_data]
        t = external[pick % len(external)]
        for entry in t.external_data:
            if entry.key == "offset":
                entry.value = str([1, 10**9, int(entry.value) + 3][(pick >> 8) % 3])
    elif kind == "bad-attribute":
        with_attrs = [n for n in nodes if n.attribute] or nodes
        n = with_attrs[pick % len(with_attrs)]
        if n.attribute:
            a = n.attribute[0]
            a.ClearField("ints")
            a.ClearField("floats")
            a.type = onnx.AttributeProto.INT
            a.i = -12345
        else:
            n.attribute.append(onnx.helper.make_attribute("not_an_attribute", 1))
    else:
        raise AssertionError(kind)
    _save(path, model)


def _set_nonfinite(path: Path, kind: str, pick: int, value: str, field: str = "") -> None:
    """A float Constant's value, or an inline float initializer, made NaN or infinite."""
    model = _model(path)
    if kind == "constant-nonfinite":
        nodes = _float_constants(model)
        tensor = nodes[pick % len(nodes)].attribute[0].t
        values = numpy_helper.to_array(tensor).copy()
        values.reshape(-1)[(pick >> 8) % max(values.size, 1)] = float(value)
        tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    else:
        inline = _inline_floats(model)
        tensor = inline[pick % len(inline)]
        values = numpy_helper.to_array(tensor).copy()
        values.reshape(-1)[(pick >> 8) % max(values.size, 1)] = float(value)
        tensor.ClearField("raw_data")
        tensor.ClearField("float_data")
        if field == "raw_data":
            tensor.raw_data = values.astype("<f4").tobytes()
        else:
            tensor.float_data.extend(values.reshape(-1).tolist())
    _save(path, model)


def _set_location(path: Path, location: bytes) -> None:
    # protobuf refuses a non-UTF-8 str field: edit the serialized bytes instead.
    model = _model(path)
    marker = "LOCATION-MARKER-0123456789"
    first = next(t for t in model.graph.initializer if t.external_data)
    for entry in first.external_data:
        if entry.key == "location":
            entry.value = marker
    data = model.SerializeToString()
    m = marker.encode()
    # The length prefix of a 26-byte string is one byte; keep it valid for the new length.
    i = data.index(m)
    assert data[i - 1] == len(m)
    _rewrite(path, data[:i - 1] + bytes([len(location)]) + location + data[i + len(m):])


def _token_over_prompt(export: Path, part: int) -> None:
    """The token graph's ONNX where the prompt graph's belongs, its external data pointed at the
    prompt graph's .data (the same weights, byte for byte): what a copy-paste slip produces."""
    prompt, token = export / (graph_stem(128, part) + ".onnx"), export / (graph_stem(1, part) + ".onnx")
    model = _model(token)
    for t in model.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = prompt.with_suffix(".data").name
    _save(prompt, model)


def _float_positions(onnx_path: Path) -> list:
    """(offset, length) of each float32 weight in the graph's .data."""
    out = []
    for t in _model(onnx_path).graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and t.external_data:
            info = {e.key: e.value for e in t.external_data}
            out.append((int(info.get("offset", 0)), int(info["length"])))
    return out


def _write_float(data_path: Path, pick: int, value: str) -> None:
    spans = _float_positions(data_path.with_suffix(".onnx"))
    offset, length = spans[pick % len(spans)]
    at = offset + 4 * ((pick >> 10) % (length // 4))
    raw = bytearray(data_path.read_bytes())
    raw[at:at + 4] = np.float32(float(value)).tobytes()
    _rewrite(data_path, bytes(raw))


def _edit_encodings(path: Path, edit: str, pick: int) -> None:
    doc = json.loads(path.read_text())
    params = doc["param_encodings"]
    enc = params[pick % len(params)]
    if edit == "drop-params":
        del doc["param_encodings"]
    elif edit == "drop-activations":
        del doc["activation_encodings"]
    elif edit.startswith("scale-"):
        bad = {"scale-zero": 0.0, "scale-negative": -0.01, "scale-nan": float("nan"),
               "scale-huge": 1e300, "scale-string": "0.01"}.get(edit)
        if edit == "scale-list-short":
            enc["scale"] = enc["scale"][:-1] if len(enc["scale"]) > 1 else []
        else:
            enc["scale"] = [bad] * len(enc["scale"])
    elif edit.startswith("bitwidth-"):
        enc["bw"] = {"bitwidth-0": 0, "bitwidth-3": 3, "bitwidth-33": 33, "bitwidth-string": "8",
                     "bitwidth-bool": True}[edit]
    elif edit == "offset-huge":
        enc["offset"] = [-(2 ** 40)] * len(enc["offset"])
    elif edit == "offset-null":
        enc["offset"] = None
    elif edit == "drop-entry":
        params.remove(enc)
    elif edit == "dtype-bogus":
        enc["dtype"] = "BOGUS"
    elif edit == "is-sym-string":
        enc["is_sym"] = "yes"
    elif edit == "version-bogus":
        doc["version"] = "9.9.9"
    elif edit == "unknown-tensor":
        params.append({**enc, "name": "no.such.weight"})
    else:
        raise AssertionError(edit)
    _rewrite(path, json.dumps(doc).encode())


def _edit_tokenizer(path: Path, edit: str) -> None:
    doc = json.loads(path.read_text())
    added = doc["added_tokens"]
    vocab = doc["model"]["vocab"]
    if edit == "unknown-key":
        doc["not_a_tokenizer_key"] = 1
    elif edit == "special-id-shifted":
        added[1]["id"] = 7
    elif edit == "special-id-bool":
        added[1]["id"] = True
    elif edit == "special-id-string":
        added[1]["id"] = "1"
    elif edit == "special-id-negative":
        added[2]["id"] = -1
    elif edit == "special-id-beyond-vocab":
        added[2]["id"] = 5000
    elif edit == "special-ids-same":
        added[2]["id"] = added[1]["id"]
    elif edit == "no-added-tokens":
        del doc["added_tokens"]
    elif edit == "vocab-wider":
        base = max(vocab.values()) + 1
        for k in range(1100):
            vocab[f"zz{k}"] = base + k
    elif edit == "vocab-id-beyond":
        vocab["zzfar"] = 4096
    elif edit == "special-content":
        added[1]["content"] = "<|im_begin|>"
    elif edit == "model-type":
        doc["model"]["type"] = "Bogus"
    elif edit == "deep-nesting":
        _rewrite(path, _deep_json(doc).encode())
        return
    elif edit == "special-id-float":
        added[1]["id"] = 1.5
    else:
        raise AssertionError(edit)
    _rewrite(path, json.dumps(doc).encode())


def _deep_json(doc: dict) -> str:
    """json.dumps recurses: build a 5000-deep normalizer by hand."""
    body = {k: v for k, v in doc.items() if k != "normalizer"}
    text = json.dumps(body)
    return text[:-1] + ', "normalizer": ' + '{"x": ' * 5000 + "{}" + "}" * 5000 + "}"


def mutate(export: Path, kind: str, rel: str, params: dict) -> None:
    path = export / rel
    if kind == "flip":
        raw = bytearray(path.read_bytes())
        raw[params["offset"]] ^= params["xor"]
        _rewrite(path, bytes(raw))
    elif kind == "truncate":
        _rewrite(path, path.read_bytes()[:params["length"]])
    elif kind == "insert":
        raw = path.read_bytes()
        at = params["offset"]
        _rewrite(path, raw[:at] + bytes.fromhex(params["data"]) + raw[at:])
    elif kind == "zero":
        raw = bytearray(path.read_bytes())
        raw[params["offset"]:params["offset"] + params["length"]] = bytes(params["length"])
        _rewrite(path, bytes(raw))
    elif kind == "location":
        _set_location(path, bytes.fromhex(params["location"]))
    elif kind == "opset":
        model = _model(path)
        model.opset_import[0].version = params["opset"]
        _save(path, model)
    elif kind == "token-over-prompt":
        _token_over_prompt(export, params["part"])
    elif kind in ("constant-nonfinite", "inline-nonfinite"):
        _set_nonfinite(path, kind, params["pick"], params["value"], params.get("field", ""))
    elif kind == "float":
        _write_float(path, params["pick"], params["value"])
    elif kind == "encodings":
        _edit_encodings(path, params["edit"], params["pick"])
    elif kind == "tokenizer":
        _edit_tokenizer(path, params["edit"])
    elif kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif kind == "directory":
        path.unlink()
        path.mkdir()
    elif kind == "device":
        path.unlink()
        path.symlink_to(params["device"])
    elif kind == "symlink-loop":   # path -> path.loop -> path
        path.unlink()
        path.symlink_to(path.name + ".loop")
        path.with_name(path.name + ".loop").symlink_to(path.name)
    elif kind == "dangling":
        path.unlink()
        path.symlink_to(path.name + ".gone")
    else:
        _mutate_graph(path, kind, params["pick"])


def restore(export: Path, rel: str) -> None:
    path = export / rel
    loop = path.with_name(path.name + ".loop")
    if loop.is_symlink():
        loop.unlink()
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    shutil.copyfile(DATA / rel, path)


# ---- the independent judge ---------------------------------------------------------------------

def _judge_graph(onnx_path: Path) -> None:
    import onnxruntime as ort
    onnx.checker.check_model(str(onnx_path), full_check=True)
    ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    model = onnx.load(str(onnx_path))     # with its external data
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype.kind == "f":
            assert np.isfinite(a).all(), f"{t.name} has a non-finite weight"
    for node in model.graph.node:         # constants outside the initializers too
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                a = numpy_helper.to_array(attr.t)
                if a.dtype.kind == "f":
                    assert np.isfinite(a).all(), f"{node.name} has a non-finite {attr.name}"
            elif attr.type in (onnx.AttributeProto.FLOAT, onnx.AttributeProto.FLOATS):
                values = [attr.f] if attr.type == onnx.AttributeProto.FLOAT else attr.floats
                assert all(math.isfinite(v) for v in values), f"{node.name}: {attr.name}"


def _numbers(value):
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)


def _judge_encodings(path: Path) -> None:
    doc = json.loads(path.read_bytes().decode("utf-8"))
    assert isinstance(doc.get("param_encodings"), list)
    assert isinstance(doc.get("activation_encodings"), list)
    for n in _numbers(doc):
        assert math.isfinite(n)
    for enc in doc["param_encodings"] + doc["activation_encodings"]:
        assert type(enc.get("bw")) is int and 1 < enc["bw"] <= 32, enc.get("name")
        scales = enc.get("scale", [])
        assert all(type(s) is float and s > 0 for s in scales), enc.get("name")


def _judge_tokenizer(path: Path, specials: dict, vocab_size: int) -> None:
    from tokenizers import Tokenizer
    raw = path.read_bytes()
    assert not raw.startswith(b"\xef\xbb\xbf")
    tok = Tokenizer.from_file(str(path))
    ids = {}
    for role, content in specials.items():
        tid = tok.token_to_id(content)
        assert type(tid) is int and 0 <= tid < vocab_size, (role, tid)
        ids[role] = tid
    assert len(set(ids.values())) == len(ids)
    assert tok.get_vocab_size(with_added_tokens=True) <= vocab_size


def judge(export: Path, rel: str) -> None:
    """Raises when the mutated input is not valid by the judges' own lights."""
    path = export / rel
    assert path.is_file() and not path.is_symlink(), "not a regular file"
    if rel.endswith(".onnx") or rel.endswith(".data"):
        _judge_graph(path.with_suffix(".onnx"))
    elif rel.endswith(".encodings"):
        _judge_encodings(path)
    else:
        _judge_tokenizer(path, {"bos": "<|im_start|>", "eos": "<|im_end|>", "eot": "<|endoftext|>"},
                         1024)


# ---- the runs ----------------------------------------------------------------------------------

def bundle_digests(bundle: Path) -> dict:
    return {str(p.relative_to(bundle)): file_digest(p) for p in sorted(bundle.rglob("*"))
            if p.is_file()}


def run_bundle(root: Path) -> tuple:
    """(exit code, stdout + stderr) of a real `doit bundle`; a hang is killed with its group."""
    proc = subprocess.Popen([sys.executable, "-m", "doit", "bundle", f"model={MODEL}"], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out


@pytest.fixture(scope="module")
def fuzz_project(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    proj = copy_project(base / "proj")
    export = base / "export"
    shutil.copytree(DATA, export)
    proj.doit("import_export", "--dir", str(export), "--name", MODEL)
    proj.doit("bundle", f"model={MODEL}")
    return proj, export


@pytest.mark.parametrize("kind, rel, params", CASES)
def test_a_fuzzed_input_is_refused_cleanly_or_harmless(fuzz_project, kind, rel, params):
    proj, export = fuzz_project
    bundle = proj.bundle(MODEL)
    before = bundle_digests(bundle)
    mutate(export, kind, rel, params)
    try:
        code, out = run_bundle(proj.root)
        assert code is not None, f"`doit bundle` hung for {HANG_S}s on {rel}:\n{out[-3000:]}"
        assert "Traceback" not in out, out[-4000:]
        if code != 0:
            assert Path(rel).name in out, f"the error does not name {Path(rel).name}:\n{out[-3000:]}"
            assert bundle_digests(bundle) == before, "the previous bundle was damaged"
        else:
            try:
                judge(export, rel)
            except Exception as exc:     # noqa: BLE001 -- any refusal of the judges
                pytest.fail(f"built a bundle from an invalid {rel}: the judge says "
                            f"{type(exc).__name__}: {exc}")
    finally:
        restore(export, rel)
