"""The Genie bundle: genie_config.json, htp_backend_ext_config.json, tokenizer.json, the context
binaries (hard links, not copies) and manifest.json.

Every value is derived: context size, n-vocab, kv-dim, pos-id-dim and rope-theta from the model
config; bos/eos/eot ids looked up in the tokenizer by content; soc_model / dsp_arch from the one
device file that also fed the compile. The bundle is assembled in a staging directory and swapped
in whole, so a failed assembly never damages the previous bundle.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

from hexbundle.support import hashing, testhooks
from hexbundle.support.atomic import write_atomic
from hexbundle.config.build import BuildConfig
from hexbundle.support.errors import InputError, output_error
from hexbundle.config.layout import MANIFEST, Layout
from hexbundle.formats.tokenizer import special_token_ids

FORMAT_VERSION = 1


def canonical_json(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=True) + "\n").encode()


# ---------------------------------------------------------------------------------------------
# tokenizer

# ---------------------------------------------------------------------------------------------
# the two JSON configs

def htp_backend_ext_config(cfg: BuildConfig) -> dict:
    """Runtime HTP settings. soc_model / dsp_arch come from the same device file as the compile."""
    d, htp = cfg.device, cfg.device.htp
    cores = [{"core_id": c, "perf_profile": htp["perf_profile"],
              "rpc_control_latency": htp["rpc_control_latency"]} for c in htp["cores"]]
    return {"devices": [{"soc_model": d.soc_model, "dsp_arch": d.dsp_arch, "cores": cores}],
            "memory": {"mem_type": htp["mem_type"]},
            "context": {"weight_sharing_enabled": cfg.compile["weight_sharing"]}}


def genie_config(cfg: BuildConfig, token_ids: dict, bin_names: list) -> dict:
    a, rt, g = cfg.model.architecture, cfg.device.runtime, cfg.genie
    return {"dialog": {
        "version": 1,
        "type": "basic",
        "max-num-tokens": g["max_num_tokens"],
        "context": {"version": 1, "size": cfg.model.context_length, "n-vocab": a.vocab_size,
                    "bos-token": token_ids["bos"], "eos-token": token_ids["eos"],
                    "eot-token": token_ids["eot"]},
        "sampler": {"version": 1, "seed": g["sampler_seed"], "temp": g["temp"],
                    "top-k": g["top_k"], "top-p": g["top_p"]},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {
            "version": 1,
            "n-threads": rt["n_threads"],
            "backend": {
                "version": 1,
                "type": "QnnHtp",
                "QnnHtp": {"version": 1, "use-mmap": rt["use_mmap"],
                           "spill-fill-bufsize": rt["spill_fill_bufsize"],
                           "mmap-budget": rt["mmap_budget"], "poll": rt["poll"],
                           "cpu-mask": rt["cpu_mask"], "kv-dim": a.head_dim,
                           "pos-id-dim": a.pos_id_dim, "rope-theta": _number(a.rope_theta),
                           "allow-async-init": False},
                "extensions": "htp_backend_ext_config.json"},
            "model": {"version": 1, "type": "binary",
                      "binary": {"version": 1, "ctx-bins": bin_names}},
        },
    }}


def _number(x: float):
    return int(x) if float(x).is_integer() else x


# ---------------------------------------------------------------------------------------------
# assembly

def link_or_copy(src: Path, dst: Path) -> str:
    """Hard link (bundle time does not grow with model size); copy across filesystems."""
    try:
        os.link(src, dst)
        return "linked"
    except OSError:
        shutil.copy2(src, dst)
        return "copied"


def manifest(cfg: BuildConfig, layout: Layout, bundle_dir: Path, backend_version: str,
             inputs: list, sizes_expected: dict) -> dict:
    """What the bundle holds. It says nothing about HOW it was built (executor, image, host):
    that goes to build-info.json and a release's provenance, so the bundle's bytes do not depend
    on the executor."""
    files = {}
    for path in sorted(bundle_dir.iterdir()):
        if path.name != MANIFEST:
            files[path.name] = {"size": path.stat().st_size, "xxh3_128": hashing.digest(path)}
    bins = [n for n in files if n.endswith(".bin")]
    return {
        "format": FORMAT_VERSION,
        "model": cfg.model.name,
        "device": cfg.device.name,
        "plan": cfg.plan.name,
        "backend": cfg.backend,
        "deployable": cfg.backend == "qairt",
        "toolchain": backend_version,
        "compile": cfg.compile,
        "files": files,
        "total_bytes": sum(f["size"] for f in files.values()),
        "bins_total_bytes": sum(files[n]["size"] for n in bins),
        "expected_bins_bytes": sizes_expected,
        "expected_bins_total_bytes": sum(sizes_expected.values()),
        "inputs": {layout.logical(p): hashing.digest(p) for p in inputs},
        "configs": {layout.logical(p): hashing.digest(p) for p in cfg.config_files},
    }


def assemble(cfg: BuildConfig, layout: Layout, backend_version: str, inputs: list,
             sizes_expected: dict, log) -> Path:
    parts = cfg.plan.parts()
    bins = [layout.bin(p) for p in parts]
    for b in bins:
        if not b.is_file():
            raise InputError(f"{b}: context binary missing; run `doit bundle` to build it")
    token_ids = special_token_ids(layout.tokenizer, cfg.tokenizer_specials,
                                  cfg.model.architecture.vocab_size)
    final = layout.bundle_dir
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=".bundle."))
    try:
        write_atomic(staging / "genie_config.json",
                     canonical_json(genie_config(cfg, token_ids, [b.name for b in bins])))
        write_atomic(staging / "htp_backend_ext_config.json",
                     canonical_json(htp_backend_ext_config(cfg)))
        try:
            shutil.copyfile(layout.tokenizer, staging / "tokenizer.json")
            for b in bins:
                how = link_or_copy(b, staging / b.name)
                log(f"{b.name}: {how} ({b.stat().st_size / (1 << 20):.2f} MiB)")
        except OSError as exc:   # a full disk while copying: the previous bundle stays
            raise output_error(exc.filename or staging, exc) from None
        doc = manifest(cfg, layout, staging, backend_version, inputs, sizes_expected)
        write_atomic(staging / MANIFEST, canonical_json(doc))
        os.chmod(staging, 0o755)
        testhooks.pause_point()   # tests kill the run here: staging complete, not swapped in
        swap_in(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return final


def swap_in(staging: Path, final: Path) -> None:
    """Replace `final` by `staging`: the old bundle stays whole until the new one is complete.

    Where the kernel can (Linux renameat2 RENAME_EXCHANGE), the two directories trade places in
    one step, so `final` is at every instant either the whole old or the whole new bundle.
    Elsewhere, two renames: a kill between them leaves the old bundle in .bundle-old.*, which the
    next run puts back (hexbundle.runguard.restore_interrupted_swaps).
    """
    if not final.exists():
        os.rename(staging, final)
        return
    if exchange_dirs(staging, final):
        shutil.rmtree(staging)   # it now holds the old bundle
        return
    old = Path(tempfile.mkdtemp(dir=final.parent, prefix=".bundle-old."))
    os.rmdir(old)
    os.rename(final, old)
    os.rename(staging, final)
    shutil.rmtree(old)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange_dirs(a: Path, b: Path) -> bool:
    """Atomically swap two paths; False where the OS or filesystem cannot (then nothing moved)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):   # not Linux, or a libc without renameat2 (< glibc 2.28)
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def write_build_info(layout: Layout, executor: str, image: str) -> None:
    """How the bundle was built (executor, toolchain image): beside the bundle, not in it."""
    doc = {"executor": executor, "image": image}
    write_atomic(layout.build_info, canonical_json(doc))
