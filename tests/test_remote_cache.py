"""The REAPI remote cache against a real BuildGrid server (hexbundle.remote).

Two project copies in different directories stand for two machines: real `doit` runs in
subprocesses, a real BuildGrid (`bgd server start`, from PyPI, in a venv of its own) on a free
localhost port in a temp directory, stopped afterwards.

The server tests are skipped, with the reason, only when no `bgd` is found ($HEXBUNDLE_BGD, else
PATH) AND the environment variable CI is not set; under CI they must run (.ci/run installs
BuildGrid and sets HEXBUNDLE_BGD).
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import copy_project, steps_run
from hostile_reapi import HostileProxy
from test_robustness import Held, leftovers, snapshot

from hexbundle.remote import reapi
from hexbundle.remote.buildgrid import BuildGrid, find_bgd, free_port

pytestmark = pytest.mark.heavy   # a BuildGrid server: the full suite (`pytest --full`)

CACHED = ("inputs", "convert", "compile")


def unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so the remote cache tests must run, but: {reason}")
    pytest.skip(f"{reason} (these tests run under CI=true, where .ci/run provides it)")


@pytest.fixture(scope="module")
def bgd():
    exe = find_bgd()
    if not exe:
        unavailable("no BuildGrid `bgd`: set HEXBUNDLE_BGD (pip install -r "
                    "requirements/buildgrid.txt in a Python >= 3.11 venv)")
    return exe


@pytest.fixture(scope="module")
def shared(bgd, tmp_path_factory):
    """One server, and machine A that built qwen2-tiny with it (read-write: uploaded)."""
    tmp = tmp_path_factory.mktemp("remote")
    server = BuildGrid.start(tmp / "bgd")
    try:
        a = copy_project(tmp / "a")
        a.first = a.doit("bundle", f"remote_cache={server.url}")
        yield server, a
    finally:
        server.stop()


@pytest.fixture
def server(bgd, tmp_path):
    """A server of the test's own (tests that corrupt or stop it)."""
    server = BuildGrid.start(tmp_path / "bgd")
    yield server
    server.stop()


def hits(run) -> set:
    return set(re.findall(r"^  cache hit (\S+) ", run.out, re.M))


def ran_here(run) -> set:
    """Tasks whose step ran in this process ("  ok <task> [backend/executor]"); not the checks
    of a hit's downloads ("  ok <task>:cache-check [...]")."""
    return steps_run(run.out)


def checked_hits(run) -> set:
    """Hits whose downloads were checked as the step's own outputs (steps/check.py)."""
    return {t.removesuffix(":cache-check")
            for t in re.findall(r"^  ok (\S+:cache-check) \[", run.out, re.M)}


def cached_tasks(run) -> set:
    return {t for t in run.executed if t.split(":")[0] in CACHED}


def warnings(run) -> list:
    return [line for line in run.err.splitlines() if "warning" in line]


def build_info(project, model: str = "qwen2-tiny") -> dict:
    plan = None if model == "qwen2-tiny" else "export"
    return json.loads((project.build_dir(model, plan=plan) / "build-info.json").read_text())


# ---------------------------------------------------------------------------------------------
# two machines


def test_the_first_machine_builds_everything_and_uploads_it(shared):
    server, a = shared
    run = a.first
    assert not hits(run) and not warnings(run), run.out + run.err
    assert ran_here(run) == run.executed          # every step ran here
    steps = build_info(a)["steps"]
    assert set(steps) == cached_tasks(run)
    for task, origin in steps.items():
        assert origin["origin"] == "local" and origin["uploaded"] is True, (task, origin)
        assert origin["server"] == server.url and origin["instance"] == ""
    assert server.blobs()   # the outputs are in the server's CAS


def test_a_second_empty_machine_gets_every_step_from_the_cache(shared, tmp_path):
    server, a = shared
    b = copy_project(tmp_path / "b")
    fetch_trace = tmp_path / "hashed-while-fetching.txt"
    run = b.doit("bundle", f"remote_cache={server.url}",
                 env={"HEXBUNDLE_HASH_TRACE": str(fetch_trace)})
    cached = cached_tasks(run)
    assert {t.split(":")[0] for t in cached} == set(CACHED), run.out
    assert hits(run) == cached, run.out + run.err
    assert ran_here(run) == {"bundle"}, run.out   # no inputs, convert or compile step ran here
    assert not warnings(run), run.err
    # the summary counts them fetched (graph.reporter), not "18 steps ran"
    assert re.search(rf"^hexbundle: bundle .*: 1 built, {len(cached)} fetched, 0 up to date, ",
                     run.out, re.M), run.out
    assert snapshot(b.bundle()) == snapshot(a.bundle())   # byte-identical, manifest included
    for task in cached:   # the step's log says where its outputs came from
        log = b.build_dir() / "logs" / (task.replace(":", "__") + ".log")
        assert log.read_text().startswith(f"# cache hit: outputs fetched from the remote cache "
                                          f"{server.url}"), task
    info = build_info(b)
    assert info["remote_cache"] == {"steps_from_cache": sorted(cached),
                                    "servers": [{"server": server.url, "instance": ""}]}
    assert {o["origin"] for o in info["steps"].values()} == {"remote-cache"}
    # a fetched file's digests were taken as it streamed in: doit's checker, the next steps'
    # Actions and the bundle's manifest read none of them again
    fetched_dirs = [str(b.root / "build" / "qwen2-tiny" / "inputs"), str(b.build_dir() / "dlc"),
                    str(b.build_dir() / "bin")]
    hashed = fetch_trace.read_text().split() if fetch_trace.exists() else []
    assert hashed and not [h for h in hashed if h.startswith(tuple(fetched_dirs))], hashed
    # doit's state was recorded for the fetched outputs: nothing to do, nothing hashed
    trace = tmp_path / "hashed.txt"
    again = b.doit("bundle", f"remote_cache={server.url}", env={"HEXBUNDLE_HASH_TRACE": str(trace)})
    assert again.executed == set(), again.out
    assert not trace.exists() or trace.read_text() == ""


def test_a_changed_option_misses_exactly_the_steps_that_use_it(shared, tmp_path):
    server, _ = shared
    c = copy_project(tmp_path / "c")
    run = c.doit("bundle", f"remote_cache={server.url}", "optimization_type=2")
    compiles = {t for t in run.executed if t.startswith("compile:")}
    assert compiles and hits(run) == cached_tasks(run) - compiles, run.out
    assert ran_here(run) == compiles | {"bundle"}, run.out
    # ... and what it built is in the cache now: a third machine gets it all, and --explain
    # says so per step (graph/explain.py)
    d = copy_project(tmp_path / "d")
    run = d.doit("bundle", f"remote_cache={server.url}", "optimization_type=2", "--explain")
    assert hits(run) == cached_tasks(run) and ran_here(run) == {"bundle"}, run.out
    said = dict(re.findall(r"^explain: (\S+)  (.*)$", run.out, re.M))
    assert {t for t, why in said.items() if why.startswith("fetched from the cache")} \
        == hits(run), run.out
    assert said["compile:part_1_of_4"] == ("fetched from the cache (runs because target missing: "
                                           f"{d.build_dir().relative_to(d.root)}/bin/"
                                           "qwen2_tiny_part_1_of_4.bin)"), run.out
    assert said["bundle"].startswith("runs because target missing: "), run.out
    assert checked_hits(run) == {t for t in hits(run) if t.startswith(("convert", "compile"))}
    assert snapshot(d.bundle()) == snapshot(c.bundle())


def negate_a_weight(project, part_index: int) -> Path:
    """Flip the sign of the first KiB of a 4-bit layer weight in the part's .data (same size,
    |max| per channel unchanged, so its encodings still fit): a changed input file."""
    import numpy as np

    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    from hexbundle.config.model import part_weights
    from hexbundle.formats.weightdata import plan_layout as data_layout
    cfg = load_build(project.root)
    part = cfg.part(part_index)
    weights = part_weights(cfg.model.architecture, cfg.model.quantization, part)
    offsets = data_layout({w.name: w.shape for w in weights})
    name = next(w.name for w in weights if w.bitwidth == 4 and w.channels > 1)
    offset = offsets[name][0]
    data = Layout(cfg).onnx_data(cfg.graph(part_index, "prompt"))
    with open(data, "r+b") as fh:
        fh.seek(offset)
        values = np.frombuffer(fh.read(1024), dtype="<f4")
        fh.seek(offset)
        fh.write((-values).astype("<f4").tobytes())
    return data


def negate_a_weight_to_nan(project, part_index: int) -> Path:
    """negate_a_weight's weight, its first value made NaN (the file's size is the same)."""
    import numpy as np
    data = negate_a_weight(project, part_index)
    negate_a_weight(project, part_index)          # twice: the bytes as they were
    from hexbundle.config.build import load_build
    from hexbundle.config.model import part_weights
    from hexbundle.formats.weightdata import plan_layout as data_layout
    cfg = load_build(project.root)
    weights = part_weights(cfg.model.architecture, cfg.model.quantization, cfg.part(part_index))
    offsets = data_layout({w.name: w.shape for w in weights})
    name = next(w.name for w in weights if w.bitwidth == 4 and w.channels > 1)
    with open(data, "r+b") as fh:
        fh.seek(offsets[name][0])
        fh.write(np.float32(np.nan).tobytes())
    return data


def test_a_changed_input_misses_exactly_the_steps_that_read_it(shared, tmp_path):
    server, _ = shared
    e = copy_project(tmp_path / "e")
    inputs = e.doit("inputs", f"remote_cache={server.url}")
    assert hits(inputs) == inputs.executed and inputs.executed, inputs.out
    negate_a_weight(e, 2)   # read by both graphs of part 2, and so by its compile
    run = e.doit("bundle", f"remote_cache={server.url}")
    part_2 = {"convert:part_2_of_4_prompt", "convert:part_2_of_4_token", "compile:part_2_of_4"}
    assert ran_here(run) == part_2 | {"bundle"}, run.out
    assert hits(run) == cached_tasks(run) - part_2, run.out
    assert len(hits(run)) == 9   # both converts and the compile of parts 1, 3 and 4


# ---------------------------------------------------------------------------------------------
# failures degrade, never corrupt


def sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_corrupted_blob_is_refused_and_the_step_built_locally(server, tmp_path):
    a = copy_project(tmp_path / "a")
    a.doit("bundle", f"remote_cache={server.url}")
    bin_2 = a.build_dir() / "bin" / "qwen2_tiny_part_2_of_4.bin"        # batch read (< 1 MiB)
    data_2 = a.root / "build" / "qwen2-tiny" / "inputs" / "part_2_of_4.data"   # ByteStream
    assert bin_2.stat().st_size < (1 << 20) < data_2.stat().st_size
    for path in (bin_2, data_2):
        blob = server.blob_path(sha256(path))
        raw = bytearray(blob.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        blob.write_bytes(bytes(raw))
    b = copy_project(tmp_path / "b")
    run = b.doit("bundle", f"remote_cache={server.url}")
    refused = [w for w in warnings(run) if "refused" in w]
    assert {re.search(r"warning: (\S+):", w)[1] for w in refused} == \
        {"inputs:part_2_of_4", "compile:part_2_of_4"}, run.err
    for path in (bin_2, data_2):
        assert any(sha256(path) in w for w in refused), run.err   # the blob is named
    assert {"inputs:part_2_of_4", "compile:part_2_of_4"} <= ran_here(run), run.out
    assert "convert:part_2_of_4_prompt" in hits(run)   # its inputs were rebuilt to the same bytes
    assert snapshot(b.bundle()) == snapshot(a.bundle())
    assert leftovers(b.root / "build") == []
    info = build_info(b)["steps"]
    assert info["compile:part_2_of_4"]["origin"] == "local"
    assert info["compile:part_1_of_4"]["origin"] == "remote-cache"


def test_a_refused_download_lands_nothing_and_leaves_the_targets_as_they_were(server, project):
    """Two outputs of one Action, the second corrupted on the server: neither is renamed into
    place (not even the first, which arrived whole), and no temp file is left."""
    from hexbundle.config.build import load_build, remote_settings
    from hexbundle.config.layout import Layout
    from hexbundle.remote.action import step_action
    from hexbundle.remote.cache import RemoteSession, fetch, upload
    layout = Layout(load_build(project.root))
    out_dir = layout.build_root / "m" / "d" / "bin"
    out_dir.mkdir(parents=True)
    targets = [out_dir / "a.bin", out_dir / "b.bin"]
    for i, path in enumerate(targets):
        path.write_bytes(bytes([i + 1]) * (3 << 19))   # 1.5 MiB each: ByteStream
    step = step_action(layout, "compile", {"part": 9}, {"o": 1}, [], targets)
    remote = RemoteSession(remote_settings(cache=server.url, timeout=30), layout.root)
    assert upload(layout, remote, "compile:x", step)
    blob = server.blob_path(sha256(targets[1]))
    raw = bytearray(blob.read_bytes())
    raw[-1] ^= 0xFF
    blob.write_bytes(bytes(raw))
    for path in targets:
        path.write_bytes(b"what was there before")
    assert fetch(layout, remote, "compile:x", step) is False
    assert [p.read_bytes() for p in targets] == [b"what was there before"] * 2
    assert sorted(p.name for p in out_dir.iterdir()) == ["a.bin", "b.bin"]   # no temp file
    remote.client.close()


def test_an_unreachable_server_gives_one_warning_and_a_local_build(project):
    url = f"grpc://127.0.0.1:{free_port()}"   # nothing listens there
    run = project.doit("bundle", f"remote_cache={url}")
    assert len(warnings(run)) == 1, run.err
    assert url in warnings(run)[0] and "building locally" in warnings(run)[0]
    assert ran_here(run) == run.executed and not hits(run)
    assert "Traceback" not in run.out + run.err
    assert project.doit("bundle", f"remote_cache={url}").executed == set()


def test_the_server_stopped_mid_run_gives_one_warning_and_a_local_build(server, tmp_path):
    a = copy_project(tmp_path / "a")
    a.doit("bundle", f"remote_cache={server.url}")
    b = copy_project(tmp_path / "b")
    # optimization_type=2: inputs and converts come from the cache, the compiles run here; the
    # first compile is held mid-write while the server goes away.
    held = Held(b, ["bundle", f"remote_cache={server.url}", "optimization_type=2"],
                pause_at="compile", tmp=tmp_path / "held")
    held.wait_paused()
    server.stop()
    held.release()
    run = held.finish()
    assert run.code == 0, run.out + run.err
    assert hits(run), run.out                           # before the stop
    compiles = {t for t in run.executed if t.startswith("compile:")}
    assert compiles <= ran_here(run), run.out            # after it: built here
    assert len(warnings(run)) == 1, run.err
    assert server.url in warnings(run)[0] and "UNAVAILABLE" in warnings(run)[0]
    assert "Traceback" not in run.out + run.err
    assert leftovers(b.root / "build") == []
    assert b.doit("check_sizes", "optimization_type=2").code == 0


def test_read_mode_fetches_but_never_writes(server, tmp_path):
    a = copy_project(tmp_path / "a")
    run = a.doit("bundle", f"remote_cache={server.url}", "remote_cache_mode=read")
    assert ran_here(run) == run.executed and not hits(run) and not warnings(run)
    assert server.blobs() == []                          # nothing uploaded
    assert {o["uploaded"] for o in build_info(a)["steps"].values()} == {False}
    b = copy_project(tmp_path / "b")
    run = b.doit("bundle", f"remote_cache={server.url}")   # read-write: misses, uploads
    assert not hits(run) and server.blobs()
    c = copy_project(tmp_path / "c")
    run = c.doit("bundle", f"remote_cache={server.url}", "remote_cache_mode=read")
    assert hits(run) == cached_tasks(run) and ran_here(run) == {"bundle"}, run.out


def test_an_instance_the_server_does_not_have_gives_one_warning_and_a_local_build(shared,
                                                                                 tmp_path):
    server, _ = shared
    g = copy_project(tmp_path / "g")
    run = g.doit("bundle", f"remote_cache={server.url}", "remote_instance=no-such-instance")
    assert len(warnings(run)) == 1, run.err
    assert "no-such-instance" in warnings(run)[0] and "building locally" in warnings(run)[0]
    assert ran_here(run) == run.executed and not hits(run)


def test_the_instance_name_and_the_environment_select_the_cache(bgd, tmp_path):
    with BuildGrid.start(tmp_path / "bgd", instance="hexbundle/ci") as server:
        env = {"HEXBUNDLE_REMOTE_CACHE": server.url, "HEXBUNDLE_REMOTE_INSTANCE": "hexbundle/ci"}
        a = copy_project(tmp_path / "a")
        assert not warnings(a.doit("bundle", env=env))
        b = copy_project(tmp_path / "b")
        run = b.doit("bundle", env=env)
        assert hits(run) == cached_tasks(run) and not warnings(run), run.out + run.err
        assert build_info(b)["remote_cache"]["servers"] == [{"server": server.url,
                                                              "instance": "hexbundle/ci"}]
        # the command line overrides the environment: no cache at all here
        c = copy_project(tmp_path / "c")
        run = c.doit("bundle", "remote_cache=", env=env)
        assert not hits(run) and ran_here(run) == run.executed


def test_a_release_records_the_steps_that_came_from_the_cache(shared, tmp_path):
    server, _ = shared
    epoch = {"SOURCE_DATE_EPOCH": "1700000000"}
    # SOURCE_DATE_EPOCH is part of every Command (steps may stamp it): a build that sets it
    # shares nothing with one that does not, and fills the cache for the release's clean build.
    q = copy_project(tmp_path / "q")
    run = q.doit("bundle", f"remote_cache={server.url}", env=epoch)
    assert not hits(run) and ran_here(run) == run.executed
    r = copy_project(tmp_path / "r")
    r.doit("release", f"remote_cache={server.url}", env=epoch)
    doc = json.loads((r.root / "build" / "release" / "provenance.json").read_text())
    internal = doc["predicate"]["buildDefinition"]["internalParameters"]
    assert internal["remote_cache"]["servers"] == [{"server": server.url, "instance": ""}]
    from_cache = set(internal["remote_cache"]["steps_from_cache"])
    assert {t.split(":")[0] for t in from_cache} == set(CACHED)
    assert all(internal["steps"][t]["origin"] == "remote-cache" for t in from_cache)


# ---------------------------------------------------------------------------------------------
# the wire: our messages are REAPI's


SAMPLES = """
from hexbundle.remote import reapi
P = reapi.message(reapi.REAPI + ".Platform.Property")
E = reapi.message(reapi.REAPI + ".Command.EnvironmentVariable")
d = reapi.Digest(hash="ab" * 32, size_bytes=123)
samples = {
  "build.bazel.remote.execution.v2.Action": reapi.Action(command_digest=d, input_root_digest=d,
      do_not_cache=True, salt=b"s", platform=reapi.Platform(properties=[P(name="a", value="b")])),
  "build.bazel.remote.execution.v2.Command": reapi.Command(arguments=["x", "y"],
      environment_variables=[E(name="N", value="V")], output_paths=["o"], working_directory="w"),
  "build.bazel.remote.execution.v2.Directory": reapi.Directory(
      files=[reapi.FileNode(name="f", digest=d, is_executable=True)],
      directories=[reapi.DirectoryNode(name="d", digest=d)]),
  "build.bazel.remote.execution.v2.ActionResult": reapi.ActionResult(
      output_files=[reapi.OutputFile(path="p", digest=d, contents=b"c")], exit_code=3,
      stdout_raw=b"o", stdout_digest=d),
  "build.bazel.remote.execution.v2.UpdateActionResultRequest": reapi.UpdateActionResultRequest(
      instance_name="i", action_digest=d, action_result=reapi.ActionResult(exit_code=1)),
  "build.bazel.remote.execution.v2.BatchUpdateBlobsRequest": reapi.BatchUpdateBlobsRequest(
      instance_name="i", requests=[reapi.message(reapi.REAPI + ".BatchUpdateBlobsRequest.Request")(
          digest=d, data=b"z")]),
  "build.bazel.remote.execution.v2.FindMissingBlobsRequest": reapi.FindMissingBlobsRequest(
      instance_name="i", blob_digests=[d, d]),
  "google.bytestream.WriteRequest": reapi.WriteRequest(resource_name="r", write_offset=5,
      finish_write=True, data=b"q"),
}
"""

CHECK = """
import json, sys
from google.protobuf import text_format
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as r
from buildgrid._protos.google.bytestream import bytestream_pb2 as b
out = {}
for name, hexdata in json.loads(sys.stdin.read()).items():
    cls = getattr(r if name.startswith("build.") else b, name.rsplit(".", 1)[1])
    msg = cls.FromString(bytes.fromhex(hexdata))
    out[name] = [msg.SerializeToString(deterministic=True).hex(), text_format.MessageToString(msg)]
print(json.dumps(out))
"""


def test_our_messages_are_byte_for_byte_buildgrids_generated_reapi_classes(bgd):
    """Each sample, every field set, parsed by BuildGrid's own generated REAPI classes (in its
    venv): the same bytes come back, and every field lands under its REAPI name."""
    from hexbundle.remote import reapi
    space: dict = {}
    exec(SAMPLES, space)
    ours = {name: reapi.encode(msg).hex() for name, msg in space["samples"].items()}
    python = str(Path(bgd).parent / "python")
    proc = subprocess.run([python, "-c", CHECK], input=json.dumps(ours), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    theirs = json.loads(proc.stdout)
    from google.protobuf import text_format
    for name, msg in space["samples"].items():
        assert theirs[name][0] == ours[name], name
        assert theirs[name][1] == text_format.MessageToString(msg), name



# ------------------------------------------------------------------------------ a lying cache
# Issue 26, item 2: a cache hit gets the checks a local build gets.

def action_of(project, task: str, model: str = "qwen2-tiny") -> str:
    """The Action key ("hash/size") the step ran as, from the project's build-info.json."""
    return build_info(project, model)["steps"][task]["action"]


def _digest(key: str):
    hash_, size = key.split("/")
    return reapi.Digest(hash=hash_, size_bytes=int(size))


def test_a_served_bin_with_a_flipped_byte_and_its_own_digest_is_refused(server, tmp_path):
    """The server's result for part 2's compile names a blob of the bin with one byte flipped,
    under the SHA-256 of those bytes: every transfer check passes. The bin's own blob digests
    do not: the download is discarded with one warning and the step built here."""
    a = copy_project(tmp_path / "a")
    a.doit("bundle", f"remote_cache={server.url}")
    key = action_of(a, "compile:part_2_of_4")
    bin_2 = a.build_dir() / "bin" / "qwen2_tiny_part_2_of_4.bin"
    bad = bytearray(bin_2.read_bytes())
    bad[len(bad) // 2] ^= 0x01
    bad_sha = hashlib.sha256(bad).hexdigest()
    server.blob_path(bad_sha).parent.mkdir(parents=True, exist_ok=True)
    server.blob_path(bad_sha).write_bytes(bytes(bad))

    def lie(request, real):
        if real is not None and reapi.digest_text(request.action_digest) == key:
            for out in real.output_files:
                out.digest.hash, out.digest.size_bytes = bad_sha, len(bad)
        return real

    proxy = HostileProxy(server.url, lie)
    try:
        b = copy_project(tmp_path / "b")
        run = b.doit("bundle", f"remote_cache={proxy.url}")
    finally:
        proxy.stop()
    refused = [w for w in warnings(run) if "fails the checks a local build gets" in w]
    assert len(refused) == 1 and "compile:part_2_of_4" in refused[0], run.err
    assert "digest mismatch" in refused[0], refused[0]
    assert "compile:part_2_of_4" in ran_here(run) and "compile:part_1_of_4" in hits(run)
    assert snapshot(b.bundle()) == snapshot(a.bundle())
    assert leftovers(b.root / "build") == []


def nan_in_first_weight(onnx_path: Path) -> str:
    """Set the first element of the graph's first external float weight to NaN; its name."""
    import numpy as np
    import onnx
    model = onnx.load(str(onnx_path), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL
                and i.data_type == onnx.TensorProto.FLOAT and len(i.dims) == 4)
    info = {e.key: e.value for e in init.external_data}
    with open(onnx_path.parent / info["location"], "r+b") as fh:
        fh.seek(int(info.get("offset", 0)))
        fh.write(np.float32(np.nan).tobytes())
    return init.name


def stale_answering(url: str, key: str) -> tuple:
    """(a proxy in front of the server at `url`, what it recorded): it answers every action the
    server misses with the result it last saw for the action `key` (an old result)."""
    old = {}

    def stale_answer(request, real):
        if real is not None and reapi.digest_text(request.action_digest) == key:
            old["result"] = real
        return real if real is not None else old.get("result")

    return HostileProxy(url, stale_answer), old


def test_inputs_are_validated_even_when_the_cache_answers_with_an_old_result(server, tmp_path):
    """A server answering an action it should miss with an old result: part 2's prompt graph of
    an export (which has its own .data) gets a NaN, and the server answers its convert with the
    clean graph's result. Before, that hit was taken, everything after it hit too, and the old
    bundle shipped (exit 0); now the inputs are validated first, whatever the cache says."""
    from test_qaihm_export import DATA
    export = tmp_path / "export"
    shutil.copytree(DATA, export)
    a = copy_project(tmp_path / "a")
    a.doit("import_export", "--dir", str(export), "--name", "qaihm")
    a.doit("bundle", "model=qaihm", f"remote_cache={server.url}")
    stale_key = action_of(a, "convert:part_2_of_6_prompt", "qaihm")
    proxy, old = stale_answering(server.url, stale_key)
    try:
        b = copy_project(tmp_path / "b")
        b.doit("import_export", "--dir", str(export), "--name", "qaihm")
        b.doit("bundle", "model=qaihm", f"remote_cache={proxy.url}")   # all hits; old recorded
        before = snapshot(b.bundle("qaihm", plan="export"))
        graph = next((export / "ar128_cl256").glob("*_2_of_6.aimet"))
        name = nan_in_first_weight(next(graph.glob("*.onnx")))
        run = b.doit("bundle", "model=qaihm", f"remote_cache={proxy.url}", check=False)
    finally:
        proxy.stop()
    assert "result" in old
    assert run.code != 0, run.out + run.err
    assert f"weight '{name}' holds NaN" in run.out + run.err, run.out + run.err
    assert snapshot(b.bundle("qaihm", plan="export")) == before   # nothing new shipped



def test_an_exports_values_are_validated_before_the_cache_is_asked_for_its_split(server,
                                                                                tmp_path):
    """The same for a split made here (an export with only its unsplit graphs): a NaN in the
    export's unsplit .data, a server answering the split of the part that reads it with the old
    split. Before, the old (clean) split came back and convert found nothing wrong in it; now
    the part's own weights in the export are checked before the cache is asked."""
    from conftest import unsplit_only_tree
    export = unsplit_only_tree(tmp_path / "export")
    a = copy_project(tmp_path / "a")
    a.doit("import_export", "--dir", str(export), "--name", "whole")
    a.doit("bundle", "model=whole", f"remote_cache={server.url}")
    stale_key = action_of(a, "inputs:part_2_of_6", "whole")
    proxy, old = stale_answering(server.url, stale_key)
    try:
        b = copy_project(tmp_path / "b")
        b.doit("import_export", "--dir", str(export), "--name", "whole")
        b.doit("bundle", "model=whole", f"remote_cache={proxy.url}")   # all hits; old recorded
        before = snapshot(b.bundle("whole", plan="export"))
        name = nan_in_first_weight(export / "ar128_cl256" / "qwen2_5_7b_instruct.onnx")
        run = b.doit("bundle", "model=whole", f"remote_cache={proxy.url}", check=False)
    finally:
        proxy.stop()
    assert "result" in old
    assert "layers.0." in name   # a weight of part 2 (layers 0 and 1)
    assert run.code != 0, run.out + run.err
    assert f"weight '{name}' holds NaN" in run.out + run.err, run.out + run.err
    assert snapshot(b.bundle("whole", plan="export")) == before   # nothing new shipped


# ------------------------------------------------------------------------------ item 6: no hang

def test_a_result_declaring_a_tebibyte_is_refused_before_any_byte_is_fetched(server, tmp_path):
    a = copy_project(tmp_path / "a")
    a.doit("bundle", f"remote_cache={server.url}")
    key = action_of(a, "compile:part_2_of_4")

    def huge(request, real):
        if real is not None and reapi.digest_text(request.action_digest) == key:
            for out in real.output_files:
                out.digest.size_bytes = 1 << 40
        return real

    proxy = HostileProxy(server.url, huge)
    try:
        b = copy_project(tmp_path / "b")
        run = b.doit("bundle", f"remote_cache={proxy.url}", "remote_timeout=5")
    finally:
        proxy.stop()
    said = [w for w in warnings(run) if "compile:part_2_of_4" in w]
    assert said and "declares 1024.00 GiB of outputs" in said[0], run.err
    assert "compile:part_2_of_4" in ran_here(run)
    assert snapshot(b.bundle()) == snapshot(a.bundle())


def test_a_stream_that_stalls_is_cut_after_the_remote_timeout(server, tmp_path):
    """The server declares part 2's .data as 40 GiB (the stream's deadline would be ~85 min)
    and stops sending after 1 MiB: with remote_timeout=5 the read is cut after 5 s of silence,
    and the build goes on locally. Under a quarter of the free disk where that is less than
    40 GiB: more than the free disk is refused before any read (the test above)."""
    import time
    a = copy_project(tmp_path / "a")
    a.doit("bundle", f"remote_cache={server.url}")
    key = action_of(a, "inputs:part_2_of_4")
    declared = min(40 << 30, shutil.disk_usage(tmp_path).free // 4)

    def big(request, real):
        if real is not None and reapi.digest_text(request.action_digest) == key:
            for out in real.output_files:
                if out.path.endswith(".data"):
                    out.digest.size_bytes = declared
        return real

    def stall(request):
        if f"/{declared}" not in request.resource_name:
            return None

        def pieces():
            yield reapi.ReadResponse(data=bytes(1 << 20))
            time.sleep(120)
        return pieces()

    proxy = HostileProxy(server.url, big, read=stall)
    try:
        b = copy_project(tmp_path / "b")
        run = b.doit("bundle", f"remote_cache={proxy.url}", "remote_timeout=5")
    finally:
        proxy.stop()
    assert any("no data for 5s after 1048576 of" in w for w in warnings(run)), run.err
    assert "inputs:part_2_of_4" in ran_here(run)
    assert snapshot(b.bundle()) == snapshot(a.bundle())


# ---------------------------------------------------------------- issue 47: results trusted by shape
# Every fetched output type x each lie, one build answered by a lying server: each row a task
# whose result is replaced. The outputs are checked for the key they were made for
# (steps/outputkey.py, "made_for" in the DLC and bin headers); under remote_cache_trust =
# verify also by the exact checks, and the inputs step is not fetched at all.

OTHER_PARTS = (2, 3)   # the parts whose weights machine O changed (negate_a_weight)


@pytest.fixture(scope="module")
def other_weights(shared, tmp_path_factory):
    """Machine O: the same model, names and shapes, with other weights in parts 2 and 3; its
    converts and compiles of those parts are in the cache under their own actions."""
    server, _ = shared
    o = copy_project(tmp_path_factory.mktemp("other") / "o")
    o.doit("inputs", f"remote_cache={server.url}")
    for part in OTHER_PARTS:
        negate_a_weight(o, part)
    o.doit("bundle", f"remote_cache={server.url}")
    return o


def cached_result(server, project, task: str):
    """The ActionResult the server holds for the action `task` ran as on `project`."""
    from hexbundle.config.build import remote_settings
    from hexbundle.remote.cas import CasClient
    client = CasClient(remote_settings(cache=server.url), project.root)
    try:
        return client.get_action_result(_digest(action_of(project, task)))
    finally:
        client.close()


def plant(server, data: bytes):
    """A blob put straight into the server's CAS (under its own digest): its Digest."""
    sha = hashlib.sha256(data).hexdigest()
    server.blob_path(sha).parent.mkdir(parents=True, exist_ok=True)
    server.blob_path(sha).write_bytes(data)
    return reapi.Digest(hash=sha, size_bytes=len(data))


def output_of(server, project, task: str) -> Path:
    """The one file a convert or compile wrote (where the cached result names it)."""
    return project.root / cached_result(server, project, task).output_files[0].path


def garbage(size: int) -> bytes:
    import numpy as np
    return np.random.default_rng(47).integers(0, 256, size, dtype=np.uint8).tobytes()


def forged(server, o, a, task: str) -> bytes:
    """O's output of `task` with the key it records replaced by A's (same length): a server
    that knows how the key is made."""
    from hexbundle.backends.reference import ReferenceBackend
    theirs, ours = (ReferenceBackend().made_for(output_of(server, p, task)) for p in (o, a))
    data = output_of(server, o, task).read_bytes()
    assert theirs != ours and data.count(theirs.encode()) == 1
    return data.replace(theirs.encode(), ours.encode())


TIB = 1 << 40
# (task, lie, what the warning says); every output type the cache hands back: a DLC, a bin
# (and the inputs step's files: not fetched under verify, the eviction test below otherwise)
LIES = [
    ("convert:part_2_of_4_prompt", "other weights", "made for key"),
    ("compile:part_3_of_4", "other weights", "made for key"),
    ("convert:part_2_of_4_token", "other weights, key forged", "weights vs the export's"),
    ("convert:part_4_of_4_prompt", "garbage bytes", "fails the checks a local build gets"),
    ("compile:part_1_of_4", "truncated", "fails the checks a local build gets"),
    ("compile:part_4_of_4", "log of a TiB, trickled", None),   # taken: its outputs are right
]


def caught_under(trust: str, lie: str) -> bool:
    """Whether the lie is refused under that trust: a key forged by a server that knows how it
    is made passes the key check; only verify's exact checks see the weights (the docs say so)."""
    return trust == "verify" or lie != "other weights, key forged"


@pytest.fixture(scope="module", params=["verify", "trusted"])
def lied(request, shared, other_weights, tmp_path_factory):
    """Machine B (A's weights) builds through a server that tells every lie of LIES at once
    (under trusted, all but the forged key), with remote_cache_trust = `param`; then a local
    `doit bundle` without the cache."""
    import time
    trust = request.param
    server, a = shared
    o = other_weights
    lies, sent = {}, {}
    for task, lie, _ in LIES:
        if not caught_under(trust, lie):
            continue
        result = cached_result(server, a, task)
        if lie == "other weights":
            result = cached_result(server, o, task)
        elif lie == "other weights, key forged":
            result.output_files[0].digest.CopyFrom(plant(server, forged(server, o, a, task)))
        elif lie == "garbage bytes":
            size = result.output_files[0].digest.size_bytes
            result.output_files[0].digest.CopyFrom(plant(server, garbage(size)))
        elif lie == "truncated":
            whole = output_of(server, a, task).read_bytes()
            result.output_files[0].digest.CopyFrom(plant(server, whole[:len(whole) // 2]))
        elif lie == "log of a TiB, trickled":
            result.stdout_digest.CopyFrom(reapi.Digest(hash="ab" * 32, size_bytes=TIB))
        lies[action_of(a, task)] = result
        sent[task] = result

    def answer(request, real):
        return lies.get(reapi.digest_text(request.action_digest), real)

    def trickle(request):
        if not request.resource_name.endswith(f"/{TIB}"):
            return None

        def one_byte_every_2s():
            for _ in range(60):
                yield reapi.ReadResponse(data=b"x")
                time.sleep(2)
        return one_byte_every_2s()

    proxy = HostileProxy(server.url, answer, read=trickle)
    try:
        b = copy_project(tmp_path_factory.mktemp(f"lied-{trust}") / "b")
        run = b.doit("bundle", f"remote_cache={proxy.url}", f"remote_cache_trust={trust}",
                     "remote_timeout=5", check=False)
    finally:
        proxy.stop()
    later = b.doit("bundle", check=False)   # a later local build: nothing poisoned to keep
    return trust, a, o, b, run, later, sent


@pytest.mark.parametrize("task,lie,said", LIES, ids=[f"{t}-{lie}" for t, lie, _ in LIES])
def test_every_fetched_output_type_and_lie_is_refused_and_never_stored(lied, task, lie, said):
    trust, a, o, b, run, later, sent = lied
    if not caught_under(trust, lie):
        pytest.skip(f"not told under remote_cache_trust = {trust} (docs/remote-cache.md)")
    refused = [w for w in warnings(run) if task in w]
    lied_bytes = {f.digest.hash for f in sent[task].output_files}
    on_disk = {sha256(p) for p in (b.root / "build").rglob("*")
               if p.is_file() and not p.is_symlink()
               and p.stat().st_size in {f.digest.size_bytes for f in sent[task].output_files}}
    if said is None:   # the trickled log: the hit is taken, its log cut and said so
        assert task in hits(run) and not refused, run.out + run.err
        log = (b.build_dir() / "logs" / (task.replace(":", "__") + ".log")).read_text()
        assert "# that log (not read:" in log, log
        return
    assert len(refused) == 1 and said in refused[0], run.err
    assert "discarded, building locally" in refused[0], refused[0]
    assert task in ran_here(run) and task not in hits(run), run.out
    assert not lied_bytes & on_disk, "a refused output was stored"
    refused_actions = json.loads((b.root / "build" / ".hexbundle" / "remote-refused.json")
                                 .read_text())["actions"]
    assert action_of(a, task) in refused_actions


def test_a_lying_cache_ships_nothing_and_a_later_local_build_keeps_nothing(lied):
    trust, a, o, b, run, later, _ = lied
    assert run.code == 0 and "Traceback" not in run.err, run.out + run.err
    assert snapshot(b.bundle()) == snapshot(a.bundle())   # a clean local build's bundle
    assert snapshot(b.bundle()) != snapshot(o.bundle())   # (the other weights do show)
    assert not leftovers(b.root / "build")
    fetched_inputs = {t for t in hits(run) if t.startswith("inputs:")}
    if trust == "verify":   # the inputs step is never fetched: the checks compare with its files
        assert fetched_inputs == set(), run.out
        assert {t for t in ran_here(run) if t.startswith("inputs:")}, run.out
        exact_lines = re.findall(r"weights vs the export's: \d+ weight", 
                                 "".join(p.read_text() for p in
                                         (b.build_dir() / "logs").glob("*cache-check*")))
        assert exact_lines, "no exact check ran on a hit"
    else:
        assert fetched_inputs, run.out
    assert checked_hits(run) == {t for t in hits(run) if not t.startswith("inputs:")}
    assert later.code == 0 and ran_here(later) == set(), later.out   # all up to date, kept
    assert snapshot(b.bundle()) == snapshot(a.bundle())


def test_a_fetched_input_a_later_step_fails_on_is_evicted_and_never_reused(shared, tmp_path):
    """remote_cache_trust = trusted (the default): the inputs step's files cannot record a key,
    so a server answering part 2's inputs with garbage .data (under its own digest) gets them
    fetched; the convert that reads them refuses them (NaN). They are removed, with their
    origin, and that result is never asked for again: the next run builds them here."""
    server, a = shared
    task = "inputs:part_2_of_4"
    result = cached_result(server, a, task)
    data = next(f for f in result.output_files if f.path.endswith(".data"))
    data.digest.CopyFrom(plant(server, garbage(data.digest.size_bytes)))
    key = action_of(a, task)

    def answer(request, real):
        return result if reapi.digest_text(request.action_digest) == key else real

    proxy = HostileProxy(server.url, answer)
    try:
        b = copy_project(tmp_path / "b")
        first = b.doit("bundle", f"remote_cache={proxy.url}", check=False)
        second = b.doit("bundle", f"remote_cache={proxy.url}", check=False)
    finally:
        proxy.stop()
    assert first.code != 0 and task in hits(first), first.out + first.err
    assert "Traceback" not in first.out + first.err
    evicted = [w for w in warnings(first) if f"failed on the outputs of {task}" in w]
    assert len(evicted) == 1 and key in evicted[0] and "will not be used again" in evicted[0], \
        first.err
    assert second.code == 0, second.out + second.err
    assert task in ran_here(second) and task not in hits(second), second.out
    assert snapshot(b.bundle()) == snapshot(a.bundle())
    assert not leftovers(b.root / "build")


def test_a_garbage_answer_is_a_clear_error_not_a_decode_traceback(shared, tmp_path, capfd):
    """GetActionResult answered with bytes that are no ActionResult: a RemoteError saying so
    (the build gives the cache up with one warning), and grpc logs no traceback."""
    from hexbundle.config.build import remote_settings
    from hexbundle.remote.cas import CasClient, RemoteError
    server, a = shared
    proxy = HostileProxy(server.url, lambda request, real: b"\xff" * 64)
    client = CasClient(remote_settings(cache=proxy.url), tmp_path)
    try:
        with pytest.raises(RemoteError, match="not a valid REAPI message"):
            client.get_action_result(_digest(action_of(a, "compile:part_1_of_4")))
    finally:
        client.close()
        proxy.stop()
    assert "Traceback" not in capfd.readouterr().err
