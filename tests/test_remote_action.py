"""A step's REAPI Action (hexbundle.remote.action), the remote_* settings and the SHA-256 beside
the XXH3 in the digest cache: in-process, no server needed."""
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

import pytest

from conftest import copy_project

from hexbundle.config.build import load_build
from hexbundle.config.layout import Layout
from hexbundle.config.remote import header_metadata, parse_target
from hexbundle.formats import stepkey
from hexbundle.remote import reapi
from hexbundle.remote.action import remote_path, step_action
from hexbundle.support import hashing
from hexbundle.support.errors import ConfigError

OPTIONS = {"backend": "reference", "options": "CompileOptions(optimization_type=3)"}


@pytest.fixture(autouse=True)
def own_digest_cache(tmp_path, monkeypatch):
    """Each test hashes through a cache of its own (the module-level one is process-wide)."""
    monkeypatch.setattr(hashing, "_cache", hashing.DigestCache(tmp_path / "digests.json"))
    for key in [k for k in os.environ if k.startswith("HEXBUNDLE_REMOTE_")]:
        monkeypatch.delenv(key)


def machine(tmp_path: Path, name: str, dlc_bytes: bytes = b"dlc bytes") -> Layout:
    """A project copy with its own build root, holding two DLCs of a part."""
    project = copy_project(tmp_path / name / "project")
    cfg = load_build(project.root)
    layout = Layout(dataclasses.replace(cfg, build_root=(tmp_path / name / "build-root").resolve()))
    for graph in cfg.model.graphs(cfg.part(2)):
        layout.dlc(graph).parent.mkdir(parents=True, exist_ok=True)
        layout.dlc(graph).write_bytes(dlc_bytes + graph.kind.encode())
    return layout


def compile_action(layout: Layout, options=None):
    cfg = layout.cfg
    dlcs = [layout.dlc(g) for g in cfg.model.graphs(cfg.part(2))]
    return step_action(layout, "compile", {"part": 2}, options or OPTIONS, dlcs,
                       [layout.bin(cfg.part(2))])


def test_the_action_is_the_same_on_two_machines_and_names_no_local_path(tmp_path):
    one, two = machine(tmp_path, "one"), machine(tmp_path, "two")
    a, b = compile_action(one), compile_action(two)
    assert a.key == b.key
    assert list(a.outputs) == [
        "build/qwen2-tiny/iq9075/four/reference/bin/qwen2_tiny_part_2_of_4.bin"]
    text = reapi.encode(a.command).decode("latin-1") + reapi.encode(a.action).decode("latin-1")
    for blob in a.blobs.values():
        text += blob.decode("latin-1")
    for local in (str(tmp_path), str(one.root), str(one.build_root)):
        assert local not in text
    assert a.command.arguments[:3] == ["hexbundle-step", "compile", "--part=2"]
    # the step key's typed canonical JSON (formats.stepkey), not a repr
    assert a.command.arguments[3] == "--options=" + stepkey.canonical(OPTIONS)
    assert json.loads(a.command.arguments[3].removeprefix("--options=")) == \
        {"type": "map", "value": {k: {"type": "str", "value": v} for k, v in OPTIONS.items()}}
    props = [(p.name, p.value) for p in a.action.platform.properties]
    assert props == sorted(props) and ("executor", "local") in props


def test_a_changed_input_byte_or_option_is_another_action(tmp_path):
    base = compile_action(machine(tmp_path, "base")).key
    assert compile_action(machine(tmp_path, "edited", b"dlc bytez")).key != base
    other = {**OPTIONS, "options": "CompileOptions(optimization_type=2)"}
    assert compile_action(machine(tmp_path, "opt"), other).key != base


def test_the_input_root_is_a_merkle_tree_with_sorted_entries(tmp_path):
    layout = machine(tmp_path, "m")
    act = compile_action(layout)
    root = reapi.Directory.FromString(act.blobs[reapi.digest_key(act.action.input_root_digest)])
    assert [d.name for d in root.directories] == ["build", "hexbundle", "scripts"]
    build = reapi.Directory.FromString(act.blobs[reapi.digest_key(root.directories[0].digest)])
    assert [d.name for d in build.directories] == ["qwen2-tiny"]
    leaf = layout.dlc(layout.cfg.graph(2, "prompt"))
    assert remote_path(layout, leaf) == f"build/qwen2-tiny/iq9075/four/reference/dlc/{leaf.name}"
    for blob_key, data in act.blobs.items():   # every blob is named by its own SHA-256
        assert reapi.digest_key(reapi.digest_of(data)) == blob_key


def test_remote_paths_are_relative_to_the_project_the_build_root_or_the_export(tmp_path):
    layout = machine(tmp_path, "m")
    assert remote_path(layout, layout.root / "configs" / "build.toml") == "configs/build.toml"
    assert remote_path(layout, layout.build_root / "x" / "y") == "build/x/y"
    assert remote_path(layout, Path("/usr/share/x")) == "external/usr/share/x"


def test_sha256_comes_from_the_same_read_as_the_xxh3_and_is_kept(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(3 << 20))
    cache = hashing.DigestCache(tmp_path / "d.json")
    cache.with_sha256 = True
    xxh = cache.digest(path)
    assert (xxh, cache.sha256(path)) == hashing.file_digests(path)
    assert cache.hashed == 1                      # one read gave both
    again = hashing.DigestCache(tmp_path / "d.json")   # the next run
    entry = json.loads((tmp_path / "d.json").read_text())[str(path)]
    assert len(entry) == 4 and entry[3] == hashing.sha256_file(path)
    assert again.sha256(path) == entry[3] and again.hashed == 0


def test_an_entry_with_the_xxh3_only_is_read_once_more_for_its_sha256(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 5000)
    cache = hashing.DigestCache(tmp_path / "d.json")
    cache.digest(path)
    assert len(json.loads((tmp_path / "d.json").read_text())[str(path)]) == 3   # as before
    later = hashing.DigestCache(tmp_path / "d.json")
    assert later.sha256(path) == hashing.sha256_file(path) and later.hashed == 1
    assert later.sha256(path) and later.digest(path) and later.hashed == 1


def test_a_recorded_fetch_is_not_read_again(tmp_path):
    path = tmp_path / "fetched"
    path.write_bytes(b"y" * 7000)
    xxh, sha = hashing.file_digests(path)
    cache = hashing.DigestCache(tmp_path / "d.json")
    cache.record(path, xxh, sha)
    assert cache.digest(path) == xxh and cache.sha256(path) == sha and cache.hashed == 0


def test_remote_settings_come_from_build_toml_then_the_environment_then_the_command_line(
        tmp_path, monkeypatch):
    project = copy_project(tmp_path / "p")
    toml = project.root / "configs" / "build.toml"
    text = toml.read_text()
    text = re.sub(r'^remote_cache = ""', 'remote_cache = "grpc://file:1"', text, flags=re.M)
    text = re.sub(r'^remote_instance = ""', 'remote_instance = "a"', text, flags=re.M)
    toml.write_text(text)
    assert load_build(project.root).remote.cache == "grpc://file:1"
    monkeypatch.setenv("HEXBUNDLE_REMOTE_CACHE", "grpcs://env.example:443")
    monkeypatch.setenv("HEXBUNDLE_REMOTE_CACHE_MODE", "read")
    cfg = load_build(project.root)
    assert (cfg.remote.cache, cfg.remote.cache_mode, cfg.remote.instance) == \
        ("grpcs://env.example:443", "read", "a")
    cfg = load_build(project.root, {"remote_cache": "grpc://[::1]:9092", "remote_timeout": "5"})
    assert (cfg.remote.cache, cfg.remote.timeout) == ("grpc://[::1]:9092", 5)


def test_bad_remote_settings_name_the_variable_or_key(tmp_path, monkeypatch):
    project = copy_project(tmp_path / "p")
    monkeypatch.setenv("HEXBUNDLE_REMOTE_CACHE_MODE", "write")
    with pytest.raises(ConfigError, match="environment: key 'HEXBUNDLE_REMOTE_CACHE_MODE' is "
                                          "'write'; allowed: 'read', 'read-write'"):
        load_build(project.root)
    monkeypatch.delenv("HEXBUNDLE_REMOTE_CACHE_MODE")
    monkeypatch.setenv("HEXBUNDLE_REMOTE_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="environment: HEXBUNDLE_REMOTE_TIMEOUT='soon': "
                                          "expected an integer"):
        load_build(project.root)
    monkeypatch.delenv("HEXBUNDLE_REMOTE_TIMEOUT")
    with pytest.raises(ConfigError, match="command line: key 'remote_cache' is "
                                          "'http://cache:80'; expected a string matching"):
        load_build(project.root, {"remote_cache": "http://cache:80"})


def test_a_bad_remote_cache_on_the_command_line_stops_doit_with_one_line(project):
    run = project.doit("bundle", "remote_cache=cache.example:9092", check=False)
    assert run.code == 3 and "Traceback" not in run.err
    assert "key 'remote_cache' is 'cache.example:9092'" in run.err


def test_the_auth_header_reads_its_secret_from_the_environment(monkeypatch):
    monkeypatch.setenv("CACHE_TOKEN", "s3cret")
    assert header_metadata("x-api-key=$CACHE_TOKEN") == [("x-api-key", "s3cret")]
    assert header_metadata("Authorization=Bearer abc") == [("authorization", "Bearer abc")]
    monkeypatch.delenv("CACHE_TOKEN")
    with pytest.raises(ConfigError, match=r"remote_header = x-api-key=\$CACHE_TOKEN: the "
                                          "environment variable CACHE_TOKEN is not set"):
        header_metadata("x-api-key=$CACHE_TOKEN")


@pytest.mark.parametrize("settings, env, message", [
    ({"remote_cache": "grpcs://cache.example:443", "remote_tls_ca": "certs/ca.pem"}, {},
     r"remote_tls_ca = 'certs/ca.pem': cannot read .*certs/ca.pem \(No such file"),
    ({"remote_cache": "grpc://cache.example:80", "remote_tls_cert": "c.pem"}, {},
     "are set but remote_cache = 'grpc://cache.example:80' is not TLS; use grpcs://"),
    ({"remote_cache": "grpcs://cache.example:443", "remote_tls_cert": "configs/build.toml"}, {},
     "remote_tls_cert and remote_tls_key go together"),
    ({"remote_cache": "grpc://cache.example:80", "remote_header": "x-api-key=$NO_SUCH_TOKEN"},
     {}, r"remote_header = x-api-key=\$NO_SUCH_TOKEN: the environment variable NO_SUCH_TOKEN"),
    ({"remote_header": "x-api-key=$NO_SUCH_TOKEN"}, {"HEXBUNDLE_REMOTE_CACHE": "grpc://c:1"},
     r"the environment variable NO_SUCH_TOKEN is not set"),
], ids=["ca-unreadable", "tls-without-grpcs", "cert-without-key", "header-var-unset",
        "cache-from-environment"])
def test_remote_settings_are_checked_whole_when_the_config_loads(tmp_path, monkeypatch,
                                                                 settings, env, message):
    """TLS files and the header are checked at load (config.remote), as the first call to the
    server would use them: every command fails at once, naming the key, not the first step."""
    project = copy_project(tmp_path / "p")
    monkeypatch.delenv("NO_SUCH_TOKEN", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        load_build(project.root, settings)


def test_a_readable_tls_setup_and_a_set_header_load(tmp_path, monkeypatch):
    project = copy_project(tmp_path / "p")
    pem = project.root / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("CACHE_TOKEN", "s3cret")
    cfg = load_build(project.root, {"remote_cache": "grpcs://cache.example:443",
                                    "remote_tls_ca": "ca.pem",
                                    "remote_header": "x-api-key=$CACHE_TOKEN"})
    assert (cfg.remote.tls_ca, cfg.remote.header) == ("ca.pem", "x-api-key=$CACHE_TOKEN")


def test_targets_parse_as_grpc_or_grpcs():
    assert parse_target("grpc://127.0.0.1:9092") == ("127.0.0.1:9092", False)
    assert parse_target("grpcs://cache.example:443") == ("cache.example:443", True)
    with pytest.raises(ConfigError, match="expected grpc://HOST:PORT"):
        parse_target("http://x:1")


def test_the_provenance_says_a_header_was_given_never_its_value(tmp_path):
    from hexbundle.release.provenance import provenance
    layout = machine(tmp_path, "m")
    doc = provenance(layout, {"remote_header": "x-api-key=s3cret", "model": "qwen2-tiny"},
                     {"commit": None, "dirty": None}, 1700000000, [], [])
    text = json.dumps(doc)
    assert "s3cret" not in text
    overrides = doc["predicate"]["buildDefinition"]["externalParameters"]["overrides"]
    assert overrides == {"model": "qwen2-tiny", "remote_header": "(set; not recorded)"}


def test_without_a_cache_build_info_says_every_step_was_built_here(project):
    run = project.doit("bundle")
    info = json.loads((project.build_dir() / "build-info.json").read_text())
    steps = {t for t in run.executed if t.split(":")[0] in ("inputs", "convert", "compile")}
    assert set(info["steps"]) == steps
    assert all(o == {"origin": "local"} for o in info["steps"].values())
    assert info["remote_cache"] == {"steps_from_cache": [], "servers": []}


def test_the_code_in_the_input_root_is_what_a_step_can_run(tmp_path):
    from hexbundle.remote.action import code_files
    names = set(code_files(machine(tmp_path, "m")))
    assert {"hexbundle/backends/reference.py", "hexbundle/steps/compile.py",
            "hexbundle/support/hashing.py", "scripts/step.py"} <= names
    assert not [n for n in names if n.split("/")[1] in ("graph", "bench", "release", "remote")]


@pytest.mark.parametrize("system, machine_name, want", [
    ("Linux", "x86_64", ("linux", "x86-64")),
    ("Linux", "aarch64", ("linux", "arm-a64")),
    ("Darwin", "arm64", ("macos", "arm-a64")),
])
def test_os_family_and_isa_are_spelled_as_the_reapi_platform_lexicon(system, machine_name, want):
    """Schedulers match OSFamily and ISA exactly against their workers' (remote-apis
    platform.md): Python's `Linux` / `x86_64` would queue an action for ever."""
    from hexbundle.remote.action import lexicon_platform
    assert lexicon_platform(system, machine_name) == {"OSFamily": want[0], "ISA": want[1]}


def test_the_action_carries_the_lexicon_values_of_this_host(tmp_path):
    import platform
    from hexbundle.remote.action import ISA, OS_FAMILY
    props = dict((p.name, p.value)
                 for p in compile_action(machine(tmp_path, "a")).action.platform.properties)
    assert props["OSFamily"] == OS_FAMILY[platform.system()]
    assert props["ISA"] == ISA[platform.machine()]


def test_a_fetched_output_that_fails_its_check_says_the_checks_own_error(tmp_path):
    """graph/remote_steps.fetch_check through the real local executor: a fetched DLC that is
    not one is refused with the check step's own error (StepFailed.error, from the step's log),
    not the executor's "failed (exit 1)" line and log tail."""
    from hexbundle.graph.remote_steps import check_description, described_run, fetch_check
    from hexbundle.graph.stepdesc import Step, description
    from hexbundle.steps.executor import run_step
    from hexbundle.steps.options import convert_step_options
    from hexbundle.support.errors import HexbundleError, StepFailed
    layout = machine(tmp_path, "one")
    graph = next(iter(layout.cfg.model.graphs(layout.cfg.part(2))))
    fetched = layout.dlc(graph).with_name(".fetched.tmp")
    fetched.write_bytes(b"not a DLC")
    extra = {"part": 2, "graph": graph.slot}
    files = layout.graph_files(graph)
    convert = description(Step("convert:x", "convert", "", convert_step_options(layout, graph),
                               inputs=[("onnx", files.onnx), *(("data", d) for d in files.data),
                                       ("encodings", files.encodings)],
                               outputs=[("dlc", layout.dlc(graph))], arguments=extra,
                               described=True))
    with pytest.raises(StepFailed) as failed:
        run_step(layout, "convert:x:cache-check", "check",
                 description=check_description(layout, convert, {layout.dlc(graph): fetched}))
    assert str(fetched) in failed.value.error and "\n" not in failed.value.error
    check = fetch_check(described_run(run_step, convert), layout, "convert:x", "convert", extra)
    with pytest.raises(HexbundleError) as refused:
        check({layout.dlc(graph): fetched})
    assert str(refused.value) == failed.value.error


def test_the_remote_executor_settings_are_checked_when_the_config_loads(tmp_path):
    project = copy_project(tmp_path / "p")
    cfg = load_build(project.root, {"remote_executor": "grpc://exec.example:8980"})
    assert (cfg.remote.executor, cfg.remote.fallback) == ("grpc://exec.example:8980", "local")
    with pytest.raises(ConfigError, match="remote_executor = 'grpc://h:99999': port '99999' is "
                                          "not a TCP port"):
        load_build(project.root, {"remote_executor": "grpc://h:99999"})
    with pytest.raises(ConfigError, match="command line: key 'remote_fallback' is 'maybe'; "
                                          "allowed: 'local', 'fail'"):
        load_build(project.root, {"remote_fallback": "maybe"})


def test_a_remote_executions_action_holds_no_absolute_path_and_its_whole_input_root(tmp_path):
    """Two machines (project and build root elsewhere) make the same Action for a step, its
    spec relocated into the input root, every file of which is in the blobs to upload."""
    from hexbundle.remote.action import exec_action
    actions = []
    for name in ("a", "b"):
        layout = machine(tmp_path, name)
        dlcs = [layout.dlc(g) for g in layout.cfg.model.graphs(layout.cfg.part(2))]
        step = exec_action(layout, compile_spec(layout), dlcs, [layout.bin(layout.cfg.part(2))])
        text = step.command.arguments[2]
        assert str(tmp_path) not in text and str(layout.root) not in text, text
        assert step.command.arguments[:2] == [os.path.abspath(sys.executable),
                                              "scripts/step.py"]
        assert set(step.inputs) == {remote_path(layout, d) for d in dlcs}
        assert {reapi.digest_key(reapi.digest_of(d.read_bytes())) for d in dlcs} <= \
            set(step.files)
        assert layout.script("step.py") in step.files.values()
        actions.append(step.key)
    assert actions[0] == actions[1]


def compile_spec(layout: Layout) -> dict:
    """The runner's spec of part 2's compile as dodo.py declares it: its description alone."""
    from hexbundle.graph.stepdesc import Step, description
    from hexbundle.steps.executor import described_spec
    from hexbundle.steps.options import compile_step_options
    part = layout.cfg.part(2)
    step = Step("compile:x", "compile", "", compile_step_options(layout, part),
                inputs=[("dlc", layout.dlc(g)) for g in layout.cfg.model.graphs(part)],
                outputs=[("bin", layout.bin(part))], arguments={"part": 2}, described=True)
    return described_spec(layout, description(step))


def exec_compile(layout: Layout):
    from hexbundle.remote.action import exec_action
    dlcs = [layout.dlc(g) for g in layout.cfg.model.graphs(layout.cfg.part(2))]
    return exec_action(layout, compile_spec(layout), dlcs, [layout.bin(layout.cfg.part(2))])


def with_settings(layout: Layout, **settings) -> Layout:
    cfg = layout.cfg
    remote = dataclasses.replace(cfg.remote, **settings.pop("remote", {}))
    return Layout(dataclasses.replace(cfg, remote=remote, **settings))


def test_a_remote_executions_command_names_its_interpreter_by_path_and_its_path(tmp_path):
    """Issue 50: a worker that follows the REAPI contract gives the Command exactly its
    environment. So the Command names the interpreter by its path (remote_python, else this
    Python's) and sets a PATH of its directory and the system's; another remote_python is
    another Command, another Action; the docker executor's names the image's python3.10 and
    leaves the image its PATH. A Command of a bare `python3` with no PATH (what a conforming
    worker runs as its system Python) is never made."""
    layout = machine(tmp_path, "one")
    default = exec_compile(layout)
    env = {v.name: v.value for v in default.command.environment_variables}
    here = os.path.abspath(sys.executable)
    assert default.command.arguments[0] == here
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(here), "/usr/local/bin",
                                             "/usr/bin", "/bin"]
    assert "PYTHONPATH" not in env   # scripts/step.py puts the input root on sys.path itself
    fleet = exec_compile(with_settings(layout, remote={"python": "/opt/hexbundle/bin/python3"}))
    fleet_env = {v.name: v.value for v in fleet.command.environment_variables}
    assert fleet.command.arguments[0] == "/opt/hexbundle/bin/python3"
    assert fleet_env["PATH"].startswith("/opt/hexbundle/bin:")
    assert fleet.key != default.key
    assert fleet.command.arguments[1:] == default.command.arguments[1:]   # the same step
    docker = exec_compile(with_settings(layout, executor="docker"))
    assert docker.command.arguments[0] == "python3.10"
    assert "PATH" not in {v.name for v in docker.command.environment_variables}
    for step in (default, fleet, docker):
        assert step.command.arguments[0] != "python3"


def test_actions_that_fail_alike_are_said_once_in_one_line():
    """remote/executed.ExecSession.failed_action: the first Command that exits non-zero a way
    (exit code, last line of its stderr) is one line naming the worker and that line; the
    same way again is nothing; another exit code or another last line is a line of its own."""
    import threading
    from hexbundle.remote.execute import ActionFailed
    from hexbundle.remote.executed import ExecSession
    session = ExecSession.__new__(ExecSession)   # no server: only what the warnings need
    session._lock, session.said = threading.Lock(), set()

    def failed(code: int, tail: str) -> ActionFailed:
        result = reapi.ActionResult(exit_code=code)
        result.execution_metadata.worker = "w1"
        return ActionFailed(f"action exited {code}; its stderr:\n{tail}", result, tail)
    no_numpy = ("Traceback (most recent call last):\n  ...\n"
                "ModuleNotFoundError: No module named 'numpy'\n")
    first = session.failed_action("inputs:part_1_of_4", failed(3, no_numpy))
    assert "\n" not in first and first.startswith("hexbundle: warning: remote execution failed: "
                                                  "inputs:part_1_of_4's action exited 3 on "
                                                  "worker w1, saying: ModuleNotFoundError: No "
                                                  "module named 'numpy'; ")
    assert session.failed_action("convert:part_1_of_4_prompt", failed(3, no_numpy)) == ""
    assert session.failed_action("compile:part_1_of_4", failed(1, no_numpy))      # another code
    other = session.failed_action("compile:part_2_of_4", failed(3, "error: no such weight w.3"))
    assert other.endswith("saying: error: no such weight w.3; building it here, and every step "
                          "whose action fails so (said once) (remote_fallback = local)")
    assert "saying nothing" in session.failed_action("x", failed(4, ""))


def test_remote_python_must_be_an_absolute_path(tmp_path):
    project = copy_project(tmp_path / "p")
    cfg = load_build(project.root, {"remote_python": "/usr/bin/python3"})
    assert cfg.remote.python == "/usr/bin/python3"
    with pytest.raises(ConfigError, match="remote_python"):
        load_build(project.root, {"remote_python": "python3"})


# ------------------------------------------------- issue 47: what a fetched output is checked for

def test_under_verify_only_what_the_exact_checks_read_is_fetched(tmp_path):
    """remote_cache_trust = verify: the reference backend's converts and compiles are fetched
    (their files record their key and the exact checks read them); the inputs step's files
    and every qairt output are built here (graph.remote_steps.exact_checkable)."""
    from hexbundle.graph.remote_steps import exact_checkable
    project = copy_project(tmp_path / "p")
    reference = Layout(load_build(project.root, overrides={"remote_cache_trust": "verify"}))
    qairt = Layout(load_build(project.root, overrides={"remote_cache_trust": "verify",
                                                       "backend": "qairt"}))
    assert [exact_checkable(reference, s) for s in ("inputs", "convert", "compile")] == \
        [False, True, True]
    assert [exact_checkable(qairt, s) for s in ("inputs", "convert", "compile")] == \
        [False, False, False]


def test_an_output_key_covers_the_inputs_bytes_and_the_options(tmp_path):
    """steps/outputkey.py: another input's bytes or another option is another key; the same
    ones (another checkout, another path) the same key."""
    from hexbundle.backends import CompileOptions, DeviceOptions
    from hexbundle.steps.outputkey import output_key
    a, b = tmp_path / "a" / "x.dlc", tmp_path / "b" / "x.dlc"
    for p in (a, b):
        p.parent.mkdir()
        p.write_bytes(b"same bytes")
    options = CompileOptions(("g",), DeviceOptions(soc_model=0, dsp_arch="v73"), True, True, 3)
    key = output_key("compile", {"part": 1}, options, [a])
    assert len(key) == 64 and key == output_key("compile", {"part": 1}, options, [b])
    assert key != output_key("compile", {"part": 1},
                             dataclasses.replace(options, optimization_type=2), [a])
    b.write_bytes(b"other bytes")
    assert key != output_key("compile", {"part": 1}, options, [b])
