"""Incremental == clean, for every setting (issue 23): the property, generated from the schemas.

For each leaf of build.toml (BUILD_SCHEMA, set on the command line as a user would), each key of
the model config (MODEL_SCHEMA, its active plan included), each field of the board and of its
chipset in configs/devices.toml (BOARD_SCHEMA, TABLE_SCHEMA), each toolchain pin
(config.toolchain.SCHEMA) and each HEXBUNDLE_* variable the package reads: change it to another
valid value, run `doit bundle` on a copy of a finished build (incremental) and on a fresh copy of
the project (clean), and require the two to be equal byte for byte: the model's inputs, the
DLCs, the bins and the bundle (manifest included); a build that fails must fail the same way.

"Another valid value" is derived from the field (bool: the other one; choices: the next one;
numbers: a neighbour within min/max; strings: a digit bumped, or text appended, matching the
field's pattern; lists: reversed, shortened, extended), or is the field's own `example`; the
first candidate the config loader accepts is used. A new schema key is covered with no test
edit; a key for which no valid value can be derived fails here until its Field gets an example.

Measured, not required (minimality): per setting, which step kinds re-ran and which of them
wrote outputs identical to before. Written to build/test-reports/every-setting.jsonl of the
checkout, one JSON object per setting.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT, Project, copy_project, tree_digests

pytestmark = pytest.mark.heavy

MODEL = "qwen2-tiny"
DEVICE_FILE = "configs/boards/iq9075.toml"
REPORT = ROOT / "build" / "test-reports" / "every-setting.jsonl"

# HEXBUNDLE_* variables that are no build input, with why (the others get a value below).
NOT_BUILD_INPUTS = {
    "HEXBUNDLE_BENCH_CHECKER": "doit bench's comparison checker (refused outside the bench)",
    "HEXBUNDLE_HASH_TRACE": "a trace file of what the checkers hash (doit bench)",
    "HEXBUNDLE_BGD": "where the tests find BuildGrid's bgd",
    "HEXBUNDLE_PG_BIN": "where the tests find PostgreSQL (BuildGrid's scheduler database)",
    "HEXBUNDLE_BUILDBOX_RUN": "where the remote-execution workers find buildbox-run",
    "HEXBUNDLE_TEST_PAUSE_AT": "a test hook: hold a step at a pause point",
    "HEXBUNDLE_TEST_PAUSE_DIR": "a test hook: where the pause files are",
    "HEXBUNDLE_LIFELINE": "the step runner's parent watch (set by the executor itself)",
    "HEXBUNDLE_KIT_INCLUDE_INPUTS": "doit offline_kit only",
    "HEXBUNDLE_KIT_INCLUDE_SDK": "doit offline_kit only",
    "HEXBUNDLE_FASTRPC_NODE": "read by the bundle's run.sh on the board (which fastrpc node "
                              "its preflight checks), never by the build",
    "HEXBUNDLE_REMOTE_": "the prefix of the remote_* settings (covered as build settings)",
    "HEXBUNDLE_ENGINE_TIMEOUT": "how long one call may wait for the Docker engine, never what "
                                "a step writes",
    # the ortqnn backend's tools: where they are and how long a call may take; what they are is
    # in every ortqnn step's key (the pins' and the driver source's digest)
    "HEXBUNDLE_ORTQNN_KIT": "where the extracted ortqnn kit is kept (its content: the pins)",
    "HEXBUNDLE_ORTQNN_WHEELHOUSE": "where doit ortqnn_kit's pinned wheels are (checked by sha256)",
    "HEXBUNDLE_ORTQNN_TIMEOUT": "how long one compile under Wine may take, never what it writes",
    "HEXBUNDLE_WINE64": "which wine64 loader runs QnnHtp.dll (the compiler is the pinned DLL)",
}
ENV_VALUES = {
    "HEXBUNDLE_BUILD_ROOT": "{root}/elsewhere",
    "HEXBUNDLE_LOCK_TIMEOUT": "7",
    "HEXBUNDLE_PROGRESS_EVERY": "1",
    "HEXBUNDLE_REMOTE_CACHE": "grpc://127.0.0.1:9",
}
# build.toml settings whose other valid values are names defined in other files.
NAMED_VALUES = {
    "build:device": "sa8775p",   # a chipset of configs/devices.toml (the board is iq9075)
    "build:plan": "four",        # the model's default plan, named rather than ""
    "configs/models/qwen2-tiny.toml:plans.four.known_to_fail_on": ["sa8775p"],
    "configs/boards/iq9075.toml:device.chipset": "sa8775p",
}
# Keys that cannot change alone: any other value is refused by the loader unless another key
# changes with it (the property for these is the other key's, or another test's).
CONSTRAINED = {
    "configs/models/qwen2-tiny.toml:model.name": "must equal its file's name",
    "configs/boards/iq9075.toml:device.name": "must equal its file's name",
    "configs/models/qwen2-tiny.toml:model.default_plan": "must name a plan; the tiny model has one",
    "configs/models/qwen2-tiny.toml:architecture.num_layers":
        "must equal the sum of every plan's layers_per_part",
    "configs/models/qwen2-tiny.toml:graphs.context_lengths":
        "excludes graphs.context_length (tests/test_context_lengths.py builds both)",
    "configs/models/qwen2-tiny.toml:inputs.source":
        "another source needs an export's files "
        "(tests/test_qaihm_export.py, test_context_lengths.py)",
    "configs/devices.toml:chipset.qcs9075.soc_model":
        "must agree with qualcomm_soc_models, Qualcomm's table "
        "(build:device covers a chipset change)",
    "configs/devices.toml:chipset.qcs9075.dsp_arch": "must agree with qualcomm_soc_models",
    "configs/devices.toml:qualcomm_soc_models.77.dsp_arch":
        "must agree with the chipsets naming it",
}
# '*' tables that are data, not settings: what `doit import_export` records about an export.
DATA_TABLES = {"inputs.graphs", "inputs.unsplit", "inputs.pins"}


# ----------------------------------------------------------------------------- settings

class Setting:
    """One leaf: where it lives (build: the command line; a file: a TOML table path), its field
    and its current value."""

    def __init__(self, source: str, path: tuple, field, current):
        self.source, self.path, self.field, self.current = source, path, field, current

    @property
    def id(self) -> str:
        return f"{self.source}:{'.'.join(self.path)}"


def leaves(schema: dict, prefix: tuple = ()):
    for key, field in schema.items():
        if isinstance(field.type, dict):
            if "*" not in field.type:
                yield from leaves(field.type, prefix + (key,))
        else:
            yield prefix + (key,), field


def _get(table: dict, path: tuple):
    for key in path:
        if not isinstance(table, dict) or key not in table:
            return None
        table = table[key]
    return table


def all_settings() -> list:
    from hexbundle.config import toolchain
    from hexbundle.config.build import BUILD_SCHEMA, MODEL_SCHEMA, PLAN_SCHEMA
    from hexbundle.config.devices import BOARD_SCHEMA, CHIPSET_SCHEMA, TABLE_SCHEMA
    from hexbundle.config.schema import validate

    def toml(rel):
        with open(ROOT / rel, "rb") as fh:
            return tomllib.load(fh)

    out = []
    build = validate(toml("configs/build.toml"), BUILD_SCHEMA, "build.toml")
    out += [Setting("build", p, f, _get(build, p)) for p, f in leaves(BUILD_SCHEMA)]

    model_file = f"configs/models/{MODEL}.toml"
    model = validate(toml(model_file), MODEL_SCHEMA, model_file)
    out += [Setting(model_file, p, f, _get(model, p)) for p, f in leaves(MODEL_SCHEMA)]
    plan = ("plans", model["model"]["default_plan"])
    out += [Setting(model_file, plan + p, f, _get(model, plan + p))
            for p, f in leaves(PLAN_SCHEMA)]
    for key, field in MODEL_SCHEMA["inputs"].type.items():
        if isinstance(field.type, dict):
            assert f"inputs.{key}" in DATA_TABLES, f"inputs.{key}: a '*' table this test skips"

    board = toml(DEVICE_FILE)
    out += [Setting(DEVICE_FILE, p, f, _get(board, p)) for p, f in leaves(BOARD_SCHEMA)]
    table = toml("configs/devices.toml")
    chip = ("chipset", board["device"]["chipset"])
    out += [Setting("configs/devices.toml", p, f, _get(table, p))
            for p, f in leaves(TABLE_SCHEMA)]
    out += [Setting("configs/devices.toml", chip + p, f, _get(table, chip + p))
            for p, f in leaves(CHIPSET_SCHEMA)]
    soc = ("qualcomm_soc_models", str(_get(table, chip + ("soc_model",))))
    out += [Setting("configs/devices.toml", soc + p, f, _get(table, soc + p))
            for p, f in leaves(TABLE_SCHEMA["qualcomm_soc_models"].type["*"].type)]

    tc = validate(toml("configs/toolchain.toml"), toolchain.SCHEMA, "toolchain.toml")
    out += [Setting("configs/toolchain.toml", p, f, _get(tc, p))
            for p, f in leaves(toolchain.SCHEMA)]
    out += [Setting("env", (name,), None, None) for name in sorted(env_variables())
            if name not in NOT_BUILD_INPUTS]
    return out


def env_variables() -> set:
    """Every HEXBUNDLE_* name the package's source spells out."""
    names = set()
    for path in (ROOT / "hexbundle").rglob("*.py"):
        names.update(re.findall(r"HEXBUNDLE_[A-Z0-9_]+", path.read_text()))
    names.update(re.findall(r"HEXBUNDLE_[A-Z0-9_]+", (ROOT / "dodo.py").read_text()))
    return names


def candidates(field, current) -> list:
    """Other values for a field, most natural first; the loader picks the first valid one."""
    out = []
    if field.example is not None:
        out.append(field.example)
    if field.choices:
        i = field.choices.index(current) if current in field.choices else -1
        out += list(field.choices[i + 1:]) + list(field.choices[:max(i, 0)])
    elif field.type is bool:
        out.append(not current if current is not None else True)
    elif field.type is int:
        c = current if current is not None else int(field.min or 1)
        out += [c + 1, c - 1, c * 2, c // 2] if current is not None else [c, c * 2]
    elif field.type is float:
        c = current if current is not None else float(field.min or 1.0)
        out += [c * 2 if c else 1.0, c / 2, c + 0.5, c - 0.5] if current is not None else [c]
    elif field.type is str:
        c = current or ""
        bumped = re.sub(r"[0-9]", lambda m: str((int(m.group()) + 1) % 10), c, count=1)
        out += [bumped, c + "x", c + " (changed)", c[:-1]] if c else ["x"]
    elif field.type is list and not current:
        out += ([["changed"]] if field.item is str else
                [[(field.item or int)(field.min or 1)] * n for n in range(1, 9)])
    elif field.type is list:
        if field.item is str:
            out.append(list(current) + ["changed"])
        else:
            out += [list(reversed(current)), list(current[:1]) + list(reversed(current[1:])),
                    list(current)[:-1], list(current) + [current[-1]],
                    [v + 1 for v in current]]
    valid = []
    for v in out:
        if v == current or v in valid:
            continue
        if field.pattern and isinstance(v, str) and not re.fullmatch(field.pattern, v):
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            below = field.min is not None and v < field.min
            if below or (field.max is not None and v > field.max):
                continue
            if isinstance(v, float) and not math.isfinite(v):
                continue
        valid.append(v)
    return valid


SETTINGS = all_settings()


# ----------------------------------------------------------------------------- applying one

def toml_text(table: dict, prefix: str = "") -> str:
    """A TOML document of nested dicts of str/int/float/bool/lists (what configs hold)."""
    lines, subtables = [], []
    for key, value in table.items():
        k = key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)
        if isinstance(value, dict):
            subtables.append((k, value))
        else:
            lines.append(f"{k} = {toml_value(value)}")
    text = (f"[{prefix}]\n" if prefix and lines else "") + "\n".join(lines) + "\n"
    for k, value in subtables:
        text += "\n" + toml_text(value, f"{prefix}.{k}" if prefix else k)
    return text


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    return "[" + ", ".join(toml_value(v) for v in value) + "]"


def apply(root: Path, setting: Setting, value) -> tuple:
    """Make the change in the project at `root`: (command-line overrides, environment)."""
    if setting.source == "build":
        return [f"{'.'.join(setting.path)}={command_line_value(value)}"], {}
    if setting.source == "env":
        return [], {setting.path[0]: value.format(root=root)}
    path = root / setting.source
    with open(path, "rb") as fh:
        doc = tomllib.load(fh)
    table = doc
    for key in setting.path[:-1]:
        table = table.setdefault(key, {})
    table[setting.path[-1]] = value
    path.write_text(toml_text(doc))
    return [], {}


def command_line_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@contextlib.contextmanager
def environment(env: dict):
    """os.environ with `env` set, for an in-process load_build; put back afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        yield


def loads(root: Path, overrides: list, env: dict) -> bool:
    """True if the config loader accepts the project at `root` with the change."""
    from hexbundle.config.build import load_build
    from hexbundle.support.errors import HexbundleError
    with environment(env):
        try:
            load_build(root, dict(o.split("=", 1) for o in overrides))
            return True
        except HexbundleError:
            return False


# ----------------------------------------------------------------------------- outputs

def outputs(project: Project, overrides: list, env: dict) -> dict:
    """kind -> {relative path: digest} of the resolved variant's outputs: the model's inputs,
    DLCs, bins, bundle. Missing directories are absent kinds."""
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    from hexbundle.support.hashing import file_digest
    with environment(env):
        layout = Layout(load_build(project.root, dict(o.split("=", 1) for o in overrides)))
    dirs = {"convert": layout.dlc_dir, "compile": layout.bin_dir, "bundle": layout.bundle_dir}
    found = {kind: tree_digests(d) for kind, d in dirs.items() if d.is_dir()}
    # The model's inputs directory is shared by its variants (each plan's parts, each one's
    # graphs): compare the files this variant reads.
    inputs = {layout.rel(p): file_digest(p) for p in layout.all_inputs() if p.is_file()}
    if inputs:
        found["inputs"] = inputs
    return found


def kind_of(task: str) -> str:
    return task.split(":", 1)[0]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Project:
    project = copy_project(tmp_path_factory.mktemp("every") / "base")
    project.doit("bundle")
    return project


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A BuildGrid server holding the base build's steps (uploaded by a machine of its own), or
    None where there is no `bgd` and CI is not set (under CI it must run: .ci/run provides it)."""
    from hexbundle.remote.buildgrid import BuildGrid, find_bgd
    if not find_bgd():
        if os.environ.get("CI"):
            pytest.fail("CI is set, so the remote cache property must run, but no `bgd` "
                        "($HEXBUNDLE_BGD) was found")
        yield None
        return
    tmp = tmp_path_factory.mktemp("every-remote")
    server = BuildGrid.start(tmp / "bgd")
    try:
        copy_project(tmp / "seed").doit("bundle", f"remote_cache={server.url}")
        yield server
    finally:
        server.stop()


CACHED = ("inputs", "convert", "compile")   # the steps a remote cache serves


def build(project: Project, overrides: list, env: dict):
    return project.doit("bundle", *overrides, env=env, check=False)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.id)
def test_an_incremental_build_equals_a_clean_one_after_a_change(setting, base, cache, tmp_path):
    inc = Project(tmp_path / "inc")
    # cp -a, not shutil.copytree: the bundle's bins are hard links to bin/'s, which a copy
    # that breaks them would make bundle re-link (and re-run) for no change of ours
    subprocess.run(["cp", "-a", str(base.root), str(inc.root)], check=True)
    clean = copy_project(tmp_path / "clean")
    if setting.source == "env":
        name = setting.path[0]
        assert name in ENV_VALUES, (f"{name}: a HEXBUNDLE_* variable this test does not know: "
                                    "give it a value in ENV_VALUES or say in NOT_BUILD_INPUTS why "
                                    "it is no build input")
        values = [ENV_VALUES[name]]
    else:
        values = ([NAMED_VALUES[setting.id]] if setting.id in NAMED_VALUES else []) \
            + candidates(setting.field, setting.current)
    if setting.id in CONSTRAINED:
        pytest.skip(f"{setting.id}: {CONSTRAINED[setting.id]}")
    if setting.field is not None and len(setting.field.choices) == 1:
        pytest.skip(f"{setting.id}: one valid value only ({setting.field.choices[0]!r})")
    chosen = None
    for value in values:
        shutil.rmtree(clean.root)
        copy_project(clean.root)
        overrides, env = apply(clean.root, setting, value)
        if loads(clean.root, overrides, env):
            chosen = value
            break
    if chosen is None:
        pytest.fail(f"{setting.id} = {setting.current!r}: no other valid value found among "
                    f"{values!r}: give its Field an `example`")
    overrides, inc_env = apply(inc.root, setting, chosen)
    _, clean_env = apply(clean.root, setting, chosen) if setting.source == "env" else ([], env)
    before = outputs(inc, [], {})
    incremental = build(inc, overrides + ["--explain"], inc_env)
    fresh = build(clean, overrides, clean_env)

    assert incremental.code == fresh.code, (
        f"{setting.id} = {chosen!r}: the incremental build exited {incremental.code}, a clean one "
        f"{fresh.code}\n--- incremental\n{incremental.out[-3000:]}{incremental.err[-2000:]}"
        f"\n--- clean\n{fresh.out[-3000:]}{fresh.err[-2000:]}")
    got, want = outputs(inc, overrides, inc_env), outputs(clean, overrides, clean_env)
    if fresh.code != 0:   # a build that fails: compare what the clean build did make
        got = {k: v for k, v in got.items() if k in want}
    differ = {k: sorted(set(got.get(k, {}).items()) ^ set(want.get(k, {}).items()))
              for k in set(got) | set(want) if got.get(k) != want.get(k)}
    ran = sorted(incremental.executed)
    same = sorted({kind_of(t) for t in ran} - {k for k in before if before[k] != got.get(k)})
    explained = explanations(incremental)
    record(setting, chosen, incremental.code, ran, same, explained)
    # --explain (graph/explain.py) gives every step that ran a reason that names what changed
    # (a setting, an input, a code file, an output, a step never built here), and says
    # "up to date" of every other step it reached
    vague = {t: why for t, why in explained.items()
             if t in ran and not NAMED_REASON.search(why)}
    assert not vague, f"{setting.id} = {chosen!r}: --explain named nothing for {vague}"
    assert {t for t, why in explained.items()
            if why != "up to date" and not why.startswith("not run: ")} == set(ran), (
        f"{setting.id} = {chosen!r}: --explain {explained} vs the steps that ran {ran}")
    assert not differ, (f"{setting.id} = {chosen!r}: incremental != clean in "
                        f"{sorted(differ)} (steps re-run: {ran}): {differ}")

    # Through the remote cache: another build root with the change, its steps fetched where the
    # cache has them, must make what the clean build made (a stale hit would hand it the base's
    # outputs). Run where the change reaches a cached step's outputs (elsewhere the base's
    # cached results are the right ones anyway); not for the run settings (Field.run_setting:
    # the remote_* settings themselves, the step containers).
    reaches_cached = any(before.get(k) != want.get(k) for k in CACHED)
    if cache is None or fresh.code != 0 or not reaches_cached \
            or (setting.field is not None and setting.field.run_setting):
        return
    shared = copy_project(tmp_path / "shared")
    _, shared_env = apply(shared.root, setting, chosen)
    via = build(shared, overrides + [f"remote_cache={cache.url}"], shared_env)
    assert via.code == 0, f"{setting.id} = {chosen!r} with the remote cache:\n{via.out[-3000:]}"
    assert outputs(shared, overrides, shared_env) == want, (
        f"{setting.id} = {chosen!r}: a build through the remote cache != a clean one")


# What an --explain reason names: an option's old -> new value, an input's digests, a code
# file, an output, a pin, a step never built here (graph/explain.py's phrases).
NAMED_REASON = re.compile(r"changed: .* -> |changed \(digest \w+ -> \w+\)|code file \S+ "
                          r"|output \S+ changed|target missing: \S+|never built here|is new: "
                          r"|is gone \(was |is a new input|no longer an input|hard link|"
                          r"is not part of the bundle")


def explanations(run) -> dict:
    """task -> the reason --explain gave it ("up to date", "runs because ...", ...)."""
    return dict(re.findall(r"^explain: (\S+)  (.*)$", run.out, re.M))


def record(setting: Setting, value, code: int, ran: list, same: list,
           explained: dict) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"setting": setting.id, "value": value, "exit": code, "reran": ran,
                       "reran_same_output": same,
                       "explain": {t: w for t, w in explained.items() if w != "up to date"}},
                      default=str)
    with open(REPORT, "a") as fh:
        fh.write(line + "\n")
