"""A Hugging Face model's config.json: the one reader of what hexbundle takes from it.

What an export's graphs cannot say (RoPE theta and scaling, the RMSNorm epsilon, whether the LM
head is tied, the family's name) comes from the model's own config.json, given as
`--model-config` to `doit import_export` and `doit check_bundle`. Both the old layout
(`rope_theta`, `rope_scaling`) and transformers >= 4.56's (`rope_parameters`) are read.

Every key hexbundle reads is checked here, once, for its type and shape (KEYS): a key of the
wrong shape is an error naming it and the shape expected, never dropped (a `rope_scaling` that
is a list would build the model without its scaling) nor coerced (`factor: true` is not 1.0: a
bool is no number here). Keys hexbundle does not read are left alone. `null` is taken as absent,
as transformers writes unset keys.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hexbundle.config.schema import FLOAT32_MAX, U32
from hexbundle.support.errors import InputError
from hexbundle.support.files import JSON_CONFIG_MAX_BYTES, named
from hexbundle.support.jsondoc import read_json

# config.json's model_type -> hexbundle's family (config.model.FAMILIES). Falcon 3 is a Llama
# (its config.json says "llama"); Mistral's decoder is Llama's without RoPE scaling.
FAMILY_OF_MODEL_TYPE = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama",
                        "mistral": "llama"}
# config.json's llama3 rope_scaling keys, as config.model.RopeScaling names its fields
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings")
# The RoPE types transformers computes (modeling_rope_utils.ROPE_INIT_FUNCTIONS); hexbundle builds
# "default" and "llama3" (inputs/import_export.py refuses the others by name)
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")


# ------------------------------------------------------------------------- the keys' shapes

# The ranges (config.schema's): a count, a token id is a 32-bit integer where it lands (Genie,
# the graphs' shapes); a number a float the backend holds in 32 bits. 1e30 layers is no model.
def _count(value) -> bool:
    return type(value) is int and 0 < value <= U32   # bool is an int subclass: `true` is no count


def _number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and 0 < value <= FLOAT32_MAX


def _token_id(value) -> bool:
    return type(value) is int and 0 <= value <= U32


def _token_ids(value) -> bool:
    return _token_id(value) or (isinstance(value, list) and bool(value)
                                and all(_token_id(v) for v in value))


COUNT = (_count, f"a positive integer (at most {U32})")
NUMBER = (_number, f"a positive finite number up to {FLOAT32_MAX:g} (not true/false, not a "
                   "string)")
# key -> (test, the shape a message asks for); a scaling block's keys: SCALING_KEYS
KEYS = {
    "model_type": (lambda v: isinstance(v, str), 'a string such as "llama"'),
    "vocab_size": COUNT, "hidden_size": COUNT, "num_attention_heads": COUNT,
    "num_key_value_heads": COUNT, "num_hidden_layers": COUNT, "intermediate_size": COUNT,
    "head_dim": COUNT, "max_position_embeddings": COUNT,
    "rope_theta": NUMBER, "rms_norm_eps": NUMBER,
    "tie_word_embeddings": (lambda v: isinstance(v, bool), "true or false"),
    "bos_token_id": (_token_id, "a token id (an integer in [0, 2**32))"),
    "pad_token_id": (_token_id, "a token id (an integer in [0, 2**32))"),
    "eos_token_id": (_token_ids, "a token id (an integer in [0, 2**32)) or a non-empty list of "
                                 "them"),
    "rope_scaling": (lambda v: isinstance(v, dict),
                     'an object such as {"rope_type": "llama3", "factor": 32.0, ...}'),
    "rope_parameters": (lambda v: isinstance(v, dict),
                        'an object such as {"rope_type": "default", "rope_theta": 10000.0}'),
}
SCALING_KEYS = {"factor": NUMBER, "low_freq_factor": NUMBER, "high_freq_factor": NUMBER,
                "original_max_position_embeddings": COUNT, "rope_theta": NUMBER,
                "rope_type": (lambda v: v in ROPE_TYPES, "one of " + ", ".join(ROPE_TYPES)),
                "type": (lambda v: v in ROPE_TYPES, "one of " + ", ".join(ROPE_TYPES))}


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def config_problems(raw: dict) -> list:
    """Each known key of the wrong type or shape: 'key is VALUE, expected SHAPE'."""
    problems = []
    for key, (test, shape) in KEYS.items():
        value = raw.get(key)
        if value is not None and not test(value):
            problems.append(f"{key} is {_shown(value)}, expected {shape}")
    for block in ("rope_scaling", "rope_parameters"):
        value = raw.get(block)
        if isinstance(value, dict):
            for key, (test, shape) in SCALING_KEYS.items():
                if value.get(key) is not None and not test(value[key]):
                    problems.append(f"{block}.{key} is {_shown(value[key])}, expected {shape}")
    return problems


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


def read_hf_config(path: Path, argument: str = "--model-config") -> HfConfig:
    """The model's config.json, every key hexbundle reads of its shape (InputError naming the
    argument, the file and each bad key otherwise)."""
    path = Path(path).expanduser()
    shown = named(path, argument)
    # within support.jsondoc's bounds (depth, number ranges, size): JsonDocError names the key
    raw = read_json(path, "model's config.json", JSON_CONFIG_MAX_BYTES,
                    "fix config.json, or give the one the model was made from: "
                    "--model-config PATH/config.json", argument)
    if not isinstance(raw, dict):
        raise InputError(f"{shown}: a JSON {type(raw).__name__}, not a model config object; "
                         "give the model's config.json")
    outer = raw.get("model_type") if isinstance(raw.get("model_type"), str) else None
    archs = raw.get("architectures")
    archs = tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ()
    wrapper = None
    text_config = raw.get("text_config")   # a multimodal config nests the language model's
    if isinstance(text_config, dict) and "num_attention_heads" not in raw:
        raw, wrapper = text_config, outer or "?"
    problems = config_problems(raw)
    if problems:
        raise InputError(f"{shown}: " + "; ".join(problems) + ": fix config.json (the model's "
                         "own, from its Hugging Face repository), or give the one the model "
                         "was made from: --model-config PATH/config.json")
    model_type = raw.get("model_type")
    return HfConfig(path, model_type if isinstance(model_type, str) else None, raw, wrapper,
                    archs)


def context_problems(hf: HfConfig, context_lengths) -> list:
    """A context length past config.json's max_position_embeddings: the model was never
    trained (nor its RoPE scaled) for positions that far, so its output there is noise."""
    most = hf.get("max_position_embeddings")
    longest = max(context_lengths, default=0)
    if not isinstance(most, int) or longest <= most:
        return []
    return [f"{hf.path}: max_position_embeddings is {most}, but the context length is "
            f"{longest}: the model knows no position past {most - 1}; use a context length of "
            f"at most {most} (or the config.json of this model)"]


def check_context(hf: HfConfig, context_lengths) -> None:
    """InputError if a context length is past the model's positions (context_problems)."""
    problems = context_problems(hf, context_lengths)
    if problems:
        raise InputError("; ".join(problems))
