"""The Genie runtime configs: genie_config.json and htp_backend_ext_config.json.

Writers (`genie_config`, `htp_backend_ext_config`) write a GenieOptions value (the bundle step's
options: the model's architecture and [genie] settings, the one resolved device whose
soc_model / dsp_arch also fed the compile) and the tokenizer's special ids. Key names and types are
those of Qualcomm's schema (qairt-dev's genie_config.GenieConfig, HtpConfigHelper), which the
tests validate every model's output against. The reader (`read_genie_config`) takes back what a
host runtime needs, as Genie would (`doit verify` runs the bundle with it).
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hexbundle.config.model import ROPE_SCALING_TYPES, RopeScaling
from hexbundle.config.layout import GENIE_CONFIG, HTP_EXT_CONFIG, MANIFEST, TOKENIZER
from hexbundle.config.runtime_files import BIN, CLIENTS, DSP, LIB, TARGETS, script_name
# the bundle step's typed options: in config, so a step description carries them
from hexbundle.config.step_options import GenieOptions  # noqa: F401  (its writers' input)
from hexbundle.formats.genie_ranges import range_problems
from hexbundle.support.errors import InputError, VerifyError
from hexbundle.support.files import JSON_CONFIG_MAX_BYTES, kind_of, link_target
from hexbundle.support.jsondoc import read_json

# What ai-hub-apps' manual_bundle.md copies beside the configs and bins: the Genie and QNN
# libraries (libGenie.so, libQnnHtp*.so, the Hexagon skel libraries) and genie-t2t-run
# (Windows: its DLLs, genie-t2t-run.exe and the skel's signing catalog, libqnnhtpvNN.cat)
RUNTIME_FILE = re.compile(r"lib[\w.+-]*\.so(\.[\d.]+)?|genie-[\w-]+|[\w.+-]+\.(?:dll|exe|cat)")
# What a qairt bundle carries of the compiling SDK (config/runtime_files.py): its runtime's
# directories, each of files only, and the launcher (checks/runtime_check.py judges their bytes)
RUNTIME_DIRS = (LIB, DSP, BIN)
LAUNCHERS = frozenset(script_name(t) for t in TARGETS)


# ---------------------------------------------------------------------------------------------
# a bundle as the device receives it: the one place its entries are judged (check_bundle lists
# every problem, the host runtime's reader refuses the first)

def bundle_entries(bundle: Path) -> dict:
    """name -> None for a regular file, else what it is ("a symbolic link", "a directory", ...);
    nothing is followed."""
    entries = {}
    with os.scandir(bundle) as found:
        for entry in sorted(found, key=lambda e: e.name):
            mode = entry.stat(follow_symlinks=False).st_mode
            entries[entry.name] = None if stat.S_ISREG(mode) else kind_of(mode)
    return entries


def entry_problems(bundle: Path, entries: dict) -> list:
    """A symbolic link (inside or out: a copied bundle lacks its target, a pushed one carries
    it), a directory, a FIFO or a device among a bundle's entries."""
    problems = []
    for name, kind in entries.items():
        if kind == "a symbolic link":
            problems.append(f"{name}: a symbolic link (to {link_target(bundle / name)}), not a "
                            "file of the bundle: a copied bundle lacks what it points to, a "
                            "pushed one carries it; put the file itself there")
        elif kind == "a directory" and name in RUNTIME_DIRS:
            problems += runtime_dir_problems(bundle, name)
        elif kind == "a directory" and name == CLIENTS:
            problems += clients_dir_problems(bundle / name, name)
        elif kind is not None:
            problems.append(f"{name}: {kind}, not a file; a Genie bundle is one directory of "
                            "files (and the runtime's lib/, dsp/ and bin/, and clients/): "
                            "remove it")
    return problems


def runtime_dir_problems(bundle: Path, name: str) -> list:
    """The runtime's own directory: regular files only, nothing followed, nothing nested."""
    problems = []
    with os.scandir(bundle / name) as found:
        for entry in sorted(found, key=lambda e: e.name):
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                problems.append(f"{name}/{entry.name}: a symbolic link (to "
                                f"{link_target(bundle / name / entry.name)}), not a file of the "
                                "bundle: put the file itself there")
            elif not stat.S_ISREG(mode):
                problems.append(f"{name}/{entry.name}: {kind_of(mode)}, not a file: remove it")
    return problems


def clients_dir_problems(folder: Path, shown: str) -> list:
    """clients/ (formats/genie_clients.py): folders and regular files, nothing followed; what
    they hold is judged against what the bundle step writes (genie_clients.client_problems)."""
    problems = []
    with os.scandir(folder) as found:
        for entry in sorted(found, key=lambda e: e.name):
            mode = entry.stat(follow_symlinks=False).st_mode
            name = f"{shown}/{entry.name}"
            if stat.S_ISDIR(mode):
                problems += clients_dir_problems(folder / entry.name, name)
            elif stat.S_ISLNK(mode):
                problems.append(f"{name}: a symbolic link (to {link_target(folder / entry.name)})"
                                ", not a file of the bundle: put the file itself there")
            elif not stat.S_ISREG(mode):
                problems.append(f"{name}: {kind_of(mode)}, not a file: remove it")
    return problems


def listed_names(dialog: dict) -> set:
    """The files a dialog names, and those a bundle may hold beside them."""
    def dig(*keys):
        node = dialog
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        return node
    bins = dig("engine", "model", "binary", "ctx-bins")
    return {GENIE_CONFIG, HTP_EXT_CONFIG, MANIFEST, dig("tokenizer", "path"),
            dig("engine", "backend", "extensions")} | (
        {b for b in bins if isinstance(b, str)} if isinstance(bins, list) else set())


def unlisted_problems(entries: dict, dialog: dict) -> list:
    """Files nothing in genie_config.json names (but manifest.json and the runtime's own): a
    stray file is pushed to the device with the rest. A stray .bin: the ctx-bins check's."""
    listed = listed_names(dialog)
    return [f"{name}: in the bundle but named by nothing in {GENIE_CONFIG}: remove it (a "
            "bundle is pushed whole)" for name, kind in entries.items()
            if kind is None and name not in listed and not name.endswith(".bin")
            and not RUNTIME_FILE.fullmatch(name) and name not in LAUNCHERS]


def htp_backend_ext_config(o: GenieOptions) -> dict:
    """Runtime HTP settings. soc_model / dsp_arch come from the same device as the compile."""
    d = o.device
    cores = [{"core_id": c, "perf_profile": d.perf_profile,
              "rpc_control_latency": d.rpc_control_latency} for c in o.cores]
    device = {"soc_model": d.soc_model, "dsp_arch": d.dsp_arch, "cores": cores}
    if o.device_id:     # QAIRT's default, 0, is left unsaid (HtpDeviceConfig.id)
        device = {"device_id": o.device_id, **device}
    return {"devices": [device],
            "memory": {"mem_type": o.mem_type},
            "context": {"weight_sharing_enabled": o.weight_sharing}}


def positional_encoding(o: GenieOptions) -> dict:
    """dialog.engine.model's positional-encoding block, in the shape Qualcomm's generator writes
    for a model with rope scaling (qai-hub-models' create_genie_config), with this model's own
    values: that generator writes factor 8.0 whatever the config says (Llama 3.1 8B's value;
    Llama 3.2 1B/3B's is 32.0)."""
    r = o.rope_scaling
    return {"type": "rope", "rope-dim": o.pos_id_dim, "rope-theta": int(o.rope_theta),
            "rope-scaling": {"rope-type": r.rope_type, "factor": float(r.factor),
                             "low-freq-factor": float(r.low_freq_factor),
                             "high-freq-factor": float(r.high_freq_factor),
                             "original-max-position-embeddings":
                                 int(r.original_max_position_embeddings)}}


def genie_config(o: GenieOptions, token_ids: dict, bin_names: list) -> dict:
    """genie_config.json. RoPE as Qualcomm's generator writes it: QnnHtp's `rope-theta` and
    `pos-id-dim` for plain RoPE; for a scaled one, a positional-encoding block in the model
    section instead (Genie reads that block first)."""
    config = _dialog_config(o, token_ids, bin_names)
    if o.rope_scaling is not None:
        engine = config["dialog"]["engine"]
        del engine["backend"]["QnnHtp"]["pos-id-dim"], engine["backend"]["QnnHtp"]["rope-theta"]
        engine["model"]["positional-encoding"] = positional_encoding(o)
    return config


def _dialog_config(o: GenieOptions, token_ids: dict, bin_names: list) -> dict:
    rt, g = o.runtime, o.settings
    return {"dialog": {
        "version": 1,
        "type": "basic",
        "max-num-tokens": g.max_num_tokens,
        "context": {"version": 1, "size": o.context_size, "n-vocab": o.n_vocab,
                    "bos-token": token_ids["bos"], "eos-token": token_ids["eos"],
                    "eot-token": token_ids["eot"]},
        "sampler": {"version": 1, "seed": g.sampler_seed, "temp": g.temp,
                    "top-k": g.top_k, "top-p": g.top_p},
        "tokenizer": {"version": 1, "path": TOKENIZER},
        "engine": {
            "version": 1,
            "n-threads": rt.n_threads,
            "backend": {
                "version": 1,
                "type": "QnnHtp",
                "QnnHtp": {"version": 1, "use-mmap": rt.use_mmap,
                           "spill-fill-bufsize": rt.spill_fill_bufsize,
                           "mmap-budget": rt.mmap_budget, "poll": rt.poll,
                           "cpu-mask": rt.cpu_mask, "kv-dim": o.head_dim,
                           # an integer in Qualcomm's schema; the model config refuses others
                           "pos-id-dim": o.pos_id_dim, "rope-theta": int(o.rope_theta),
                           "allow-async-init": rt.allow_async_init},
                "extensions": HTP_EXT_CONFIG},
            "model": {"version": 1, "type": "binary",
                      "binary": {"version": 1, "ctx-bins": bin_names}},
        },
    }}


@dataclass(frozen=True)
class GenieSettings:
    """What the host runtime takes from genie_config.json, as Genie would."""

    path: Path
    ctx_bins: list
    context_size: int
    n_vocab: int
    stop_tokens: tuple            # eos, eot
    rope_theta: float
    pos_id_dim: int
    head_dim: int                 # Genie's "kv-dim" (not Architecture.kv_dim, nkv * head_dim)
    sampler: dict                 # seed, temp, top-k, top-p
    max_num_tokens: int
    tokenizer: Path
    rope_scaling: Optional[RopeScaling] = None


def read_genie_config(bundle_dir: Path) -> GenieSettings:
    path = Path(bundle_dir) / GENIE_CONFIG
    try:
        entries = bundle_entries(Path(bundle_dir))
    except OSError as exc:
        raise VerifyError(f"{bundle_dir}: not a bundle directory ({exc.strerror})") from None
    if GENIE_CONFIG not in entries:
        raise VerifyError(f"{path}: missing; build the bundle with `doit bundle`")
    problems = entry_problems(Path(bundle_dir), entries)
    try:
        if not problems:
            dialog = read_json(path, GENIE_CONFIG, JSON_CONFIG_MAX_BYTES)["dialog"]
    except (InputError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise VerifyError(f"{path}: not a Genie dialog config ({exc}); rebuild the bundle") from None
    if not problems and not isinstance(dialog, dict):
        raise VerifyError(f"{path}: 'dialog' is not an object; rebuild the bundle")
    problems = problems or unlisted_problems(entries, dialog) + range_problems(dialog)
    if problems:   # what check_bundle refuses, the runtime does not load
        raise VerifyError(f"{bundle_dir}: {problems[0]}" + (
            f" (and {len(problems) - 1} more: `doit check_bundle --path {bundle_dir}` lists "
            "them)" if len(problems) > 1 else ""))

    def get(*keys):
        node = dialog
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                raise VerifyError(f"{path}: key 'dialog.{'.'.join(keys)}' is missing; rebuild the "
                                  f"bundle with `doit bundle`")
            node = node[key]
        return node

    bins = get("engine", "model", "binary", "ctx-bins")
    if not isinstance(bins, list) or not all(isinstance(b, str) for b in bins):
        raise VerifyError(f"{path}: key 'dialog.engine.model.binary.ctx-bins' must be a list of "
                          f"file names")
    htp = ("engine", "backend", "QnnHtp")
    theta_key, dim_key, scaling = (*htp, "rope-theta"), (*htp, "pos-id-dim"), None
    if "positional-encoding" in get("engine", "model"):   # Genie reads this block first
        block = ("engine", "model", "positional-encoding")
        theta_key, dim_key = (*block, "rope-theta"), (*block, "rope-dim")
        if get(*block, "type") != "rope":
            raise VerifyError(f"{path}: 'dialog.{'.'.join(block)}.type' is "
                              f"{get(*block, 'type')!r}; the runtime knows 'rope'")
        if "rope-scaling" in get(*block):
            scaling = _rope_scaling(path, get(*block, "rope-scaling"))
    return GenieSettings(
        path=path, ctx_bins=bins, context_size=int(get("context", "size")),
        n_vocab=int(get("context", "n-vocab")),
        stop_tokens=(int(get("context", "eos-token")), int(get("context", "eot-token"))),
        rope_theta=float(get(*theta_key)), pos_id_dim=int(get(*dim_key)),
        head_dim=int(get(*htp, "kv-dim")),
        sampler={k: get("sampler", k) for k in ("seed", "temp", "top-k", "top-p")},
        max_num_tokens=int(get("max-num-tokens")),
        tokenizer=path.parent / str(get("tokenizer", "path")), rope_scaling=scaling)


def _rope_scaling(path: Path, block) -> Optional[RopeScaling]:
    """A positional-encoding block's rope-scaling as the runtime computes it (None: default)."""
    where = f"{path}: 'dialog.engine.model.positional-encoding.rope-scaling'"
    kind = block.get("rope-type", "default") if isinstance(block, dict) else None
    if kind == "default":
        return None
    if kind not in ROPE_SCALING_TYPES:
        raise VerifyError(f"{where}: rope-type {kind!r}; the runtime computes "
                          f"{', '.join(ROPE_SCALING_TYPES)} (or 'default')")
    keys = ("factor", "low-freq-factor", "high-freq-factor", "original-max-position-embeddings")
    missing = [k for k in keys if not isinstance(block.get(k), (int, float))]
    if missing:
        raise VerifyError(f"{where}: {kind} needs the numbers {', '.join(missing)}; rebuild "
                          f"the bundle with `doit bundle`")
    return RopeScaling(kind, *(float(block[k]) for k in keys[:3]),
                       int(block["original-max-position-embeddings"]))
