"""Make tests/data/rope/hf_rope.npz and hf_rope.json: Hugging Face transformers' own rotary
embeddings (inv_freq, cos, sin) for a few real model configurations, so hexbundle's RoPE tables
(runtime.conventions.rope_inv_freq / rope_inputs, Llama 3's "llama3" scaling included) can be
checked against an independent implementation in CI, where torch and transformers are not
installed. See README.md beside this file.

Run with the venv described in README.md (torch 2.13.0 CPU, transformers 5.25.0):

    /work/venvs/hf/bin/python tests/data/rope/make_hf_rope.py

The output is byte-reproducible: the .npz is written with fixed zip timestamps, uncompressed.
"""

import hashlib
import inspect
import io
import json
import os
import platform
import sys
import textwrap
import zipfile

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, MistralConfig, Qwen2Config
from transformers import modeling_rope_utils
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.mistral.modeling_mistral import MistralRotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

HERE = os.path.dirname(os.path.abspath(__file__))
NPZ = os.path.join(HERE, "hf_rope.npz")
JSON = os.path.join(HERE, "hf_rope.json")

POSITIONS = [0, 1, 2, 3, 100, 1000, 4095, 8191, 8192, 16000, 131071]

# Llama 3.1/3.2's config.json "rope_scaling" (the factor varies).
def llama3_scaling(factor):
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


# name: (config class, rotary class, config kwargs besides the RoPE ones, rope_theta, rope_scaling)
# hidden_size / num_attention_heads / head_dim as in each model's config.json (only head_dim
# matters here). max_position_embeddings changes nothing for "default" and "llama3" RoPE (only
# dynamic types read it); 131072 for Llama 3.x keeps HF's llama3 validation quiet (it wants
# original_max_position_embeddings < max_position_embeddings).
CASES = {
    "llama3_2_3b": (LlamaConfig, LlamaRotaryEmbedding,
                    dict(hidden_size=3072, num_attention_heads=24, head_dim=128,
                         max_position_embeddings=131072), 500000.0, llama3_scaling(32.0)),
    "llama3_2_1b": (LlamaConfig, LlamaRotaryEmbedding,
                    dict(hidden_size=2048, num_attention_heads=32, head_dim=64,
                         max_position_embeddings=131072), 500000.0, llama3_scaling(32.0)),
    "llama3_1_8b": (LlamaConfig, LlamaRotaryEmbedding,
                    dict(hidden_size=4096, num_attention_heads=32, head_dim=128,
                         max_position_embeddings=131072), 500000.0, llama3_scaling(8.0)),
    # configs/models/llama3-tiny.toml
    "tiny_llama3": (LlamaConfig, LlamaRotaryEmbedding,
                    dict(hidden_size=128, num_attention_heads=4, head_dim=32,
                         max_position_embeddings=131072), 500000.0, llama3_scaling(32.0)),
    # Qwen2Config has no head_dim field: head_dim = hidden_size // num_attention_heads = 128
    "qwen2_5_7b": (Qwen2Config, Qwen2RotaryEmbedding,
                   dict(hidden_size=3584, num_attention_heads=28, max_position_embeddings=32768),
                   1000000.0, None),
    "mistral_7b_v0_3": (MistralConfig, MistralRotaryEmbedding,
                        dict(hidden_size=4096, num_attention_heads=32, head_dim=128,
                             max_position_embeddings=32768), 1000000.0, None),
    # Falcon3 is Llama-architecture (model_type "llama" in its config.json)
    "falcon3_7b": (LlamaConfig, LlamaRotaryEmbedding,
                   dict(hidden_size=3072, num_attention_heads=12, head_dim=256,
                        max_position_embeddings=32768), 1000042.0, None),
}


def make_config(config_cls, kwargs, theta, scaling):
    """The config as transformers 5 spells it: RoPE settings in `rope_parameters`."""
    rope = {"rope_type": "default", "rope_theta": theta}
    if scaling is not None:
        rope = dict(scaling, rope_theta=theta)
    return config_cls(**kwargs, rope_parameters=rope)


def make_legacy_config(config_cls, kwargs, theta, scaling):
    """The config as a Hub config.json spells it (rope_theta, rope_scaling), converted by
    transformers itself: it must give the same rope_parameters."""
    extra = {"rope_theta": theta}
    if scaling is not None:
        extra["rope_scaling"] = dict(scaling)
    return config_cls(**kwargs, **extra)


def float64_variant(fn, count):
    """HF offers no float64 path: its inv_freq functions cast with an explicit `dtype=torch.float`
    (float32), which torch.set_default_dtype does not change. This re-executes the installed
    function's own source with only that token changed to torch.float64 (asserting how many were
    replaced), in its own module's namespace: the same formula, evaluated in float64."""
    source = textwrap.dedent(inspect.getsource(fn))
    assert source.count("dtype=torch.float)") == count, (fn, source)
    source = source.replace("dtype=torch.float)", "dtype=torch.float64)")
    lines = source.splitlines(keepends=True)
    while lines[0].lstrip().startswith("@"):   # drop @staticmethod
        lines.pop(0)
    namespace = dict(sys.modules[fn.__module__].__dict__)
    exec(compile("".join(lines), f"<float64 {fn.__qualname__}>", "exec"), namespace)
    return namespace[fn.__name__]


def source_location(fn):
    fn = inspect.unwrap(fn)   # forward is wrapped by @dynamic_rope_update
    lines, start = inspect.getsourcelines(fn)
    path = os.path.relpath(inspect.getsourcefile(fn), os.path.dirname(transformers.__file__))
    return {"file": "transformers/" + path, "lines": [start, start + len(lines) - 1],
            "sha256": hashlib.sha256("".join(lines).encode()).hexdigest()}


def half(table, head_dim, what):
    """HF's cos/sin are cat((freqs, freqs)): keep the first half, after checking the two halves
    are bit-identical."""
    table = table.detach().numpy()
    assert table.shape == (1, len(POSITIONS), head_dim), (what, table.shape)
    first, second = table[0, :, :head_dim // 2], table[0, :, head_dim // 2:]
    assert np.array_equal(first, second), f"{what}: the two halves differ"
    return np.ascontiguousarray(first)


def write_npz(path, arrays):
    """np.savez stamps each member with the current time; this writes the same format with
    fixed timestamps, uncompressed, in a fixed order, so the file is byte-reproducible."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, array in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())
    with open(path, "wb") as f:
        f.write(out.getvalue())


def main():
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    positions = np.array(POSITIONS, dtype=np.int64)
    arrays = {"positions": positions}
    cases = {}
    llama3_f64 = float64_variant(modeling_rope_utils._compute_llama3_parameters, 1)

    for name, (config_cls, rotary_cls, kwargs, theta, scaling) in CASES.items():
        config = make_config(config_cls, kwargs, theta, scaling)
        legacy = make_legacy_config(config_cls, kwargs, theta, scaling)
        assert dict(config.rope_parameters) == dict(legacy.rope_parameters), (
            name, config.rope_parameters, legacy.rope_parameters)

        rotary = rotary_cls(config=config)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        inv_freq = rotary.inv_freq.detach().numpy().copy()
        assert inv_freq.shape == (head_dim // 2,), (name, inv_freq.shape)
        assert rotary.attention_scaling == 1.0, (name, rotary.attention_scaling)
        assert np.array_equal(rotary_cls(config=legacy).inv_freq.numpy(), inv_freq), name

        # The inv_freq function the rotary class used (and its float64 variant).
        rope_type = config.rope_parameters["rope_type"]
        if rope_type == "default":
            init_fn = rotary_cls.compute_default_rope_parameters
            f64_fn = float64_variant(init_fn, 1)
        else:
            init_fn = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]
            assert init_fn is modeling_rope_utils._compute_llama3_parameters, rope_type
            f64_fn = llama3_f64
        again, scaling_again = init_fn(config)
        assert np.array_equal(again.numpy(), inv_freq) and scaling_again == rotary.attention_scaling
        inv_freq64, scaling64 = f64_fn(config)
        assert inv_freq64.dtype == torch.float64 and scaling64 == rotary.attention_scaling
        inv_freq64 = inv_freq64.numpy().copy()
        assert np.array_equal(inv_freq64.astype(np.float32), inv_freq) or \
            np.allclose(inv_freq64, inv_freq, rtol=1e-6, atol=0), name

        # What the model's attention gets: forward(x, position_ids), x float32 as in a float32 model.
        x = torch.zeros(1, len(POSITIONS), head_dim, dtype=torch.float32)
        with torch.no_grad():
            cos, sin = rotary(x, torch.tensor(positions)[None, :])
        assert cos.dtype == sin.dtype == torch.float32
        arrays[f"{name}.inv_freq"] = inv_freq
        arrays[f"{name}.inv_freq_f64"] = inv_freq64
        arrays[f"{name}.cos"] = half(cos, head_dim, f"{name}.cos")
        arrays[f"{name}.sin"] = half(sin, head_dim, f"{name}.sin")

        cases[name] = {
            "config_class": f"transformers.{config_cls.__name__}",
            "rotary_class": f"{rotary_cls.__module__}.{rotary_cls.__name__}",
            "inv_freq_function": f"{init_fn.__module__}.{init_fn.__qualname__}",
            "hidden_size": config.hidden_size,
            "num_attention_heads": config.num_attention_heads,
            "head_dim": head_dim,
            "max_position_embeddings": config.max_position_embeddings,
            "rope_theta": theta,
            "rope_scaling": scaling,
            "rope_parameters": {k: config.rope_parameters[k] for k in sorted(config.rope_parameters)},
            "attention_scaling": float(rotary.attention_scaling),
            "inv_freq_f64_equals_inv_freq_rounded": bool(
                np.array_equal(inv_freq64.astype(np.float32), inv_freq)),
            "inv_freq_f64_max_rel_diff": float(np.max(np.abs(inv_freq.astype(np.float64) - inv_freq64)
                                                      / inv_freq64)),
        }

    meta = {
        "about": "Hugging Face transformers' rotary embeddings; see README.md. Regenerate with "
                 "make_hf_rope.py.",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "numpy": np.__version__, "python": platform.python_version()},
        "positions": POSITIONS,
        "arrays": {
            "positions": "int64 (P,)",
            "<case>.inv_freq": "float32 (head_dim/2,): the rotary module's inv_freq buffer, as HF "
                               "computes it (in float32: HF has no float64 path)",
            "<case>.inv_freq_f64": "float64 (head_dim/2,): the same HF function's installed source "
                                   "re-executed with its one `dtype=torch.float` changed to "
                                   "torch.float64 (NOT an HF-offered path; see README.md)",
            "<case>.cos": "float32 (P, head_dim/2): forward(x float32, positions)[0][0, :, :head_dim/2]"
                          " (the second half is bit-identical, checked)",
            "<case>.sin": "float32 (P, head_dim/2): likewise forward(...)[1]",
        },
        "dtypes": {"inv_freq": "float32", "inv_freq_f64": "float64", "cos": "float32",
                   "sin": "float32", "positions": "int64",
                   "hf_compute": "float32 throughout (inv_freq, position * inv_freq, cos/sin)"},
        "hf_sources": {
            "_compute_llama3_parameters": source_location(modeling_rope_utils._compute_llama3_parameters),
            "LlamaRotaryEmbedding.compute_default_rope_parameters":
                source_location(LlamaRotaryEmbedding.compute_default_rope_parameters),
            "LlamaRotaryEmbedding.forward": source_location(LlamaRotaryEmbedding.forward),
        },
        "cases": cases,
    }
    write_npz(NPZ, arrays)
    with open(JSON, "w") as f:
        f.write(json.dumps(meta, indent=2) + "\n")
    for path in (NPZ, JSON):
        with open(path, "rb") as f:
            print(f"{os.path.basename(path)}  {os.path.getsize(path)} bytes  "
                  f"sha256 {hashlib.sha256(f.read()).hexdigest()}")


if __name__ == "__main__":
    main()
