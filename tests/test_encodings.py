"""AIMET encodings loader: both schemas, every validation error, and a fuzzer."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hexbundle.formats.encodings import load_encodings, parse_encodings
from hexbundle.support.errors import EncodingsError

LEGACY = {
    "version": "0.6.1",
    "activation_encodings": {
        "logits": [{"bitwidth": 16, "dtype": "int", "is_symmetric": "False", "max": 1.0,
                    "min": -1.0, "offset": -32768, "scale": 3.0e-05}]},
    "param_encodings": {
        "w1": [{"bitwidth": 4, "dtype": "int", "is_symmetric": "True", "max": 0.7, "min": -0.8,
                "offset": -8, "scale": 0.1},
               {"bitwidth": 4, "dtype": "int", "is_symmetric": "True", "max": 1.4, "min": -1.6,
                "offset": -8, "scale": 0.2}],
        "embed": [{"bitwidth": 16, "dtype": "int", "is_symmetric": "False", "offset": -30000,
                   "scale": 0.0001, "min": -3.0, "max": 3.5535}],
        "norm": [{"bitwidth": 16, "dtype": "float"}],
    },
}

V1 = {
    "version": "1.0.0",
    "activation_encodings": [{"name": "logits", "bw": 16, "dtype": "INT", "enc_type": "PER_TENSOR",
                              "is_sym": False, "scale": [3.0e-05], "offset": [-32768]}],
    "param_encodings": [
        {"name": "w1", "bw": 4, "dtype": "INT", "enc_type": "PER_CHANNEL", "is_sym": True,
         "scale": [0.1, 0.2], "offset": [-8, -8]},
        {"name": "embed", "bw": 16, "dtype": "INT", "enc_type": "PER_TENSOR", "is_sym": False,
         "scale": [0.0001], "offset": [-30000]},
        {"name": "norm", "bw": 16, "dtype": "FLOAT"},
    ],
    "excluded_layers": [],
    "quantizer_args": {"activation_bitwidth": 16},
}


def write(tmp_path, data, name="model.encodings"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("data,schema", [(LEGACY, "0.6.1"), (V1, "1.0.0")])
def test_both_schemas_give_the_same_encodings(tmp_path, data, schema):
    enc = load_encodings(write(tmp_path, data))
    assert enc.schema == schema
    assert set(enc.params) == {"w1", "embed", "norm"} and set(enc.activations) == {"logits"}
    w1 = enc.params["w1"]
    assert (w1.bitwidth, w1.dtype, w1.symmetric, w1.per_channel, w1.channels) == (4, "int", True, True, 2)
    assert w1.scale.dtype == np.float32 and w1.offset.dtype == np.float32   # fractional with a shifted zero point
    np.testing.assert_array_equal(w1.scale, np.array([0.1, 0.2], np.float32))
    assert w1.offset.tolist() == [-8, -8]
    embed = enc.params["embed"]
    assert (embed.bitwidth, embed.per_channel, embed.symmetric, embed.offset.tolist()) == (16, False, False, [-30000])
    norm = enc.params["norm"]
    assert (norm.dtype, norm.bitwidth, norm.channels) == ("float", 16, 0)
    assert enc.activations["logits"].offset.tolist() == [-32768]


def test_the_same_bytes_are_parsed_once_and_an_edit_is_read_afresh(tmp_path, monkeypatch):
    """A part's prompt and token graphs share their encodings' bytes: the second load is the
    first's parse (named after its own file); the same path with other bytes is parsed again,
    which a memo keyed on the path would miss."""
    import hexbundle.formats.encodings as encodings_module
    parses = []
    monkeypatch.setattr(encodings_module, "_PARSED", {})   # what earlier tests kept
    real = encodings_module.parse_encodings
    monkeypatch.setattr(encodings_module, "parse_encodings",
                        lambda data, source="": parses.append(source) or real(data, source))
    prompt, token = write(tmp_path, V1, "prompt.encodings"), write(tmp_path, V1, "token.encodings")
    first, second = load_encodings(prompt), load_encodings(token)
    assert parses == [str(prompt)]
    assert (first.source, second.source) == (str(prompt), str(token))
    assert second.params["w1"].scale is first.params["w1"].scale
    with pytest.raises(ValueError):   # shared, so no reader may change it
        second.params["w1"].scale[0] = 1.0
    edited = copy.deepcopy(V1)
    edited["param_encodings"][0]["scale"] = [0.1, 0.4]
    write(tmp_path, edited, "token.encodings")
    assert load_encodings(token).params["w1"].scale.tolist() == pytest.approx([0.1, 0.4])
    assert parses == [str(prompt), str(token)]


def test_legacy_without_version_and_boolean_symmetry(tmp_path):
    data = copy.deepcopy(LEGACY)
    del data["version"]
    data["param_encodings"]["w1"][0]["is_symmetric"] = True
    data["param_encodings"]["w1"][1]["is_symmetric"] = True
    assert load_encodings(write(tmp_path, data)).params["w1"].symmetric is True


# --- errors: each names the file, the tensor and the key -----------------------------------------

def legacy_with(mutate):
    data = copy.deepcopy(LEGACY)
    mutate(data)
    return data


def v1_with(mutate):
    data = copy.deepcopy(V1)
    mutate(data)
    return data


def set_w1(key, value, schema="legacy"):
    if schema == "legacy":
        return legacy_with(lambda d: d["param_encodings"]["w1"][1].__setitem__(key, value))
    return v1_with(lambda d: d["param_encodings"][0].__setitem__(key, value))


BAD = [
    ("not json", "{not json", "not valid JSON"),
    ("top level list", [1, 2], "top level must be a JSON object"),
    ("no params", legacy_with(lambda d: d.pop("param_encodings")), "missing top-level key 'param_encodings'"),
    ("legacy bitwidth 3", set_w1("bitwidth", 3), r"\['w1'\]\[1\]: key 'bitwidth' is 3"),
    ("legacy bitwidth str", set_w1("bitwidth", "4"), r"'w1'.*key 'bitwidth'"),
    ("legacy scale zero", set_w1("scale", 0.0), r"'w1'.*key 'scale' channel 1 is 0.0"),
    ("legacy scale negative", set_w1("scale", -0.1), r"'w1'.*key 'scale' channel 1"),
    ("legacy scale nan", set_w1("scale", float("nan")), r"'w1'.*key 'scale' channel 1 is NaN"),
    ("legacy scale inf", set_w1("scale", float("inf")), r"'w1'.*key 'scale'"),
    ("legacy offset too low", set_w1("offset", -16), r"'w1'.*key 'offset' channel 1 is -16.*\[-15, 0\]"),
    ("legacy offset positive", set_w1("offset", 3), r"'w1'.*key 'offset'"),
    ("legacy offset fractional", set_w1("offset", -7.3), r"'w1'.*key 'offset'"),
    ("legacy symmetric yes", set_w1("is_symmetric", "yes"), r"'w1'.*key 'is_symmetric'"),
    ("legacy missing scale", legacy_with(lambda d: d["param_encodings"]["w1"][0].pop("scale")),
     r"\['w1'\]\[0\]: missing key 'scale'"),
    ("legacy mixed bitwidths", set_w1("bitwidth", 8), r"'w1'.*differ from channel 0"),
    ("legacy empty list", legacy_with(lambda d: d["param_encodings"].__setitem__("w1", [])), r"'w1'.*non-empty list"),
    ("legacy float bitwidth 8", legacy_with(lambda d: d["param_encodings"]["norm"][0].__setitem__("bitwidth", 8)),
     r"'norm'.*float encodings must use one of 16, 32"),
    ("v1 bw 2", set_w1("bw", 2, "v1"), r"'w1'.*key 'bw' is 2"),
    ("v1 missing name", v1_with(lambda d: d["param_encodings"][0].pop("name")), r"param_encodings\[0\]: missing key 'name'"),
    ("v1 missing scale", v1_with(lambda d: d["param_encodings"][0].pop("scale")), r"'w1'.*missing key 'scale'"),
    ("v1 length mismatch", set_w1("offset", [-8], "v1"), r"'w1'.*2 scales but 1 offsets"),
    ("v1 LPBQ without compressed_bw", set_w1("enc_type", "LPBQ", "v1"), r"'w1'.*missing key 'compressed_bw'"),
    ("v1 is_sym string", set_w1("is_sym", "True", "v1"), r"'w1'.*key 'is_sym'"),
    ("v1 duplicate", v1_with(lambda d: d["param_encodings"].append(d["param_encodings"][0])), r"'w1'.*listed twice"),
    ("v1 dict section", v1_with(lambda d: d.__setitem__("param_encodings", {})), r"'param_encodings' must be a list"),
    ("v1 per-tensor two scales", v1_with(lambda d: d["param_encodings"][1].update(scale=[1.0, 2.0], offset=[0, 0])),
     r"'embed'.*PER_TENSOR needs exactly one scale"),
    ("unknown version", legacy_with(lambda d: d.__setitem__("version", "7.0")), "unsupported encodings version"),
    ("scale beyond float32", set_w1("scale", 1e300), r"'w1'.*float32"),
    ("huge integer scale", set_w1("scale", 10 ** 400),   # refused by the JSON layer, by key
     r"key 'param_encodings\.w1\[1\]\.scale' is an integer of 401 digits"),
]


@pytest.mark.parametrize("label,data,pattern", BAD, ids=[b[0] for b in BAD])
def test_bad_encodings_name_file_tensor_and_key(tmp_path, label, data, pattern):
    path = write(tmp_path, data, name="bad.encodings")
    with pytest.raises(EncodingsError, match=pattern) as info:
        load_encodings(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(EncodingsError, match="not found"):
        load_encodings(tmp_path / "absent.encodings")


def test_binary_garbage(tmp_path):
    path = tmp_path / "x.encodings"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(EncodingsError, match="x.encodings"):
        load_encodings(path)


def test_deep_nesting_is_an_encodings_error(tmp_path):
    with pytest.raises(EncodingsError):
        load_encodings(write(tmp_path, "[" * 100000 + "]" * 100000))


# --- fuzzing: bad input gives EncodingsError and nothing else -------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["True", "False", "int", "float", "INT", "FLOAT", "PER_CHANNEL",
                                     "PER_TENSOR", "LPBQ", "1.0.0", "0.6.1", "w1", ""]),
                    st.text(max_size=5))
KEYS = ["version", "param_encodings", "activation_encodings", "name", "bw", "bitwidth", "dtype",
        "enc_type", "is_sym", "is_symmetric", "scale", "offset", "min", "max", "w1"]
json_like = st.recursive(scalars, lambda children: st.one_of(
    st.lists(children, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=3)), children, max_size=5)),
    max_leaves=25)


def mutated(base):
    """Valid documents with one value somewhere replaced by random JSON: near-misses find more bugs."""
    def replace(doc, path, value):
        doc = copy.deepcopy(doc)
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return doc

    paths = []

    def walk(node, path):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            paths.append(path + [key])
            walk(child, path + [key])
    walk(base, [])
    return st.builds(replace, st.just(base), st.sampled_from(paths), json_like)


# 2.0.0 entries as aimet-onnx 2.42 writes them (tests/data/aimet): per channel, per block, LPBQ,
# an int32 bias, an activation with a zero point, a shifted (fractional) zero point.
V2 = {"version": "2.0.0", "encodings": [
    {"name": "w1", "output_dtype": "int4", "axis": 1, "y_scale": [0.1, 0.2]},
    {"name": "w2", "output_dtype": "int4", "axis": 0, "block_size": 2, "y_scale": [[0.1, 0.2], [0.3, 0.4]]},
    {"name": "w3", "output_dtype": "int4", "axis": 0, "block_size": 2,
     "per_channel_float_scale": [[0.01, 0.02]], "per_block_int_scale": [[1, 16], [3, 4]]},
    {"name": "b1", "output_dtype": "int32", "axis": 0, "y_scale": [1e-7, 2e-7]},
    {"name": "x", "output_dtype": "uint16", "y_scale": 1.3e-4, "y_zero_point": 32710},
    {"name": "z", "output_dtype": "int4", "axis": 1, "y_scale": [0.1, 0.2], "y_zero_point": [-0.5, -0.5]}]}


def test_v2_reads_each_kind_into_the_unsigned_convention():
    enc = parse_encodings(V2, source="v2.encodings").for_graph({"w1", "w2", "w3", "b1", "z"})
    w1, w2, w3, z = (enc.params[n] for n in ("w1", "w2", "w3", "z"))
    assert (w1.enc_type, w1.bitwidth, w1.axis, w1.offset.tolist()) == ("PER_CHANNEL", 4, 1, [-8, -8])
    # [in/2][out] y_scale -> [channel][block] order
    assert (w2.enc_type, w2.block_size, w2.axis, w2.block_axis) == ("PER_BLOCK", 2, 1, 0)
    assert w2.scale.tolist() == pytest.approx([0.1, 0.3, 0.2, 0.4])
    assert w3.enc_type == "LPBQ" and w3.scale.tolist() == pytest.approx([0.01, 0.03, 0.32, 0.08])
    assert enc.params["b1"].dtype == "float"        # an int32 bias stays float
    x = enc.activations["x"]
    assert (x.bitwidth, x.symmetric, x.offset.tolist()) == (16, False, [-32710])
    assert z.offset.tolist() == [-7.5, -7.5] and not z.symmetric


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@given(st.one_of(json_like, mutated(LEGACY), mutated(V1), mutated(V2),
                 st.fixed_dictionaries({"version": st.sampled_from(["1.0.0", "0.6.1"]),
                                        "param_encodings": json_like,
                                        "activation_encodings": json_like})))
def test_fuzz_only_encodings_errors(data):
    try:
        enc = parse_encodings(data, source="fuzz.encodings")
    except EncodingsError as exc:
        assert "fuzz.encodings" in str(exc)
        return
    for param in list(enc.params.values()) + list(enc.activations.values()):
        assert param.scale.dtype == np.float32 and param.offset.dtype == np.float32
        assert np.all(np.isfinite(param.scale)) and np.all(param.scale > 0)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_raw_bytes(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("fuzz") / "f.encodings"
    path.write_bytes(raw)
    try:
        load_encodings(path)
    except EncodingsError:
        pass


# Values a scale or offset may hold in a file: in range, out of it, of the wrong kind.
_CHANNEL_VALUE = st.one_of(
    st.integers(-2 ** 40, 2 ** 40), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.none(), st.text(max_size=2),
    st.sampled_from([0.5, 0.3, -127.5, -7.5, -8, -15, -16, -255, -256, 1e-45, 1.2e-38, 3.5e38,
                     2 ** 70, 10 ** 400]))


@settings(max_examples=400, deadline=None)
@given(channels=st.lists(st.tuples(_CHANNEL_VALUE, _CHANNEL_VALUE), min_size=1, max_size=4),
       bitwidth=st.sampled_from([4, 8, 16, 32]))
def test_a_scale_list_judged_whole_is_judged_as_channel_by_channel(channels, bitwidth):
    """formats.encodings judges a scale/offset list whole (numpy) and only on doubt channel by
    channel: the same verdict, message and arrays as the channel-by-channel loop alone."""
    from hexbundle.formats import encodings as reader
    scales, offsets = [s for s, _ in channels], [o for _, o in channels]

    def judged(whole: bool):
        saved = reader._channels_valid
        if not whole:
            reader._channels_valid = lambda *args: False
        try:
            scale, offset = reader._scale_offset_arrays(scales, offsets, bitwidth, "t")
            return "ok", scale.tobytes(), offset.tobytes()
        except EncodingsError as exc:
            return "refused", str(exc)
        except OverflowError:
            return "overflow"
        finally:
            reader._channels_valid = saved
    assert judged(True) == judged(False)
