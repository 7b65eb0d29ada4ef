"""A Hugging Face model's config.json: the one reader of what hexbundle takes from it.

What an export's graphs cannot say (RoPE theta and scaling, the RMSNorm epsilon, whether the LM
head is tied, the family's name) comes from the model's own config.json, given as
`--model-config` to `doit import_export` and `doit check_bundle`. Both the old layout
(`rope_theta`, `rope_scaling`) and transformers >= 4.56's (`rope_parameters`) are read.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hexbundle.support.errors import InputError

# config.json's model_type -> hexbundle's family (config.model.FAMILIES). Falcon 3 is a Llama
# (its config.json says "llama"); Mistral's decoder is Llama's without RoPE scaling.
FAMILY_OF_MODEL_TYPE = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama",
                        "mistral": "llama"}
# config.json's llama3 rope_scaling keys, as config.model.RopeScaling names its fields
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings")


@dataclass(frozen=True)
class HfConfig:
    path: Path
    model_type: Optional[str]
    raw: dict
    wrapper: Optional[str] = None   # the outer model_type of a multimodal config (text_config)
    architectures: tuple = ()       # config.json's architectures, as given at its top level

    def get(self, key: str, default=None):
        return self.raw.get(key, default)

    @property
    def family(self) -> Optional[str]:
        return FAMILY_OF_MODEL_TYPE.get(self.model_type or "")

    @property
    def head_dim(self) -> Optional[int]:
        heads, hidden = self.raw.get("num_attention_heads"), self.raw.get("hidden_size")
        return self.raw.get("head_dim") or (hidden // heads if heads and hidden else None)

    @property
    def rope_parameters(self) -> dict:
        params = self.raw.get("rope_parameters")
        return params if isinstance(params, dict) else {}

    @property
    def rope_theta(self) -> Optional[float]:
        theta = self.raw.get("rope_theta", self.rope_parameters.get("rope_theta"))
        return float(theta) if isinstance(theta, (int, float)) else None

    @property
    def rope_scaling(self) -> Optional[dict]:
        """The scaling as config.json states it (None: plain RoPE)."""
        scaling = self.raw.get("rope_scaling") or self.rope_parameters or None
        if not isinstance(scaling, dict):
            return None
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        return None if kind in (None, "default") else {**scaling, "rope_type": kind}


def read_hf_config(path: Path) -> HfConfig:
    path = Path(path).expanduser()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; give the model's config.json (from its Hugging "
                         "Face repository)") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not a readable JSON config ({exc}); give the model's "
                         "config.json") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a JSON {type(raw).__name__}, not a model config object")
    outer = raw.get("model_type") if isinstance(raw.get("model_type"), str) else None
    archs = raw.get("architectures")
    archs = tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ()
    wrapper = None
    text_config = raw.get("text_config")   # a multimodal config nests the language model's
    if isinstance(text_config, dict) and "num_attention_heads" not in raw:
        raw, wrapper = text_config, outer or "?"
    model_type = raw.get("model_type")
    return HfConfig(path, model_type if isinstance(model_type, str) else None, raw, wrapper,
                    archs)
