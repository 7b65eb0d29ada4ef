"""The qairt backend against the stand-in SDK (tests/standin_qairt: an SDK root whose lib/python
holds a recording `qairt` package), in real doit subprocesses with the local executor.

What is checked is what the seeds found to matter: the exact API calls, modules, classes and
field values; the SDK version pin; and that an "Unknown Key" or "[ ERROR ]" line fails the step
even when the SDK call returns normally."""
import json
import shutil
from pathlib import Path

import pytest

from hexbundle.support.atomic import is_temp_name

STANDIN_SDK = Path(__file__).resolve().parent / "standin_qairt"
PARTS = [1, 2, 3, 4]
HTP = "qairt.api.common.backends.htp.config"


def run_qairt(project, tmp_path, *args, mode="ok", sdk=STANDIN_SDK, check=True):
    record = tmp_path / "calls.jsonl"
    env = {"QAIRT_SDK_ROOT": str(sdk), "STANDIN_QAIRT_RECORD": str(record),
           "STANDIN_QAIRT_MODE": mode}
    run = project.doit(*args, "backend=qairt", env=env, check=check)
    calls = [json.loads(line) for line in record.read_text().splitlines()] \
        if record.exists() else []
    record.unlink(missing_ok=True)
    return run, calls


def by_call(calls, name):
    return [c for c in calls if c["call"] == name]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """One `doit compile backend=qairt` of qwen2-tiny through the stand-in."""
    from conftest import copy_project
    tmp = tmp_path_factory.mktemp("qairt")
    proj = copy_project(tmp / "proj")
    run, calls = run_qairt(proj, tmp, "compile")
    return proj, run, calls, tmp


def test_convert_is_called_per_graph_exactly_as_the_seeds_call_it(compiled):
    proj, _, calls, _ = compiled
    converts = by_call(calls, "qairt.convert")
    inputs = proj.root / "build" / "qwen2-tiny" / "inputs"
    graphs = sorted(f"{kind}_cl256_{i}_of_4" for i in PARTS for kind in ("prompt_ar128", "token_ar1"))
    assert sorted(Path(c["args"][0]).stem for c in converts) == graphs
    for c in converts:
        name = Path(c["args"][0]).stem
        assert c["args"] == [str(inputs / f"{name}.onnx")]
        # float_precision: ConverterConfig's documented field (float_bitwidth is no field of
        # it); truncate_64bit_io: the [compile] default (int64 input_ids)
        assert c["kwargs"] == {"encodings": str(inputs / f"{name}.encodings"),
                               "float_precision": 16, "truncate_64bit_io": True,
                               "backend": "HTP", "calibration_config": None}
    saves = by_call(calls, "Model.save")
    assert len(saves) == 8 and all(Path(s["args"][0]).suffix == ".dlc" for s in saves)
    dlc_dir = proj.build_dir(backend="qairt") / "dlc"
    assert sorted(p.stem for p in dlc_dir.glob("*.dlc")) == graphs
    assert not [p.name for p in dlc_dir.iterdir() if is_temp_name(p.name)]   # save path, scratch


def test_compile_gets_both_graphs_of_a_part_and_the_seeds_config(compiled):
    proj, _, calls, _ = compiled
    compiles = by_call(calls, "qairt.compile")
    assert len(compiles) == 4
    dlc_dir = proj.build_dir(backend="qairt") / "dlc"
    for c in compiles:
        (models,) = c["args"]
        i = int(models[0]["graphs"][0].split("_")[-3])
        prompt, token = f"prompt_ar128_cl256_{i}_of_4", f"token_ar1_cl256_{i}_of_4"
        # the two DLCs of the part, loaded from disk, prompt first
        assert [m["graphs"] for m in models] == [[prompt], [token]]
        assert [m["path"] for m in models] == [str(dlc_dir / f"{prompt}.dlc"),
                                              str(dlc_dir / f"{token}.dlc")]
        config = c["kwargs"]["config"]
        assert config == {
            "class": "qairt.api.compiler.config.CompileConfig",
            "set": {
                "backend": "HTP",
                "graph_custom_configs": [
                    {"class": f"{HTP}.HtpGraphConfig",
                     "set": {"name": name, "optimization_type": 3, "weights_packing": True,
                             "vtcm_size_in_mb": 8}} for name in (prompt, token)],
                "context_custom_configs": [
                    {"class": f"{HTP}.HtpContextConfig",
                     "set": {"weight_sharing_enabled": True}}],
                "device_custom_configs": [
                    {"class": f"{HTP}.HtpDeviceConfig",
                     "set": {"soc_model": 77, "dsp_arch": "v73", "cores": [
                         {"class": f"{HTP}.HtpDeviceCoreConfig",
                          "set": {"perf_profile": {"enum": "qairt.api.configs.common.PerfProfile",
                                                   "member": "BURST"},
                                  "rpc_control_latency": 100}}]}}],
            }}
    loads = by_call(calls, "qairt.load")
    assert len(loads) == 8 and all(c["kwargs"] == {} for c in loads)
    saves = by_call(calls, "CompiledModel.save")
    assert len(saves) == 4 and all(Path(s["args"][0]).suffix == ".bin" for s in saves)


def test_the_bins_are_what_the_sdk_saved_and_its_output_is_in_the_log(compiled):
    proj, run, _, _ = compiled
    for i in PARTS:
        doc = json.loads((proj.build_dir(backend="qairt") / "bin" / f"qwen2_tiny_part_{i}_of_4.bin").read_text())
        assert doc["standin"] == "ctxbin"
        assert doc["graphs"] == [f"prompt_ar128_cl256_{i}_of_4", f"token_ar1_cl256_{i}_of_4"]
    log = (proj.build_dir(backend="qairt") / "logs" / "compile__part_1_of_4.log").read_text()
    # written by the "C++ side" to file descriptor 1, and through Python logging
    assert "[sdk] [ INFO ] standin context-binary generator: composing graphs" in log
    assert "[sdk log] qairt.standin: | INFO | Compiled model: prompt_ar128_cl256_1_of_4" in log
    # through the real-style qairt.compile logger (propagate = False, its own handler)
    assert "[sdk log] qairt.compile: | INFO | Compiled model: prompt_ar128_cl256_1_of_4" in log
    assert "backend qairt (QAIRT 2.42.0.251225)" in log
    assert "standin context-binary generator" not in run.out   # not on the console


def test_compile_options_reach_the_config(compiled):
    proj, _, _, tmp = compiled
    _, calls = run_qairt(proj, tmp, "compile:part_2_of_4", "weights_packing=false",
                           "weight_sharing=false", "optimization_type=2")
    (c,) = by_call(calls, "qairt.compile")
    graphs = c["kwargs"]["config"]["set"]["graph_custom_configs"]
    assert [g["set"]["weights_packing"] for g in graphs] == [False, False]
    assert [g["set"]["optimization_type"] for g in graphs] == [2, 2]
    ctx = c["kwargs"]["config"]["set"]["context_custom_configs"]
    assert ctx[0]["set"] == {"weight_sharing_enabled": False}
    assert not by_call(calls, "qairt.convert")   # the DLCs did not change


def test_an_unknown_key_printed_during_a_muted_compile_fails_it(project, tmp_path):
    """The stand-in's compile, like the real one, points fd 1 at /dev/null while it generates
    the binary unless the qairt.compile logger is at DEBUG; the Unknown Key line goes to fd 1."""
    run, calls = run_qairt(project, tmp_path, "compile:part_1_of_4", mode="unknown_key",
                           check=False)
    assert run.code == 1
    assert by_call(calls, "qairt.compile") and by_call(calls, "CompiledModel.save")
    assert "the SDK logged 1 error line(s) although the call returned normally" in run.out
    assert "[ ERROR ] Unknown Key graphs/0/weights_packing passed in config" in run.out
    bins = project.build_dir(backend="qairt") / "bin"
    assert not (bins / "qwen2_tiny_part_1_of_4.bin").exists()   # the output was not kept
    assert not [p.name for p in bins.iterdir() if is_temp_name(p.name)]


def test_an_error_logged_by_qairt_compile_inside_its_mute_fails_it(project, tmp_path):
    run, _ = run_qairt(project, tmp_path, "compile:part_1_of_4", mode="compile_error_log",
                       check=False)
    assert run.code == 1
    # quoted once, although the SDK's own handler printed it too
    assert "the SDK logged 1 error line(s)" in run.out
    assert "qairt.compile: | ERROR | Graph prompt_ar128_cl256_1_of_4: VTCM overflow" in run.out


def test_an_error_logged_through_a_real_style_qairt_logger_fails_the_convert(project, tmp_path):
    """qairt.convert has propagate = False and its own handler, as in qairt-dev 0.6.0: a
    handler on the root alone would not see the record."""
    run, _ = run_qairt(project, tmp_path, "convert:part_1_of_4_token", mode="error_log",
                       check=False)
    assert run.code == 1
    assert "the SDK logged 1 error line(s)" in run.out
    assert "qairt.convert: | ERROR | Failed to apply encodings for tensor 'lm_head.weight'" \
        in run.out
    assert not (project.build_dir(backend="qairt") / "dlc" / "token_ar1_cl256_1_of_4.dlc").exists()


def test_an_error_logged_on_the_qti_tree_fails_the_convert(project, tmp_path):
    run, _ = run_qairt(project, tmp_path, "convert:part_1_of_4_prompt", mode="qti_error",
                       check=False)
    assert run.code == 1
    assert "qti.aisw.converters: | ERROR | Op 'Gather'" in run.out


def test_the_standin_loggers_and_mute_behave_like_the_real_ones():
    """The stand-in is only worth its tests if it hides what the real SDK hides."""
    import subprocess
    import sys
    code = ("import logging, os, qairt\n"
            "from qairt.utils.loggers import maybe_suppress_stdout\n"
            "for n in ('qairt.convert', 'qairt.compile', 'qti.aisw.converters'):\n"
            "    lg = logging.getLogger(n); assert not lg.propagate and lg.handlers, n\n"
            "with maybe_suppress_stdout(logging.getLogger('qairt.compile')):\n"
            "    os.write(1, b'MUTED\\n')\n"
            "logging.getLogger('qairt.compile').setLevel(logging.DEBUG)\n"
            "with maybe_suppress_stdout(logging.getLogger('qairt.compile')):\n"
            "    os.write(1, b'SHOWN\\n')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(STANDIN_SDK / "lib" / "python")}, check=True)
    assert out.stdout == "SHOWN\n"


def test_an_sdk_exception_is_reported_with_its_traceback_in_the_log(project, tmp_path):
    run, _ = run_qairt(project, tmp_path, "compile:part_3_of_4", mode="raise", check=False)
    assert run.code == 1
    assert ("qairt compile of qwen2_tiny_part_3_of_4.bin failed: RuntimeError: Could not "
            "create compiled binary") in run.out
    log = (project.build_dir(backend="qairt") / "logs" / "compile__part_3_of_4.log").read_text()
    assert "[sdk] Traceback (most recent call last):" in log


def test_another_sdk_version_is_refused_before_the_sdk_is_used(project, tmp_path):
    sdk = tmp_path / "sdk-2.44"
    shutil.copytree(STANDIN_SDK, sdk)
    (sdk / "sdk.yaml").write_text("version: 2.44.0.260101\n")
    run, calls = run_qairt(project, tmp_path, "convert:part_1_of_4_prompt", sdk=sdk,
                           check=False)
    assert run.code == 1
    assert f"{sdk / 'sdk.yaml'} (from QAIRT_SDK_ROOT): QAIRT version is 2.44.0.260101" in run.out
    assert "pins 2.42.0.251225" in run.out
    assert calls == []      # not a single SDK call


# ---------------------------------------------------------------------------------------------
# save(): only the artifact leaves the scratch directory

def test_what_save_copies_beside_the_artifact_stays_out_of_dlc_and_bin(compiled):
    """Model.save copies the working directory's *.safetensors / *.encodings next to its
    target, CompiledModel.save its other *.bin files (the stand-in does the same)."""
    proj, _, _, _ = compiled
    dlc_dir, bin_dir = proj.build_dir(backend="qairt") / "dlc", proj.build_dir(backend="qairt") / "bin"
    assert all(p.suffix == ".dlc" for p in dlc_dir.iterdir()), sorted(dlc_dir.iterdir())
    assert sorted(p.name for p in bin_dir.iterdir()) == \
        [f"qwen2_tiny_part_{i}_of_4.bin" for i in PARTS]
    log = (proj.build_dir(backend="qairt") / "logs" / "convert__part_2_of_4_token.log").read_text()
    assert ("save() also wrote token_ar1_cl256_2_of_4.encodings, "
            "token_ar1_cl256_2_of_4.safetensors beside token_ar1_cl256_2_of_4.dlc: not part of "
            "the output, discarded") in log
    log = (proj.build_dir(backend="qairt") / "logs" / "compile__part_2_of_4.log").read_text()
    assert "save() also wrote adapter_weights.bin" in log


# ---------------------------------------------------------------------------------------------
# the LLM options of [compile]

def test_the_llm_io_options_reach_convert_and_are_said(compiled):
    proj, _, _, tmp = compiled
    run, calls = run_qairt(proj, tmp, "convert:part_1_of_4_prompt", "quantize_io=true",
                           "quantize_full_type=w8a16", "truncate_64bit_io=false")
    (c,) = by_call(calls, "qairt.convert")
    assert {k: c["kwargs"].get(k) for k in ("truncate_64bit_io", "quantize_io",
                                            "quantize_full_type", "float_precision")} == \
        {"truncate_64bit_io": None, "quantize_io": True, "quantize_full_type": "w8a16",
         "float_precision": 16}
    assert ("convert: float_precision 16, truncate_64bit_io False, quantize_io True, "
            "quantize_full_type w8a16") in run.out
    log = (proj.build_dir(backend="qairt") / "logs" / "convert__part_1_of_4_prompt.log").read_text()
    assert "quantize_io=True, quantize_full_type='w8a16'" in log


# ---------------------------------------------------------------------------------------------
# the bins, as qnn-context-binary-utility reads them

@pytest.mark.parametrize("mode, said", [
    ("bin_missing_graph", "holds graph(s) ['prompt_ar128_cl256_4_of_4'], expected "
                          "['prompt_ar128_cl256_4_of_4', 'token_ar1_cl256_4_of_4'] (missing: "
                          "token_ar1_cl256_4_of_4)"),
    ("bin_two_copies", "holds 2 copies of the weights although weight_sharing is on"),
    ("bin_other_soc", "is built for soc_model 69, not the configured 77"),
])
def test_a_wrong_bin_is_refused_after_compile(project, tmp_path, mode, said):
    run, calls = run_qairt(project, tmp_path, "compile:part_4_of_4", mode=mode, check=False)
    assert run.code == 1
    assert by_call(calls, "CompiledModel.save")       # the SDK call itself succeeded
    assert "as qnn-context-binary-utility reads it" in run.out
    assert said in run.out
    bins = project.build_dir(backend="qairt") / "bin"
    assert not (bins / "qwen2_tiny_part_4_of_4.bin").exists()
    assert not [p.name for p in bins.iterdir() if is_temp_name(p.name)]


def test_a_good_bin_is_said_to_be_checked(compiled):
    proj, _, _, _ = compiled
    log = (proj.build_dir(backend="qairt") / "logs" / "compile__part_3_of_4.log").read_text()
    assert "qnn-context-binary-utility --context_binary" in log
    assert ("qwen2_tiny_part_3_of_4.bin: checked by qnn-context-binary-utility: graphs "
            "prompt_ar128_cl256_3_of_4, token_ar1_cl256_3_of_4; soc_model 77 v73; 1 weight copy; "
            "weight packing is not stated by the binary: the size check judges it") in log


def test_a_two_length_part_compiles_its_four_graphs_in_one_call(project, tmp_path):
    """qwen2-tiny-2cl through the stand-in: per part one qairt.compile of its four DLCs (per
    context length prompt then token), one graph config each, and the bin checked to hold the
    four."""
    run, calls = run_qairt(project, tmp_path, "compile:part_2_of_4", "model=qwen2-tiny-2cl")
    (compile_call,) = by_call(calls, "qairt.compile")
    names = ["prompt_ar128_cl256_2_of_4", "token_ar1_cl256_2_of_4",
             "prompt_ar128_cl512_2_of_4", "token_ar1_cl512_2_of_4"]
    (models,) = compile_call["args"]
    assert [m["graphs"] for m in models] == [[n] for n in names]
    configs = compile_call["kwargs"]["config"]["set"]["graph_custom_configs"]
    assert [c["set"]["name"] for c in configs] == names
    assert all(c["set"]["weights_packing"] is True for c in configs)
    doc = json.loads((project.build_dir("qwen2-tiny-2cl", backend="qairt") / "bin"
                      / "qwen2_tiny_2cl_part_2_of_4.bin").read_text())
    assert doc["graphs"] == names
