"""What other Genie clients read in a bundle: `clients/` (writer `client_files`, judged by
`client_problems`). The bundle's own layout (genie_config.json and its files at the top, lib/,
dsp/, bin/, run.sh) stays as it is; `clients/` adds, for a qairt bundle that carries its runtime
for a Linux or Android board, what each client reads and cannot find there:

open-genie-server 1.8.0 (an OpenAI-compatible server over libGenie; its genie_server.config and
slots modules) reads env_config.json, resolving its paths against the working directory:
  - libGenie from <QAIRT_SDK_ROOT>/lib/<abi>/libGenie.so unless GENIE_LIB_PATH names it:
    GENIE_LIB_PATH is the bundle's lib/libGenie.so;
  - the skels from ADSP_LIBRARY_PATH, which it sets itself, starting with
    <QAIRT_SDK_ROOT>/lib/hexagon-<HEXAGON_VERSION>/unsigned (the SDK's own folder of the skel):
    so clients/open-genie-server/sdk/ holds the bundle's skel at that path, and a board's stale
    skel in /usr/lib/rfsa/adsp comes after it;
  - the model's name (the id clients route by) is the name of the model folder after symlinks
    are resolved, and the chat template is guessed from it unless CHAT_TEMPLATE says: a
    deployed bundle's folder is `.DIR.hexbundle/<id>`, a built one's `bundle`. So the slot's
    folder is clients/open-genie-server/<model>/ (named after the model), holding a copy of
    genie_config.json whose paths lead back to the bundle's files, and CHAT_TEMPLATE is read
    from the bundle's own tokenizer (`chat_template`).
chipwright 0.2.10 (its LLM runner, chipwright.modalities.llm.run) pushes the files its registry
record's `meta.bundle_files` lists, or else every entry of the bundle folder, one regular file
at a time: it stops at lib/. clients/chipwright.json is the record's `run` block: every file
chipwright needs (the bundle's, not clients/), run through the bundle's run.sh (`genie_bin`),
which sets the library paths and checks the board as it does for `doit deploy --run`, and the
chat template chipwright knows for the model (chatml, else raw: chipwright has no other).
"""
from __future__ import annotations

import copy
import os
import re
import stat
from pathlib import Path

from hexbundle.config.layout import GENIE_CONFIG, MANIFEST, TOKENIZER
from hexbundle.config.runtime_files import (ANDROID, CLIENT_TARGETS, CLIENTS, LINUX,
                                            OPEN_GENIE_SERVER, OPEN_GENIE_SERVER_SDK,
                                            client_paths, runtime_files, script_name)
from hexbundle.formats.tokenizer import added_token_contents
from hexbundle.support.atomic import json_bytes
from hexbundle.support.errors import HexbundleError, output_error
from hexbundle.support.files import JSON_CONFIG_MAX_BYTES
from hexbundle.support.jsondoc import read_json

PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# where its prefix cache goes: outside the bundle, which a server must not write into
PREFIX_CACHE = {LINUX: "/tmp/open-genie-server", ANDROID: "/data/local/tmp/open-genie-server"}

# A chat template is named by the special tokens its turns are marked with (the bundle's own
# tokenizer.json): ChatML (Qwen2/Qwen2.5/Qwen3) and Llama 3.
TEMPLATE_TOKENS = (("chatml", ("<|im_start|>", "<|im_end|>")),
                   ("llama3", ("<|begin_of_text|>", "<|eot_id|>")))
CHIPWRIGHT_TEMPLATES = ("chatml",)        # chipwright 0.2.10 renders chatml or raw


def chat_template(tokenizer: Path) -> str:
    """The chat template family whose turn markers the tokenizer holds, or "" for none known."""
    contents = set(added_token_contents(tokenizer).values())
    for family, tokens in TEMPLATE_TOKENS:
        if set(tokens) <= contents:
            return family
    return ""


def serves(runtime) -> bool:
    """A bundle the clients can run: it carries its runtime (qairt, runtime = "bundled") for a
    board OS they run on."""
    return isinstance(runtime, dict) and runtime.get("mode") == "bundled" \
        and runtime.get("target") in CLIENT_TARGETS


def _runtime_file(runtime: dict, role: str):
    """The runtime table's file of `role` for the manifest runtime record's board."""
    return next(f for f in runtime_files(runtime["target"], runtime["dsp_arch"])
                if f.role == role)


def _rebased(config: dict, prefix: str) -> dict:
    """genie_config.json with every file it names (formats.genie.listed_names) reached from a
    folder `prefix` below the bundle ("../../../")."""
    out = copy.deepcopy(config)
    dialog = out["dialog"]
    dialog["tokenizer"]["path"] = prefix + dialog["tokenizer"]["path"]
    backend = dialog["engine"]["backend"]
    if "extensions" in backend:
        backend["extensions"] = prefix + backend["extensions"]
    binary = dialog["engine"]["model"]["binary"]
    binary["ctx-bins"] = [prefix + b for b in binary["ctx-bins"]]
    return out


def _up(path: str) -> str:
    """From the folder of `path` (a bundle path) back to the bundle."""
    return "../" * path.count("/")


def open_genie_server_files(bundle: Path, model: str, runtime: dict, paths: dict) -> dict:
    here = OPEN_GENIE_SERVER                          # its working directory
    genie = _runtime_file(runtime, "libGenie")
    config = read_json(bundle / GENIE_CONFIG, GENIE_CONFIG, JSON_CONFIG_MAX_BYTES)
    template = chat_template(bundle / TOKENIZER)
    env = {"QAIRT_SDK_ROOT": OPEN_GENIE_SERVER_SDK,
           "GENIE_LIB_PATH": _up(here + "/") + genie.bundle_path,
           "HEXAGON_VERSION": "v" + runtime["dsp_arch"].lower().lstrip("v"),
           # auto: Qualcomm Linux (OE) or Ubuntu, as the board says; both take the OE libraries
           "TARGET_PLATFORM": "android" if runtime["target"] == ANDROID else "auto",
           **({"CHAT_TEMPLATE": template} if template else {}),
           "PREFIX_CACHE_DIR": PREFIX_CACHE[runtime["target"]],
           "TEXT_SLOTS": [{"name": model, "model_root": model}]}
    slot = paths["slot_config"]
    return {paths["env_config"]: json_bytes(env),
            slot: json_bytes(_rebased(config, _up(slot))),
            paths["skel"]: _runtime_file(runtime, "skel").bundle_path}


def chipwright_files(bundle: Path, files: list, runtime: dict, paths: dict) -> dict:
    template = chat_template(bundle / TOKENIZER)
    meta = {"bundle_files": [f for f in files if not f.startswith(CLIENTS + "/")],
            "genie_bin": "sh " + script_name(runtime["target"]),
            "genie_config": GENIE_CONFIG, "tokenizer": TOKENIZER,
            "template": template if template in CHIPWRIGHT_TEMPLATES else "raw"}
    return {paths["chipwright"]: json_bytes({"modality": "llm", "meta": meta})}


def client_files(bundle: Path, model: str, runtime, files: list) -> dict:
    """{path in the bundle: bytes to write, or the bundle path of the file it carries} for a
    bundle of `model` with manifest runtime record `runtime` and files `files` (relative POSIX
    paths, formats.manifest.bundle_files); {} for a bundle the clients cannot run."""
    if not serves(runtime):
        return {}
    if not PLAIN_NAME.fullmatch(model):   # it names a folder
        raise ValueError(f"the model name {model!r} is not a plain folder name")
    paths = client_paths(model, runtime["target"], runtime["dsp_arch"])
    return {**open_genie_server_files(bundle, model, runtime, paths),
            **chipwright_files(bundle, files, runtime, paths)}


def write_clients(bundle: Path, model: str, runtime, files: list, link) -> list:
    """Write `clients/` into `bundle` (a staging directory); `link(src, dst)` puts a bundle
    file's bytes at a second name (a hard link). Returns the paths written."""
    wanted = client_files(bundle, model, runtime, files)
    for name, what in wanted.items():
        path = bundle / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(what, bytes):
                path.write_bytes(what)
            else:
                link(bundle / what, path)
            path.chmod(0o644)
        except OSError as exc:   # a full disk: the staging directory goes, the bundle stays
            raise output_error(exc.filename or path, exc) from None
    return sorted(wanted)


def _regular_files(folder: Path) -> list:
    """The regular files under `folder` as bundle paths; nothing followed (a link, a FIFO:
    formats.genie.clients_dir_problems names them)."""
    found = []
    for top, _dirs, names in os.walk(folder):        # does not follow links to folders
        for name in names:
            path = Path(top) / name
            if stat.S_ISREG(path.lstat().st_mode):
                found.append(path)
    return found


def _same(path: Path, what, bundle: Path) -> bool:
    source = bundle / what if isinstance(what, str) else None
    if source is not None and not (source.is_file() and not source.is_symlink()):
        return False
    size = len(what) if source is None else source.stat().st_size
    if path.stat().st_size != size:
        return False
    return path.read_bytes() == (what if source is None else source.read_bytes())


def client_problems(bundle: Path, manifest: dict) -> list:
    """clients/ as the bundle step writes it for this bundle, byte for byte: a file missing,
    different, or one it does not write is a problem."""
    bundle = Path(bundle)
    folder = bundle / CLIENTS
    present = sorted(p.relative_to(bundle).as_posix() for p in _regular_files(folder)) \
        if folder.is_dir() and not folder.is_symlink() else []
    files = sorted(name for name in manifest.get("files", {}) if name != MANIFEST)
    try:
        wanted = client_files(bundle, manifest.get("model", ""), manifest.get("runtime"), files)
    except (HexbundleError, KeyError, TypeError, ValueError, AttributeError) as exc:
        return [f"{CLIENTS}/: cannot be derived from the bundle ({exc}): rebuild it with "
                "`doit bundle backend=qairt`"]
    problems = [f"{name}: in the bundle but not what the bundle step writes there: remove it "
                "(`doit bundle` writes clients/ for a qairt bundle carrying its runtime for a "
                "Linux or Android board)" for name in present if name not in wanted]
    for name, what in wanted.items():
        path = bundle / name
        if name not in present:
            problems.append(f"{name}: missing (other Genie clients read it): rebuild the bundle "
                            "with `doit bundle backend=qairt`")
        elif not _same(path, what, bundle):
            problems.append(f"{name}: not what the bundle step writes for this bundle"
                            + ("" if isinstance(what, bytes) else f" (a copy of {what})")
                            + ": rebuild the bundle with `doit bundle backend=qairt`")
    return problems


__all__ = ["CLIENTS", "chat_template", "client_files", "write_clients", "client_problems",
           "serves"]
