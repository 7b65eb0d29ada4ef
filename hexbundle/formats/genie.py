"""The Genie runtime configs: genie_config.json and htp_backend_ext_config.json.

Writers (`genie_config`, `htp_backend_ext_config`) write a GenieOptions value (the bundle step's
options: the model's architecture and [genie] settings, the one resolved device whose
soc_model / dsp_arch also fed the compile) and the tokenizer's special ids. Key names and types are
those of Qualcomm's schema (qairt-dev's genie_config.GenieConfig, HtpConfigHelper), which the
tests validate every model's output against. The reader (`read_genie_config`) takes back what a
host runtime needs, as Genie would (`doit verify` runs the bundle with it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hexbundle.config.build import DialogSettings
from hexbundle.config.devices import DeviceOptions, RuntimeSettings
from hexbundle.config.layout import GENIE_CONFIG, HTP_EXT_CONFIG, TOKENIZER
from hexbundle.support.errors import VerifyError


@dataclass(frozen=True)
class GenieOptions:
    """What the two configs say besides the token ids and the bins' names: the bundle step's
    options (steps/options.py genie_options computes it from the resolved config)."""
    device: DeviceOptions        # the same soc_model / dsp_arch / HTP settings as the compile
    cores: tuple
    mem_type: str
    weight_sharing: bool
    runtime: RuntimeSettings     # the device's [runtime] settings
    settings: DialogSettings     # the model's [genie] settings
    context_size: int            # the largest context length
    n_vocab: int
    head_dim: int
    pos_id_dim: int
    rope_theta: float


def htp_backend_ext_config(o: GenieOptions) -> dict:
    """Runtime HTP settings. soc_model / dsp_arch come from the same device as the compile."""
    d = o.device
    cores = [{"core_id": c, "perf_profile": d.perf_profile,
              "rpc_control_latency": d.rpc_control_latency} for c in o.cores]
    return {"devices": [{"soc_model": d.soc_model, "dsp_arch": d.dsp_arch, "cores": cores}],
            "memory": {"mem_type": o.mem_type},
            "context": {"weight_sharing_enabled": o.weight_sharing}}


def genie_config(o: GenieOptions, token_ids: dict, bin_names: list) -> dict:
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


def read_genie_config(bundle_dir: Path) -> GenieSettings:
    path = Path(bundle_dir) / GENIE_CONFIG
    try:
        dialog = json.loads(path.read_text())["dialog"]
    except FileNotFoundError:
        raise VerifyError(f"{path}: missing; build the bundle with `doit bundle`") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise VerifyError(f"{path}: not a Genie dialog config ({exc}); rebuild the bundle") from None

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
    return GenieSettings(
        path=path, ctx_bins=bins, context_size=int(get("context", "size")),
        n_vocab=int(get("context", "n-vocab")),
        stop_tokens=(int(get("context", "eos-token")), int(get("context", "eot-token"))),
        rope_theta=float(get(*htp, "rope-theta")), pos_id_dim=int(get(*htp, "pos-id-dim")),
        head_dim=int(get(*htp, "kv-dim")),
        sampler={k: get("sampler", k) for k in ("seed", "temp", "top-k", "top-p")},
        max_num_tokens=int(get("max-num-tokens")),
        tokenizer=path.parent / str(get("tokenizer", "path")))
