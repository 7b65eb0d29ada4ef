"""Every input validated before converting (issue 14, item 2): an adversarial campaign built 59
bundles, exit 0, from invalid inputs. Each case here is one of them, refused now.

End to end: real `doit` runs in subprocesses on a user export of the tiny model (as
tests/test_robustness.py's bad inputs), checking the message (file, tensor / node / input / key,
what to do), the non-zero exit, no traceback, and the previous good bundle left as it was.
In process: the validation module (hexbundle/inputs/validate.py), the tokenizer reader
(hexbundle/formats/tokenizer.py, with the real `tokenizers` library) and `doit inspect` on the
export qai-hub-models 0.55.0's own code wrote (tests/data/qaihm/export, copied, never written).
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from conftest import (ROOT, DoitRun, copy_project, snapshot, tiny_as_export,
                      unsplit_only_tree)
from hexbundle.backends import ConvertOptions
from hexbundle.backends.reference import ReferenceBackend
from hexbundle.checks.inspect import inspect_path
from hexbundle.formats.tokenizer import special_token_ids
from hexbundle.inputs.validate import check_onnx
from hexbundle.support.errors import HexbundleError, InputError

EXPORT = "qwen2-tiny-export"
P2, T2 = "prompt_ar128_cl256_2_of_4", "token_ar1_cl256_2_of_4"
D2 = "part_2_of_4"                       # the part's one data file, recorded by both graphs
V_PROJ = "model.layers.0.self_attn.v_proj.weight"     # int4 per channel, [128, 64]
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"     # the first weight of part 2
Q_BIAS = "model.layers.0.self_attn.q_proj.bias"       # no encoding: float16, [128]
QAIHM = ROOT / "tests" / "data" / "qaihm" / "export"
SLUG = "qwen2_5_7b_instruct"
QWEN2_SPECIALS = {"bos": "<|im_start|>", "eos": "<|im_end|>", "eot": "<|endoftext|>"}
HANG_S = 120     # a run that has not ended by then hangs (a safety net, not a timing)
STANDIN_SDK = Path(__file__).resolve().parent / "standin_qairt"


# ---------------------------------------------------------------------------------------------
# helpers

def no_traceback(run: DoitRun) -> None:
    assert "Traceback" not in run.out + run.err, run.out + run.err


def doit_bounded(project, *args, env=None) -> DoitRun:
    """`doit ARGS`, failing the test (not hanging it) if the run never ends: a FIFO read by the
    old code blocked forever."""
    try:
        proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=project.root,
                              capture_output=True, text=True, env={**os.environ, **(env or {})},
                              timeout=HANG_S)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"doit {' '.join(args)} hung ({HANG_S}s): {exc.stdout!r}") from None
    return DoitRun(proc.returncode, proc.stdout, proc.stderr)


def edit_onnx(path: Path, change) -> None:
    """Change the ONNX structure (its external data stays where it is)."""
    model = onnx.load(str(path), load_external_data=False)
    change(model)
    path.write_bytes(model.SerializeToString())


def set_element(onnx_path: Path, name: str, index: tuple, value: float) -> None:
    """Write one float32 element of an external initializer in place."""
    model = onnx.load(str(onnx_path), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.name == name)
    info = {e.key: e.value for e in init.external_data}
    flat = int(np.ravel_multi_index(index, tuple(init.dims)))
    with open(onnx_path.parent / info["location"], "r+b") as fh:
        fh.seek(int(info.get("offset", 0)) + 4 * flat)
        fh.write(np.float32(value).tobytes())


def node_index(model, op_type: str) -> int:
    return next(i for i, n in enumerate(model.graph.node) if n.op_type == op_type)


def fifo_in_place_of(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def tokenizer_json(change=None, raw_prefix: bytes = b"") -> bytes:
    data = json.loads((QAIHM / "tokenizer.json").read_text())
    if change:
        change(data)
    return raw_prefix + json.dumps(data).encode()


# ---------------------------------------------------------------------------------------------
# the export, built once; every case is undone after it

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return tiny_as_export(tmp_path_factory.mktemp("validate") / "proj", EXPORT)


def ex(project, name: str) -> Path:
    return project.root / "exports" / "qwen2-tiny" / name


@contextmanager
def restored(project):
    """Undo whatever a case does to the export: FIFOs first (reading one would block)."""
    export = project.root / "exports" / "qwen2-tiny"
    saved = {p: p.read_bytes() for p in export.iterdir() if p.is_file()}
    try:
        yield
    finally:
        for p in export.iterdir():
            if not p.is_file() or p not in saved:
                p.unlink()
        for p, data in saved.items():
            if not p.exists() or p.read_bytes() != data:
                p.write_bytes(data)


def refused(project, mutate, *args) -> str:
    """Run `doit bundle` on the export with `mutate` applied: it must fail cleanly and keep the
    previous bundle. Returns what it said."""
    with restored(project):
        mutate(project)
        run = doit_bounded(project, "bundle", f"model={EXPORT}", *args)
    text = run.out + run.err
    assert run.code != 0, text
    no_traceback(run)
    assert snapshot(project.bundle(EXPORT)) == project.good
    return text


# ---------------------------------------------------------------------------------------------
# the ONNX: structure, onnx.checker, inputs and outputs against the config (end to end)

def test_an_ar1_token_graph_over_the_ar128_prompt_graph_is_refused_and_verify_fails(exported):
    def swap(p):   # both graphs record the part's one .data: only the ONNX is the wrong one
        shutil.copy(ex(p, f"{T2}.onnx"), ex(p, f"{P2}.onnx"))
    text = refused(exported, swap)
    assert f"{ex(exported, P2 + '.onnx')}: its inputs and outputs are not those of the prompt " \
           f"graph {P2} (AR 128, context length 256, part 2 of 4: layers 0-1)" in text
    assert ("input 'attention_mask' is float32 [1, 1, 1, 256] (needed: float32 "
            "[1, 1, 128, 256])") in text
    assert "put the prompt graph (AR 128) there" in text
    with restored(exported):
        swap(exported)
        run = doit_bounded(exported, "verify", f"model={EXPORT}")
    assert run.code != 0 and "input 'attention_mask' is float32 [1, 1, 1, 256]" in run.out
    no_traceback(run)


def test_a_node_reading_a_tensor_nothing_produces_is_refused(exported):
    def dangling(model):
        node = model.graph.node[node_index(model, "Softmax")]
        node.input[0] = "nobody_makes_this"
    text = refused(exported, lambda p: edit_onnx(ex(p, f"{P2}.onnx"), dangling))
    assert f"{P2}.onnx: node " in text
    assert "(Softmax) reads 'nobody_makes_this', which no graph input, initializer or earlier " \
           "node produces" in text and "re-export the model" in text


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_an_op_onnx_does_not_define_is_refused(exported):
    def unknown(model):
        model.graph.node[node_index(model, "Softmax")].op_type = "SoftMaxx"
    text = refused(exported, lambda p: edit_onnx(ex(p, f"{P2}.onnx"), unknown))
    assert "is op 'SoftMaxx', which ONNX does not define at opset 17; no backend converts it" \
        in text


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_an_opset_onnx_does_not_know_is_refused(exported):
    def opset_99(model):
        for entry in model.opset_import:
            entry.version = 99
    text = refused(exported, lambda p: edit_onnx(ex(p, f"{P2}.onnx"), opset_99))
    assert f"{P2}.onnx: imports ONNX opset 99, which ONNX {onnx.__version__} does not know" \
        in text


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_duplicated_initializer_is_a_clean_error(exported):
    def duplicate(model):
        copy = onnx.TensorProto()
        copy.CopyFrom(next(i for i in model.graph.initializer if i.name == V_PROJ))
        model.graph.initializer.append(copy)
    text = refused(exported, lambda p: edit_onnx(ex(p, f"{P2}.onnx"), duplicate))
    assert f"{P2}.onnx: initializer '{V_PROJ}' is defined 2 times" in text


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_shapes_that_shape_inference_contradicts_are_refused_by_the_checker(exported):
    def wrong_value_info(model):   # an inner tensor declared with a shape its op cannot make
        out = model.graph.node[node_index(model, "Softmax")].output[0]
        model.graph.value_info.append(helper.make_tensor_value_info(
            out, onnx.TensorProto.FLOAT, [7, 7, 7, 7]))
    text = refused(exported, lambda p: edit_onnx(ex(p, f"{P2}.onnx"), wrong_value_info))
    assert f"{P2}.onnx: the ONNX checker refuses it: " in text and "ShapeInferenceError" in text


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_location_that_is_no_file_name_is_a_clean_error(exported):
    def nul(model):
        for entry in next(i for i in model.graph.initializer if i.name == V_PROJ).external_data:
            if entry.key == "location":
                entry.value = f"{D2}\0.data"
    text = refused(exported, lambda p: edit_onnx(ex(p, f"{P2}.onnx"), nul))
    assert f"tensor '{V_PROJ}' (external data '{D2}\\x00.data'): the location is not a valid " \
           "file name" in text


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("location", [".", "./"])
def test_a_location_naming_a_directory_names_the_onnx_and_the_tensor(exported, location):
    """Issue 26, item 8: location="." was refused naming the directory, not the ONNX."""
    def dot(model):
        for entry in next(i for i in model.graph.initializer if i.name == V_PROJ).external_data:
            if entry.key == "location":
                entry.value = location
    text = refused(exported, lambda p: edit_onnx(ex(p, f"{P2}.onnx"), dot))
    assert f"{P2}.onnx: tensor '{V_PROJ}' (external data '{location}'): the location names a " \
           "directory, not a data file; re-export the model" in text, text


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_non_utf8_location_is_a_clean_error(exported):
    def non_utf8(p):   # same length: the only fault is the byte that is no UTF-8
        path = ex(p, f"{P2}.onnx")
        path.write_bytes(path.read_bytes().replace(b"part_2_of_4.data", b"part_2_of_\xff.data"))
    text = refused(exported, non_utf8)
    assert (f"{P2}.onnx: the external data 'location' of tensor '{Q_PROJ}'"
            " (b'part_2_of_\\xff.data') is not UTF-8 text; re-export the model") in text


# ---------------------------------------------------------------------------------------------
# weights: NaN, infinity, float16 overflow (end to end; streamed, in the convert pass)

@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_nan_weight_is_refused_naming_the_tensor_and_the_element(exported):
    text = refused(exported, lambda p: set_element(ex(p, f"{P2}.onnx"), V_PROJ, (5, 3), np.nan))
    assert re.search(rf"_2_of_4\.onnx: weight '{re.escape(V_PROJ)}' holds NaN at \[5, 3\]", text)
    assert "re-export the model" in text


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_an_infinite_float_weight_is_refused(exported):
    text = refused(exported, lambda p: set_element(ex(p, f"{P2}.onnx"), Q_BIAS, (7,), -np.inf))
    assert f"weight '{Q_BIAS}' holds infinity at [7]" in text


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_float16_weight_beyond_65504_is_an_error_and_builds_as_float32(exported, tmp_path):
    text = refused(exported, lambda p: set_element(ex(p, f"{P2}.onnx"), Q_BIAS, (3,), 1e6))
    assert f"weight '{Q_BIAS}' holds 1e+06 at [3]" in text
    assert "stored as float16 (no int encoding): it would become infinity" in text
    assert "float_bitwidth = 32" in text
    with restored(exported):   # at float_bitwidth 32 the same weight is stored as it is
        set_element(ex(exported, f"{P2}.onnx"), Q_BIAS, (3,), 1e6)
        ReferenceBackend().convert(ex(exported, f"{P2}.onnx"), ex(exported, f"{P2}.encodings"),
                                   tmp_path / "p2.dlc", P2, ConvertOptions(float_bitwidth=32),
                                   lambda m: None)
    assert (tmp_path / "p2.dlc").stat().st_size > 0


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def constant_node(value=None, value_float=None):
    """Edit P2's ONNX: its scalar initializer '/const/two' becomes a Constant node's output."""
    def edit(project):
        path = ex(project, f"{P2}.onnx")
        model = onnx.load(str(path), load_external_data=False)
        init = next(i for i in model.graph.initializer if i.name == "/const/two")
        model.graph.initializer.remove(init)
        attrs = {"value": onnx.numpy_helper.from_array(np.array(value, np.float32))} \
            if value is not None else {"value_float": value_float}
        model.graph.node.insert(0, helper.make_node("Constant", [], ["/const/two"],
                                                    name="two", **attrs))
        onnx.save(model, str(path))
    return edit


def inline_initializer(name, value, field):
    """Edit P2's ONNX: a scalar inline initializer set to `value`, in raw_data or float_data."""
    def edit(project):
        path = ex(project, f"{P2}.onnx")
        model = onnx.load(str(path), load_external_data=False)
        init = next(i for i in model.graph.initializer if i.name == name)
        init.ClearField("raw_data")
        init.ClearField("float_data")
        if field == "raw_data":
            init.raw_data = np.float32(value).tobytes()
        else:
            init.float_data.append(value)
        onnx.save(model, str(path))
    return edit


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("mutate, says", [
    (constant_node(value=np.nan), "node 'two' (Constant) attribute 'value' holds NaN"),
    (constant_node(value_float=np.nan), "node 'two' (Constant) attribute 'value_float' holds NaN"),
    (inline_initializer("/const/rms_eps", -np.inf, "raw_data"),
     "initializer '/const/rms_eps' holds infinity"),
    (inline_initializer("/const/attn_scale", np.inf, "float_data"),
     "initializer '/const/attn_scale' holds infinity"),
], ids=["constant-tensor-nan", "constant-value_float-nan", "norm-eps-minus-inf",
        "float_data-plus-inf"])
def test_a_non_finite_constant_anywhere_is_refused(exported, mutate, says):
    """Issue 26, item 1: these four built and shipped (exit 0) before."""
    text = refused(exported, mutate)
    assert f"{P2}.onnx: {says}" in text, text
    assert "re-export the model" in text


def test_non_finite_constants_in_subgraphs_and_functions_are_found(tmp_path):
    from hexbundle.inputs.validate import finite_constants
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    c = helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])
    bad = helper.make_node("Constant", [], ["k"], name="deep",
                           value=onnx.numpy_helper.from_array(np.array([np.inf], np.float32)))
    branch = helper.make_graph([bad], "then", [], [helper.make_tensor_value_info(
        "k", onnx.TensorProto.FLOAT, [1])])
    good = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                             [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [1])])
    node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=branch,
                            else_branch=good)
    model = helper.make_model(helper.make_graph([node], "g", [x, c], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InputError, match=r"node 'branch' \(If\) attribute 'then_branch' "
                                         r"\(subgraph\): node 'deep' \(Constant\) attribute "
                                         r"'value' holds infinity \(element 0\)"):
        finite_constants(tmp_path / "m.onnx", model)
    fn = helper.make_function("local", "f", ["a"], ["b"], [helper.make_node(
        "Constant", [], ["b"], name="fc", value_floats=[1.0, float("nan")])],
        [helper.make_opsetid("", 17)])
    model = helper.make_model(helper.make_graph([], "g", [], []), functions=[fn],
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InputError, match=r"function 'f': node 'fc' \(Constant\) attribute "
                                         r"'value_floats' holds NaN \(element 1\)"):
        finite_constants(tmp_path / "m.onnx", model)


def test_the_qairt_backend_never_gets_a_graph_with_a_nan_weight(tmp_path):
    project = copy_project(tmp_path / "proj")
    project.doit("inputs")
    inputs = project.root / "build" / "qwen2-tiny" / "inputs"
    set_element(inputs / f"{P2}.onnx", V_PROJ, (1, 2), np.nan)
    record = tmp_path / "calls.jsonl"
    run = doit_bounded(project, "convert:part_2_of_4_prompt", "backend=qairt",
                       env={"QAIRT_SDK_ROOT": str(STANDIN_SDK),
                            "STANDIN_QAIRT_RECORD": str(record), "STANDIN_QAIRT_MODE": "ok"})
    assert run.code != 0
    no_traceback(run)
    assert f"{P2}.onnx: weight '{V_PROJ}' holds NaN at [1, 2]" in run.out
    calls = [json.loads(line) for line in record.read_text().splitlines()] \
        if record.exists() else []
    assert not [c for c in calls if c["call"] == "qairt.convert"]


def test_a_weight_is_scanned_block_by_block_and_the_element_located(tmp_path, monkeypatch):
    """check_weight_values streams: with blocks of 2 rows, the NaN in row 5 is found in the
    third block and named by its place in the whole tensor."""
    from hexbundle.inputs import validate
    onnx_path = tmp_path / "m.onnx"
    w = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    w[5, 3] = np.nan
    (tmp_path / "m.data").write_bytes(w.tobytes())
    init = onnx.TensorProto(name="w", dims=[8, 4], data_type=onnx.TensorProto.FLOAT,
                            data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", "m.data"), ("offset", "0"), ("length", str(w.nbytes))):
        entry = init.external_data.add()
        entry.key, entry.value = key, value
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])],
                                                "g", [x], [y], initializer=[init]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx_path.write_bytes(model.SerializeToString())
    blocks = []
    original = validate.WeightValueCheck.__call__

    def counting(self, block, first_row):
        blocks.append((first_row, block.shape))
        return original(self, block, first_row)

    monkeypatch.setattr(validate.WeightValueCheck, "__call__", counting)
    with pytest.raises(InputError, match=r"m\.onnx: weight 'w' holds NaN at \[5, 3\]"):
        validate.check_weight_values(onnx_path, validate.check_onnx(onnx_path),
                                     {"w": "float16"}, block_elements=8)
    assert blocks == [(0, (2, 4)), (2, (2, 4)), (4, (2, 4))]   # stopped at the bad block
    w[5, 3] = 70000.0
    (tmp_path / "m.data").write_bytes(w.tobytes())
    with pytest.raises(InputError, match=r"holds 70000 at \[5, 3\]"):
        validate.check_weight_values(onnx_path, model, {"w": "float16"}, block_elements=8)
    assert validate.check_weight_values(onnx_path, model, {"w": "float32"}) == w.nbytes


# ---------------------------------------------------------------------------------------------
# files that are not files: refused at once, never read (end to end; the old code hung on two)

@pytest.mark.parametrize("name,what", [
    ("tokenizer.json", "tokenizer.json"),
    (f"{P2}.encodings", "AIMET encodings file"),
    (f"{D2}.data", "external data of tensor '[^']+'"),
    (f"{P2}.onnx", "ONNX model"),
], ids=["tokenizer", "encodings", "data", "onnx"])
@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_fifo_where_a_file_belongs_is_refused_at_once(exported, name, what):
    text = refused(exported, lambda p: fifo_in_place_of(ex(p, name)))
    assert re.search(rf"{re.escape(str(ex(exported, name)))}: the {what} is a named pipe "
                     r"\(FIFO\), not a regular file", text), text


def loop_in_place_of(path: Path) -> None:
    path.unlink()
    os.symlink(path.name, path)   # the link points at itself


@pytest.mark.parametrize("name", ["tokenizer.json", f"{P2}.encodings", f"{D2}.data", f"{P2}.onnx"],
                         ids=["tokenizer", "encodings", "data", "onnx"])
@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_symlink_loop_where_a_file_belongs_is_a_message(exported, name):
    """Issue 26, item 7: these four were tracebacks (Path.resolve's RuntimeError)."""
    text = refused(exported, lambda p: loop_in_place_of(ex(p, name)))
    assert (f"exports/qwen2-tiny/{name} (a symbolic link loop: it points at '{name}', which "
            "leads back to it)") in text, text


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_dangling_symlink_input_is_named_by_the_export_file_not_its_target(exported):
    """Issue 26, item 8: the message named the link's target, not the export's file."""
    def dangling(project):
        path = ex(project, f"{P2}.onnx")
        path.unlink()
        os.symlink("/nowhere/model.onnx", path)
    text = refused(exported, dangling)
    assert (f"exports/qwen2-tiny/{P2}.onnx (a symbolic link to '/nowhere/model.onnx', which "
            "does not exist)") in text, text


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_pinned_input_that_is_a_fifo_is_refused_before_it_is_hashed(exported):
    model = exported.root / "configs" / "models" / f"{EXPORT}.toml"
    text = model.read_text()
    digest = hashlib.sha256(ex(exported, "tokenizer.json").read_bytes()).hexdigest()
    model.write_text(text.replace('dir = "exports/qwen2-tiny"\n', 'dir = "exports/qwen2-tiny"\n\n'
                                  f'[inputs.pins]\n"tokenizer.json" = "sha256:{digest}"\n'))
    try:
        said = refused(exported, lambda p: fifo_in_place_of(ex(p, "tokenizer.json")))
    finally:
        model.write_text(text)
    assert f"{ex(exported, 'tokenizer.json')}: the pinned input is a named pipe (FIFO)" in said


# ---------------------------------------------------------------------------------------------
# tokenizer.json, read as the tokenizers library reads it (in process, and once end to end)

def write_tokenizer(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    return path


def test_a_real_tokenizer_gives_its_special_ids(tmp_path):
    path = write_tokenizer(tmp_path, tokenizer_json())
    assert special_token_ids(path, QWEN2_SPECIALS, 1024) == {"bos": 1, "eos": 2, "eot": 0}


BAD_TOKENIZERS = {
    "bom": (tokenizer_json(raw_prefix=b"\xef\xbb\xbf"), "starts with a byte-order mark"),
    "unknown-key": (tokenizer_json(lambda d: d.update(tokenizr_extra=1)),
                    "unknown top-level key 'tokenizr_extra'"),
    "id-true": (tokenizer_json(lambda d: d["added_tokens"][1].update(id=True)),
                "added_tokens[1].id ('<|im_start|>') is true, not an integer id"),
    "ids-not-distinct": (tokenizer_json(lambda d: d["added_tokens"][2].update(id=1)),
                         "added_tokens give id 1 to both '<|im_start|>' and '<|im_end|>'"),
    "id-not-the-tokenizers": (tokenizer_json(lambda d: d["added_tokens"][1].update(id=5)),
                              "added_tokens gives bos token '<|im_start|>' id 5, but the "
                              "tokenizer maps '<|im_start|>' to 1"),
    "added-id-past-a-gap": (tokenizer_json(lambda d: (d["model"]["vocab"].pop("<|im_start|>"),
                                                      d["added_tokens"][1].update(id=1000))),
                            "lacks '<|im_start|>': the tokenizers library numbers such added "
                            "tokens from the vocabulary's end"),
    "library-refuses": (tokenizer_json(lambda d: d["model"].update(type="NoSuchModel")),
                        "the tokenizers library does not load it"),
    # issue 26, item 8: both were taken before
    "vocab-ids-shared": (tokenizer_json(lambda d: d["model"]["vocab"].update(
        {"shared": d["model"]["vocab"][next(iter(d["model"]["vocab"]))]})),
        "model.vocab gives id"),
    "empty-added-token": (tokenizer_json(lambda d: d["added_tokens"].append(
        {"id": 1023, "content": "", "special": True})),
        "has empty content: an added token must be text"),
}


@pytest.mark.parametrize("case", list(BAD_TOKENIZERS))
def test_a_bad_tokenizer_is_refused_naming_file_and_key(tmp_path, case):
    content, message = BAD_TOKENIZERS[case]
    path = write_tokenizer(tmp_path, content)
    with pytest.raises(InputError) as error:
        special_token_ids(path, QWEN2_SPECIALS, 1024)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_a_device_where_tokenizer_json_belongs_is_refused_unread(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.symlink_to("/dev/null")
    with pytest.raises(InputError, match=r"tokenizer\.json: the tokenizer\.json is a device, "
                                         r"not a regular file"):
        special_token_ids(path, QWEN2_SPECIALS, 1024)


def test_a_vocab_wider_than_n_vocab_is_refused(tmp_path):
    path = write_tokenizer(tmp_path, tokenizer_json())   # 512 tokens, specials at 0, 1, 2
    with pytest.raises(InputError, match=r"token '.+' has id 511, but the model's vocab_size "
                                         r"\(n-vocab, the logits width\) is 300"):
        special_token_ids(path, QWEN2_SPECIALS, 300)


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_tokenizer_with_a_boolean_id_fails_the_build(exported):
    def boolean_bos(p):
        path = ex(p, "tokenizer.json")
        data = json.loads(path.read_text())
        next(t for t in data["added_tokens"] if t["content"] == "<|im_start|>")["id"] = True
        path.write_text(json.dumps(data))
    text = refused(exported, boolean_bos)
    assert "tokenizer.json: added_tokens[0].id ('<|im_start|>') is true, not an integer id" \
        in text


# ---------------------------------------------------------------------------------------------
# the local split validates the unsplit graphs before cutting them (end to end)

def test_an_unsplit_token_graph_over_the_prompt_graph_is_refused_before_the_split(tmp_path):
    export = unsplit_only_tree(tmp_path / "export")
    project = copy_project(tmp_path / "proj")
    project.doit("import_export", "--dir", str(export), "--name", "m", "--plan", "0,9")
    prompt = export / "ar128_cl256" / f"{SLUG}.onnx"
    shutil.copy(export / "ar1_cl256" / f"{SLUG}.onnx", prompt)   # records the same .data name
    run = doit_bounded(project, "bundle", "model=m")
    assert run.code != 0
    no_traceback(run)
    assert (f"{prompt}: its inputs and outputs are not those of the unsplit prompt graph "
            "(AR 128, context length 256, the whole model)") in run.out
    assert "input 'input_ids' is int32 [1, 1] (needed: int32 or int64 [1, 128])" in run.out
    assert not list((project.root / "build" / "m" / "inputs").glob("*.onnx"))


# ---------------------------------------------------------------------------------------------
# `doit inspect` reports what the build refuses, all at once (in process)

def test_inspect_reports_what_the_build_would_refuse(tmp_path):
    export = tmp_path / "export"
    shutil.copytree(QAIHM, export)

    def part(ar, index):
        stem = f"{SLUG}_w8a16_ar{ar}_cl256_{index}_of_6"
        return export / f"ar{ar}_cl256" / f"{stem}.aimet" / f"{stem}.onnx"

    # part 3's AR-1 graph over its AR-128 graph (the .data keeps its name: relocate the record)
    src, dst = part(1, 3), part(128, 3)
    model = onnx.load(str(src), load_external_data=False)
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = dst.with_suffix(".data").name
    dst.write_bytes(model.SerializeToString())
    # part 4: one initializer twice; part 5: a NaN weight; the tokenizer: a BOM
    edit_onnx(part(128, 4), lambda m: m.graph.initializer.append(m.graph.initializer[0]))
    five = onnx.load(str(part(128, 5)), load_external_data=False)
    weight = next(i for i in five.graph.initializer
                  if i.data_location == onnx.TensorProto.EXTERNAL and len(i.dims) == 2)
    set_element(part(128, 5), weight.name, (0, 1), np.nan)
    tokenizer = export / "tokenizer.json"
    tokenizer.write_bytes(b"\xef\xbb\xbf" + tokenizer.read_bytes())

    found = inspect_path(export)
    problems = "\n".join(found.problems)
    assert (f"{part(128, 3)}: its inputs and outputs are not those of the prompt graph "
            "prompt_ar128_cl256_3_of_6 (AR 128, context length 256, part 3 of 6: layers "
            "2-3)") in problems
    assert "input 'attention_mask' is float32 [1, 1, 1, 256] (needed: float32 [1, 1, 128, " \
           "256])" in problems
    assert re.search(rf"{re.escape(str(part(128, 4)))}: initializer '.+' is defined 2 times",
                     problems)
    assert f"{part(128, 5)}: weight '{weight.name}' holds NaN at [0, 1]" in problems
    assert f"{tokenizer}: starts with a byte-order mark" in problems
    assert not any(str(part(1, 3)) in p or str(part(128, 2)) in p for p in found.problems)


# ---------------------------------------------------------------------------------------------
# inputs that alias each other (issue 40, kind 6): refused by validation, so `doit inspect` and
# the convert step agree

K_PROJ = "model.layers.0.self_attn.k_proj.weight"     # [128, 64], as V_PROJ


def _record(model, name: str) -> dict:
    init = next(i for i in model.graph.initializer if i.name == name)
    return {e.key: e for e in init.external_data}


def relocate(name: str, location: str):
    """The tensor's values said to be at offset 0 of `location` (a file beside the ONNX)."""
    def change(model):
        record = _record(model, name)
        record["location"].value = location
        if "offset" in record:
            record["offset"].value = "0"
    return change


def onto(name: str, other: str, shift_half: bool = False):
    """The tensor's window moved onto `other`'s (or half way into it)."""
    def change(model):
        mine, theirs = _record(model, name), _record(model, other)
        offset = int(theirs["offset"].value) + (int(theirs["length"].value) // 2
                                                 if shift_half else 0)
        mine["offset"].value = str(offset)
    return change


ALIASES = [
    ("data-in-the-onnx-itself", relocate(Q_BIAS, f"{P2}.onnx"), "the ONNX itself"),
    ("data-in-the-encodings", relocate(Q_BIAS, f"{P2}.encodings"), "encodings file"),
    ("two-weights-one-window", onto(V_PROJ, K_PROJ), "read the same window"),
    ("half-overlapping-windows", onto(V_PROJ, K_PROJ, shift_half=True),
     "read overlapping windows"),
]


@pytest.mark.parametrize("change, said", [a[1:] for a in ALIASES], ids=[a[0] for a in ALIASES])
def test_aliasing_inputs_are_refused_by_inspect_and_convert_alike(exported, change, said):
    onnx_path = ex(exported, f"{P2}.onnx")
    with restored(exported):
        edit_onnx(onnx_path, change)
        with pytest.raises(InputError) as caught:   # what the convert step runs first
            check_onnx(onnx_path)
        assert str(caught.value).startswith(str(onnx_path)) and said in str(caught.value)
        found = inspect_path(onnx_path.parent)
        assert any(said in p for p in found.problems), found.problems


@pytest.mark.heavy   # a real `doit bundle` (the check above is the same code, in process)
def test_two_weights_on_one_window_stop_the_build_end_to_end(exported):
    text = refused(exported, lambda p: edit_onnx(ex(p, f"{P2}.onnx"), onto(V_PROJ, K_PROJ)))
    assert f"tensors '{K_PROJ}'" in text or f"tensors '{V_PROJ}'" in text
    assert "read the same window" in text


# ---------------------------------------------------------------------------------------------
# an encoding that zeroes or saturates a whole channel (issue 40, kind 7): refused naming the
# tensor and the channel (a per-channel scale of 1e38 built a DLC whose channel was all zero)

def channel_scale(name: str, channel: int, scale: float):
    def edit(path: Path) -> None:
        doc = json.loads(path.read_text())
        entry = next(e for e in doc["param_encodings"] if e["name"] == name)
        entry["scale"][channel] = scale
        path.write_text(json.dumps(doc))
    return edit


LOST_CHANNELS = [
    ("scale-1e38-zeroes", channel_scale(V_PROJ, 3, 1e38), "channel 3 (axis", "all zero"),
    ("scale-1e-30-saturates", channel_scale(V_PROJ, 5, 1e-30), "channel 5 (axis",
     "saturated"),
]


@pytest.mark.parametrize("edit, channel, what", [c[1:] for c in LOST_CHANNELS],
                         ids=[c[0] for c in LOST_CHANNELS])
def test_an_encoding_that_loses_a_whole_channel_is_refused(exported, tmp_path, edit, channel,
                                                            what):
    with restored(exported):
        edit(ex(exported, f"{P2}.encodings"))
        with pytest.raises(HexbundleError) as caught:
            ReferenceBackend().convert(ex(exported, f"{P2}.onnx"),
                                       ex(exported, f"{P2}.encodings"), tmp_path / "p2.dlc", P2,
                                       ConvertOptions(), lambda m: None)
    message = str(caught.value)
    assert f"weight '{V_PROJ}'" in message and channel in message and what in message
    assert not (tmp_path / "p2.dlc").exists() and os.listdir(tmp_path) == []
