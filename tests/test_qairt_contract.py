"""Contract tests: hexbundle's qairt calls against the real QAIRT Python API classes of the pinned
qairt-dev wheel (tests/real_qairt.py loads them; only qti.* is stubbed). `pytest -m real_qairt`.

Skipped, with the reason, only when the wheel is absent and CI is not set; under CI a missing
wheel fails them (.ci/run fetches it with `doit contract_wheel`)."""
import json
import logging
import os
import types
from pathlib import Path

import pytest

import real_qairt
from hexbundle.backends import CompileOptions, ConvertOptions, DeviceOptions
from hexbundle.backends.qairt import QairtBackend, _Api, convert_kwargs, perf_profile
from hexbundle.toolchain.wheelhouse import read_lock
from conftest import CONFIGS

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "standin_qairt" / "lib" / "python"
PROMPT, TOKEN = "prompt_ar128_cl256_2_of_4", "token_ar1_cl256_2_of_4"
OPTIONS = CompileOptions(graph_names=(PROMPT, TOKEN),
                         device=DeviceOptions(soc_model=77, dsp_arch="v73"))


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    api = real_qairt.load_locked(tmp_path_factory.mktemp("qairt-dev"))
    yield api
    real_qairt.unload(api)


def build(real, options=OPTIONS):
    """hexbundle's CompileConfig, built by the backend's own code from the real classes."""
    api = _Api(None, real.modules["qairt.api.compiler.config"], real.htp)
    return QairtBackend.compile_config(types.SimpleNamespace(api=api), options)


def refused(real, fn):
    from pydantic import ValidationError
    with pytest.raises(ValidationError) as info:
        fn()
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# the lock: qairt-dev is a test dependency, never the image's

def test_qairt_dev_is_pinned_for_the_tests_and_never_in_the_image_lock():
    (entry,) = read_lock(ROOT / "requirements" / "contract.lock")
    assert (entry.name, entry.version) == ("qairt-dev", "0.6.0") and len(entry.hashes) == 1
    image = {e.name for e in read_lock(ROOT / "requirements" / "container.lock")}
    assert "qairt-dev" not in image, ("qairt-dev entered requirements/container.lock: its "
                                      "qairt/__init__.py calls Qualcomm's release API over HTTPS "
                                      "at import time, and the SDK carries the API already")
    requirements = [line.split("#", 1)[0].strip() for line in
                    (ROOT / "requirements" / "container.in").read_text().splitlines()]
    assert not [r for r in requirements if r.lower().replace("_", "-").startswith("qairt-dev")]


# ---------------------------------------------------------------------------------------------
# positive: hexbundle's config, validated and serialized by the real classes

@pytest.mark.real_qairt
def test_the_compile_config_serializes_to_the_seeds_backend_extension_keys(real):
    config = build(real)
    assert isinstance(config, real.CompileConfig)
    d = real.options_dict(config)["backend_extensions"]["config_dict"]
    assert sorted(d) == ["context", "devices", "graphs"]
    assert d["context"] == [{"weight_sharing_enabled": True}]
    assert d["graphs"] == [{"vtcm_mb": 8, "O": 3, "weights_packing": True, "graph_names": [g]}
                           for g in (PROMPT, TOKEN)]
    assert d["devices"] == [{"soc_model": 77, "dsp_arch": "v73",
                             "cores": [{"perf_profile": "burst", "rpc_control_latency": 100}]}]


@pytest.mark.real_qairt
def test_options_off_serialize_as_off(real):
    off = CompileOptions(graph_names=(PROMPT, TOKEN), device=OPTIONS.device,
                         weights_packing=False, weight_sharing=False, optimization_type=2)
    d = real.options_dict(build(real, off))["backend_extensions"]["config_dict"]
    assert d["context"] == [{"weight_sharing_enabled": False}]
    assert [(g["O"], g["weights_packing"]) for g in d["graphs"]] == [(2, False), (2, False)]


@pytest.mark.real_qairt
def test_every_perf_profile_a_device_may_name_is_a_real_member(real):
    assert len(real.PerfProfile) == 14
    import tomli
    from hexbundle.config.devices import PERF_PROFILES
    for name in PERF_PROFILES:
        assert perf_profile(real.PerfProfile, name).value == name, name
    named = [tomli.loads((CONFIGS / "configs" / "devices.toml").read_text())["defaults"]["htp"]]
    named += [tomli.loads(p.read_text()).get("htp", {})
              for p in sorted((CONFIGS / "configs" / "boards").glob("*.toml"))]
    assert len(named) >= 2 and all(n.get("perf_profile", "burst") in PERF_PROFILES for n in named)


@pytest.mark.real_qairt
def test_the_standin_declares_the_real_fields_and_members(real):
    """The stand-in SDK's classes are only as strict as their field lists: the real 0.6.0 ones."""
    import ast
    tree = ast.parse((STANDIN / "qairt" / "api" / "common" / "backends" / "htp" /
                      "config.py").read_text())
    declared = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            fields = next(n.value for n in node.body if isinstance(n, ast.Assign)
                          and n.targets[0].id == "FIELDS")
            declared[node.name] = {k.value for k in fields.keys}
    for cls in ("HtpGraphConfig", "HtpDeviceCoreConfig", "HtpDeviceConfig", "HtpContextConfig"):
        assert declared[cls] == set(getattr(real.htp, cls).model_fields), cls
    members = (STANDIN / "qairt" / "api" / "configs" / "common.py").read_text()
    assert all(f"    {m.name} = " in members for m in real.PerfProfile)


@pytest.mark.real_qairt
def test_convert_kwargs_pass_converter_config(real):
    kwargs = convert_kwargs(ConvertOptions(float_bitwidth=16))
    config = real.ConverterConfig(**kwargs)
    assert config.float_precision == 16
    assert refused(real, lambda: real.ConverterConfig(float_precision=17))
    # the reason hexbundle no longer passes float_bitwidth: not a field, an unchecked extra
    assert "float_bitwidth" not in real.ConverterConfig.model_fields
    real.ConverterConfig(float_bitwidth=17)


@pytest.mark.real_qairt
def test_the_llm_io_options_are_not_declared_converter_fields(real):
    """qairt-dev 0.6.0 declares none of qai-hub-models' --truncate_64bit_io / --quantize_io /
    --quantize_full_type: ConverterConfig (extra="allow") lets them through unchecked to the
    SDK's converter. Recorded here so a later release that declares them is noticed."""
    for name in ("truncate_64bit_io", "quantize_io", "quantize_full_type"):
        assert name not in real.ConverterConfig.model_fields
    real.ConverterConfig(**convert_kwargs(ConvertOptions(quantize_io=True,
                                                         quantize_full_type="w8a16")))


# ---------------------------------------------------------------------------------------------
# negative: what the real classes refuse

@pytest.mark.real_qairt
def test_a_missing_backend_is_refused(real):
    assert "backend" in refused(real, lambda: real.CompileConfig())


@pytest.mark.real_qairt
def test_a_graph_config_without_a_name_is_refused(real):
    assert "name" in refused(real, lambda: real.htp.HtpGraphConfig(optimization_type=3))


@pytest.mark.real_qairt
@pytest.mark.parametrize("level", [0, 4, 2.5])
def test_optimization_type_outside_1_to_3_is_refused(real, level):
    assert "optimization_type" in refused(
        real, lambda: real.htp.HtpGraphConfig(name=PROMPT, optimization_type=level))


@pytest.mark.real_qairt
def test_backend_htp_in_lower_case_is_refused(real):
    assert "htp" in refused(real, lambda: real.CompileConfig(backend="htp"))


@pytest.mark.real_qairt
def test_perf_profile_by_member_name_is_refused(real):
    assert "perf_profile" in refused(
        real, lambda: real.htp.HtpDeviceCoreConfig(perf_profile="BURST"))


@pytest.mark.real_qairt
def test_extended_udma_on_v73_is_refused(real):
    h = real.htp
    message = refused(real, lambda: real.CompileConfig(
        backend="HTP", context_custom_configs=[h.HtpContextConfig(extended_udma=True)],
        device_custom_configs=[h.HtpDeviceConfig(soc_model=77, dsp_arch="v73")]))
    assert "extended_udma is only supported on HTP v81" in message


@pytest.mark.real_qairt
def test_unknown_fields_and_bad_assignments_are_refused(real):
    graph = real.htp.HtpGraphConfig(name=PROMPT, optimization_type=3)
    assert "weight_packing" in refused(
        real, lambda: real.htp.HtpGraphConfig(name=PROMPT, weight_packing=True))

    def assign():
        graph.optimization_type = 7
    assert "optimization_type" in refused(real, assign)
    assert graph.optimization_type == 3


# ---------------------------------------------------------------------------------------------
# the real loggers and mute, which the capture is built for

@pytest.mark.real_qairt
def test_the_real_area_loggers_do_not_propagate_and_the_standin_mirrors_them(real):
    import yaml
    config = yaml.safe_load((Path(real.loggers.__file__).parent.parent /
                             "logging_config.yaml").read_text())
    loggers = config["loggers"]
    assert all(v.get("propagate") is False for v in loggers.values())
    stream = config["handlers"]["dev_console"]["stream"]
    assert stream == "ext://sys.stdout"    # their own handler: on stdout, not stderr
    import ast
    tree = ast.parse((STANDIN / "qairt" / "utils" / "loggers.py").read_text())
    areas = next(ast.literal_eval(n.value) for n in ast.walk(tree)
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "AREAS")
    for name, level in areas.items():
        if name in loggers:
            assert loggers[name]["level"] == level, name


@pytest.mark.real_qairt
def test_the_real_compile_mutes_fd_1_unless_its_logger_is_at_debug(real, tmp_path):
    out = tmp_path / "fd1"
    logger = logging.getLogger("hexbundle.contract.compile")
    saved = os.dup(1)
    try:
        with open(out, "wb") as fh:
            os.dup2(fh.fileno(), 1)
            logger.setLevel(logging.INFO)
            with real.loggers.maybe_suppress_stdout(logger=logger):
                os.write(1, b"muted\n")
            logger.setLevel(logging.DEBUG)
            with real.loggers.maybe_suppress_stdout(logger=logger):
                os.write(1, b"shown\n")
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert out.read_text() == "shown\n"
