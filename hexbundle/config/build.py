"""TOML configs, validated on load.

An unknown key, a wrong type or an out-of-range value is an error naming the file, the key and
what is allowed -- the opposite of the QAIRT CLI, which logs "Unknown Key" and carries on.

Files (under <project>/configs):
  build.toml            what `doit bundle` builds by default (model, device, backend, executor)
  models/<name>.toml    a model: architecture, graphs, quantization, tokenizer, inputs, plans
  devices.toml          Qualcomm's chipsets (generated), boards/<name>.toml: boards on them;
                        config.devices resolves `device=` (the one source for compile and runtime)
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hexbundle.config.devices import Device, Devices
from hexbundle.config.layout import DEVICE_NAME, MAX_NAME, NAME, ProjectLayout, check_name
from hexbundle.config.model import (FAMILIES, ROPE_SCALING_TYPES, Architecture, Graph, Model,
                                    Part, Plan, Quantization, RopeScaling,
                                    pipeline_order_problem)
from hexbundle.config.remote import check_remote_settings
from hexbundle.config.runtime_files import RUNTIME_MODES
from hexbundle.config.schema import (FLOAT32_MAX, I64, NO_CONTROL, U32, U64, Field,
                                     check_value, read_toml, retire, run_settings, section_type,
                                     to_section, validate)
from hexbundle.support.errors import ConfigError, UnknownNameError

BACKENDS = ("reference", "qairt", "ortqnn")
# genie_config.json's max-num-tokens as Qualcomm's generator writes it (qai-hub-models 0.65.0,
# models/templates/llm/llm_helpers.py DEFAULT_MAX_NUM_TOKENS).
QUALCOMM_MAX_NUM_TOKENS = 2048
EXECUTORS = ("local", "docker")


# ---------------------------------------------------------------------------------------------
# Schemas

PIN = r"sha256:[0-9a-f]{64}|xxh3_128:[0-9a-f]{32}"

COMPILE_SCHEMA = {
    "weights_packing": Field(bool, True, doc="pack two 4-bit weights per byte"),
    "weight_sharing": Field(bool, True, doc="prompt and token graphs share one copy of weights"),
    "optimization_type": Field(int, 3, min=1, max=3, doc="HTP graph optimization level (JSON 'O')"),
    "float_bitwidth": Field(int, 16, choices=(16, 32),
                            doc="float fallback width at convert (qairt.convert float_precision)"),
    # The options Qualcomm's own LLM compile (qai-hub-models) adds, by the names hexbundle passes
    # to qairt.convert. truncate_64bit_io is on: the exports' input_ids are int64, which HTP
    # does not take. quantize_io / quantize_full_type are off: the seeds' local compile came
    # within 0.2% of the cloud's without them, and the encodings already cover the weights.
    "truncate_64bit_io": Field(bool, True, doc="int64 graph inputs/outputs as int32 "
                               "(qai-hub-models --truncate_64bit_io; input_ids are int64)"),
    "quantize_io": Field(bool, False, doc="quantized graph I/O (qai-hub-models --quantize_io); "
                         "off: within 0.2% of the cloud compile without it"),
    "quantize_full_type": Field(str, "", choices=("", "w8a16", "w8a8", "w4a16", "float"),
                                doc="quantize what has no encoding to this type (qai-hub-models "
                                "--quantize_full_type w8a16); empty: not passed (within 0.2% of "
                                "the cloud compile without it)"),
}


SIZE = r"[0-9]+[kmgKMG]?"   # bytes, or with a unit: 512m, 32g (as docker spells them)
UID_GID = r"[0-9]+:[0-9]+"
MIN_STEP_MEMORY = 64 << 20   # a step is a Python process with numpy and onnx loaded
# The step containers of executor = "docker" (hexbundle/steps/docker_executor.py). They bound
# where and how a step runs, never what it writes, so they are in no up-to-date key.
CONTAINER_SCHEMA = run_settings({
    "pids_limit": Field(int, 4096, min=64, max=1 << 22,
                        doc="processes and threads a step may have at once (threads count: "
                            "thread pools of numpy and the SDK); stops a runaway fork"),
    "memory": Field(str, "32g", pattern=SIZE,
                    doc="memory a step may use (its /tmp included), e.g. 32g: a QAIRT convert of "
                        "a Qwen2.5-7B part holds ~6 GB of float32 weights several times over"),
    "cpus": Field(float, 0.0, min=0, max=4096,
                  doc="CPUs a step may use, fractions allowed (1.5); 0: no cap, the whole machine"),
    "tmp_size": Field(str, "256m", pattern=SIZE,
                      doc="size of the step's /tmp (a noexec tmpfs, counted in its memory); the "
                          "steps' scratch space is on the build disk, /tmp only holds HOME"),
    "user": Field(str, "65534:65534", pattern=UID_GID,
                  doc="uid:gid the steps run as when hexbundle runs as root (never 0); as any "
                      "other user, steps run as that user"),
})

# A REAPI remote cache (hexbundle.remote): top-level keys of build.toml, each overridable by the
# environment (HEXBUNDLE_REMOTE_CACHE, ...) and, above that, the command line. None of them
# changes what a step writes, so none is part of any up-to-date key.
REMOTE_SCHEMA = run_settings({
    "remote_cache": Field(str, "", pattern=r"(grpcs?://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5})?",
                          doc="a REAPI cache, grpc://HOST:PORT (grpcs:// for TLS); empty: none",
                          example="grpc://127.0.0.1:9"),
    "remote_instance": Field(str, "", pattern=r"[A-Za-z0-9._/-]*",
                             doc="the server's instance name (empty: its default instance)"),
    "remote_cache_mode": Field(str, "read-write", choices=("read", "read-write"),
                               doc="read: fetch hits, never upload; read-write: also upload"),
    "remote_tls_ca": Field(str, "", doc="grpcs://: PEM file of the CA of the server's "
                           "certificate, relative to the project (empty: the system's roots)"),
    "remote_tls_cert": Field(str, "", doc="grpcs://: PEM client certificate (mutual TLS)"),
    "remote_tls_key": Field(str, "", doc="grpcs://: PEM key of remote_tls_cert"),
    "remote_header": Field(str, "", pattern=r"([A-Za-z0-9-]+=.*)?",
                           doc="NAME=VALUE sent with every call (auth); VALUE $VAR reads the "
                               "environment variable VAR, keeping the secret out of files",
                           example="x-hexbundle-test=1"),
    "remote_timeout": Field(int, 60, min=1, max=3600, doc="seconds per call to the server"),
    "remote_executor": Field(str, "", pattern=r"(grpcs?://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5})?",
                             doc="a REAPI Execution server that runs the steps, grpc://HOST:PORT "
                                 "(grpcs:// for TLS; instance, TLS and header as the cache's); "
                                 "empty: steps run here",
                             example="grpc://127.0.0.1:9"),
    "remote_python": Field(str, "", pattern=r"(/.*)?",
                           doc="the interpreter a remote worker runs a step with: an absolute "
                               "path on the workers, to a Python with hexbundle's requirements "
                               "(a venv's bin/python3 finds its own packages); empty: this "
                               "process's interpreter's path (a worker on this machine, or with "
                               "the same layout), or with executor = docker the toolchain "
                               "image's python3.10. Part of each remote Action's Command",
                           example="/usr/bin/python3"),
    "remote_fallback": Field(str, "local", choices=("local", "fail"),
                             doc="when remote execution fails: local: build the step here; "
                                 "fail: the build fails"),
    "remote_exec_timeout": Field(int, 3600, min=1, max=7 * 86400,
                                 doc="seconds a step may take on the Execution server, queued "
                                     "and running, before it is cancelled"),
    "remote_cache_trust": Field(str, "trusted", choices=("trusted", "verify"),
                                doc="what a fetched output that cannot record its key is given: "
                                    "trusted: the backend's checks; verify: the exact checks "
                                    "against the inputs, and what they cannot read is built "
                                    "here (docs/remote-cache.md)"),
})
REMOTE_ENV_PREFIX = "HEXBUNDLE_"   # remote_cache -> HEXBUNDLE_REMOTE_CACHE, and so on

BUILD_SCHEMA = {
    "model": Field(str, pattern=NAME, doc="a file in configs/models, without .toml"),
    "device": Field(str, pattern=DEVICE_NAME,
                    doc="a board (configs/boards) or chipset (configs/devices.toml), by name or "
                        "alias, any case"),
    "backend": Field(str, "reference", choices=BACKENDS),
    "executor": Field(str, "local", choices=EXECUTORS),
    "plan": Field(str, "", pattern=f"({NAME})?",
                  doc="a plan of the model; empty for the model's default_plan"),
    "runtime": Field(str, "bundled", choices=RUNTIME_MODES,
                     doc="qairt: the SDK's runtime goes into the bundle (bundled), or the board "
                         "has the SDK installed (board: the bundle names the version it needs)"),
    "compile": Field(COMPILE_SCHEMA, {}),
    "container": Field(CONTAINER_SCHEMA, {}),
    **REMOTE_SCHEMA,
}
# Tables whose keys the command line sets as `table.key=value` ([compile] keys also bare).
SECTIONS = {"compile": COMPILE_SCHEMA, "container": CONTAINER_SCHEMA}

PLAN_SCHEMA = {
    "layers_per_part": Field(list, item=int, min=0, max=512,
                             doc="decoder layers per part; part 1 is the embedding (0 layers)"),
    "expected_total_mib": Field(float, 0.0, min=0, max=U64 / (1 << 20),
                                doc="measured total of a known-good build"),
    "expected_part_mib": Field(list, [], item=float, min=0, max=U64 / (1 << 20),
                               doc="measured size of each part"),
    "tolerance_pct": Field(float, 2.0, min=0.01, max=50),
    "known_to_fail_on": Field(list, [], item=str, doc="devices this plan fails to load on"),
    "failure_note": Field(str, ""),
}

# `doit verify`: how long a sequence to run, and how the bundle is judged against the export
# (docs/verify.md). What the build writes exactly (weights, encodings, topology) is compared
# exactly; the numbers are judged relative to what the run measures itself -- the difference
# between two correct references (half-to-even and AIMET's rounding), the reference's own
# token-vs-prompt -- never against a constant tuned on one export. The factors below are
# multiples of those, measured on exports and checkpoints they were not set on (docs/verify.md).
VERIFY_SCHEMA = {
    "prompt_tokens": Field(int, 160, min=1, max=1 << 20,
                           doc="prefilled through the prompt graphs, in chunks"),
    "decode_steps": Field(int, 32, min=0, max=1 << 20,
                          doc="then decoded one by one through the token graphs"),
    "seed": Field(int, 0, min=0, max=U64,
                  doc="the order of the ordinary-text sentences whose token ids (the bundle's "
                      "tokenizer) are fed to both sides"),
    # 8: measured (docs/verify.md): largest errors are heavy-tailed, and on 7 exports x 4 seeds
    # a faithful bundle's worst part reached 3.8 x the floor (an 11-layer Llama's logits part)
    "floor_multiplier": Field(float, 8.0, min=1, max=1000, example=12.0,
                              doc="a part's largest error vs the reference, in LSBs of its "
                                  "output encoding, may be this many times the noise floor (the "
                                  "largest difference between the two correct references over "
                                  "every part, at least min_floor_lsb); a float output's "
                                  "relative difference this many times the two references' "
                                  "own (at least min_floor_lsb float32 steps)"),
    "min_floor_lsb": Field(float, 8.0, min=1, max=1e6, example=16.0,
                           doc="the noise floor's least value, in LSBs (a float output's: in "
                               "float32 steps, 2^-23 relative)"),
    "chained_max_ratio": Field(float, 20.0, min=1, max=1e6, example=40.0,
                               doc="end to end, each side chained on its own: fails only when "
                                   "the bundle's largest error and its cosine distance are both "
                                   "more than this times the two references' own"),
    "token_vs_prompt_factor": Field(float, 2.0, min=1, max=1000, example=4.0,
                                    doc="a part's token graph vs its prompt graph (output "
                                        "and KV entry, in LSBs of their encodings): the "
                                        "bundle's largest difference at most this times the "
                                        "reference's own, or the two references' difference "
                                        "on the same entries, or min_floor_lsb"),
}
for _old in ("min_cosine_hidden", "min_cosine_logits"):
    retire(f"verify.{_old}", "verify compares the bundle with the export's quantized reference "
           "(its encodings applied, in onnxruntime), not with float: remove it; the numbers are "
           "judged against a noise floor verify measures (floor_multiplier, min_floor_lsb)")
retire("verify.min_cosine_prompt_vs_token", "token vs prompt is judged relative to the "
       "reference's own value (an 8-bit KV cache fed back makes the export's two graphs differ): "
       "remove it; token_vs_prompt_factor (default 2) sets how much worse the bundle may be")
for _old in ("min_top1_agreement", "top1_tolerance", "max_drift_margin"):
    retire(f"verify.{_old}", "the bundle's float drift and top-1 agreement with float are "
           "reported, not gated (a random or heavily quantized model agrees with float on few "
           "tokens whoever builds it, and the bundle's drift is at most the reference's plus its "
           "distance from the reference, which `chained vs reference` judges): remove it; "
           "chained_max_ratio sets how far the bundle may be from the reference")
retire("verify.min_cosine_reference", "each part is judged against the two correct "
       "references' own difference measured in the same run (LSBs of its output encoding, or "
       "the relative difference of a float output), not a constant cosine: remove it; "
       "floor_multiplier (default 8) sets how much worse the bundle may be")
retire("verify.chained_min_cosine", "end to end, the bundle's cosine distance from the "
       "reference is judged against the two references' own: remove it; chained_max_ratio "
       "(default 20) sets how much worse the bundle may be")

INPUT_SOURCES = ("generated", "export", "qai-hub-models")
SPLITS = ("export", "local")
# How a local split finds its cuts: "names", the layer names of the nodes (0.55 trees); "qaihm",
# qai-hub-models 0.65's own rule (templates/llm/split_onnx_utils: residual Adds), for a
# quantize checkpoint's model_dynamic.onnx
CUTS = ("names", "qaihm")
# One graph of an export: paths relative to inputs.dir, exactly as the export wrote them.
GRAPH_FILES_SCHEMA = {
    "onnx": Field(str),
    "data": Field(list, [], item=str, doc="the external-data files the ONNX records"),
    "encodings": Field(str),
}

MODEL_SCHEMA = {
    "model": Field({
        "name": Field(str, pattern=NAME),
        "slug": Field(str, pattern=rf"[a-z0-9_]{{1,{MAX_NAME}}}", doc="file-name stem of the bins"),
        "description": Field(str, ""),
        "default_plan": Field(str, pattern=NAME),
    }),
    "architecture": Field({
        "family": Field(str, "qwen2", choices=FAMILIES,
                        doc="qwen2: q/k/v biases; qwen3: q/k RMSNorm per head, no q/k/v "
                            "biases; llama (Llama 3.x, Mistral, Falcon 3): neither"),
        "tie_word_embeddings": Field(bool, False, doc="the LM head is the embedding matrix "
                                     "(Hugging Face config.json's key of that name)"),
        "num_layers": Field(int, min=1, max=512),
        "hidden_size": Field(int, min=8, max=65536),
        "num_attention_heads": Field(int, min=1, max=1024),
        "num_kv_heads": Field(int, min=1, max=1024),
        "head_dim": Field(int, min=2, max=1024),
        "intermediate_size": Field(int, min=8, max=1 << 20),
        "vocab_size": Field(int, min=16, max=1 << 22),
        "rope_theta": Field(float, min=1.0, max=U32,
                            doc="genie_config.json rope-theta: a 32-bit integer"),
        "rms_norm_eps": Field(float, min=0, max=1),
        # config.json's rope_scaling, as Hugging Face names it; left out: plain RoPE
        "rope_scaling": Field({
            "rope_type": Field(str, "none", choices=("none",) + ROPE_SCALING_TYPES,
                               doc="llama3: Llama 3.1/3.2's scaled frequencies"),
            "factor": Field(float, 8.0, min=1.0, max=1e6),
            "low_freq_factor": Field(float, 1.0, min=1e-6, max=1e6),
            "high_freq_factor": Field(float, 4.0, min=1e-6, max=1e6),
            "original_max_position_embeddings": Field(int, 8192, min=1, max=1 << 24),
        }, {}),
    }),
    "graphs": Field({
        "context_length": Field(int, None, min=2, max=1 << 20,
                                doc="the one context length (or give context_lengths)"),
        "context_lengths": Field(list, None, item=int, min=2, max=1 << 20,
                                 doc="several context lengths, each a prompt and a token graph "
                                     "per part in one context binary; Genie's is the largest"),
        "prompt_ar": Field(int, min=1, max=1 << 16),
        "token_ar": Field(int, 1, min=1, max=1 << 16),
    }),
    "quantization": Field({
        "decoder_linear_bitwidth": Field(int, 4, choices=(4, 8, 16)),
        "lm_head_bitwidth": Field(int, 8, choices=(4, 8, 16)),
        "embedding_bitwidth": Field(int, 16, choices=(8, 16)),
        "activation_bitwidth": Field(int, 16, choices=(8, 16)),
        "unencoded_weights": Field(str, "refuse", choices=("refuse", "int8", "float"),
                                   doc="a layer weight without an encoding: refuse the build, "
                                       "quantize it to int8 per channel (QNN's "
                                       "--quantize_full_type w8a16) or keep it float"),
    }),
    "tokenizer": Field({
        "bos": Field(str, pattern=NO_CONTROL,
                     doc="content of the BOS special token in tokenizer.json"),
        "eos": Field(str, pattern=NO_CONTROL),
        "eot": Field(str, pattern=NO_CONTROL),
    }),
    "inputs": Field({
        "source": Field(str, choices=INPUT_SOURCES,
                        doc="generated; export (a flat dir of <graph>.onnx/.data/.encodings); "
                            "qai-hub-models (an export tree, written by `doit import_export`)"),
        "seed": Field(int, 0, min=0, max=U64, doc="generated inputs: random seed"),
        "dir": Field(str, "", doc="export inputs: the export's directory"),
        "how_to_export": Field(str, "", doc="printed when an export input is missing"),
        "layout": Field(str, "", doc="qai-hub-models: the layout the import found (a note)"),
        "split": Field(str, "export", choices=SPLITS,
                       doc="qai-hub-models: use the export's parts, or split its unsplit "
                           "graphs locally (under the build root)"),
        "cut": Field(str, "names", choices=CUTS,
                     doc="qai-hub-models, split = local: cut at the nodes' layer names, or as "
                         "qai-hub-models 0.65's splitter does (a quantize checkpoint)"),
        "tokenizer": Field(str, "", doc="qai-hub-models: tokenizer.json, relative to dir"),
        "graphs": Field({"*": Field(GRAPH_FILES_SCHEMA)}, {},
                        doc="qai-hub-models, split = export: graph name -> its files"),
        "unsplit": Field({"*": Field(GRAPH_FILES_SCHEMA)}, {},
                         doc="qai-hub-models, split = local: prompt/token -> the unsplit graph"),
        "pins": Field({"*": Field(str, pattern=PIN)}, {},
                      doc="file name in the inputs dir -> 'sha256:<hex>' or 'xxh3_128:<hex>'"),
    }),
    # genie_config.json's dialog settings. Defaults: what Qualcomm's Genie bundle generator
    # writes (qai-hub-models 0.65.0 create_genie_config; tests/test_devices.py checks them
    # against its source).
    "genie": Field({
        "max_num_tokens": Field(int, None, min=1, max=U32,
                                doc="tokens generated per answer at most; default: Qualcomm's "
                                    f"{QUALCOMM_MAX_NUM_TOKENS}, capped by graphs.context_length"),
        "sampler_seed": Field(int, 42, min=0, max=U32, doc="Genie reads it as 32 bits"),
        "temp": Field(float, 0.8, min=0, max=FLOAT32_MAX),
        "top_k": Field(int, 40, min=1, max=U32),
        "top_p": Field(float, 0.95, min=0, max=1),
    }),
    "plans": Field({"*": Field(PLAN_SCHEMA)}, {}),
    "verify": Field(VERIFY_SCHEMA),
}

# ---------------------------------------------------------------------------------------------
# Loaded configs

# Each table as a frozen value read by attribute, its fields the schema's keys (config.schema
# section_type): the schema is the one list of them.
CompileSettings = section_type("CompileSettings", COMPILE_SCHEMA, __name__)
VerifySettings = section_type("VerifySettings", VERIFY_SCHEMA, __name__)
InputsSettings = section_type("InputsSettings", MODEL_SCHEMA["inputs"].type, __name__)
DialogSettings = section_type("DialogSettings", MODEL_SCHEMA["genie"].type, __name__)   # [genie]
# The remote_* keys without their prefix: cache, instance, cache_mode, tls_ca, ...
REMOTE_SETTINGS = {k.removeprefix("remote_"): f for k, f in REMOTE_SCHEMA.items()}
RemoteSettings = section_type("RemoteSettings", REMOTE_SETTINGS, __name__)


def remote_settings(**given) -> "RemoteSettings":
    """RemoteSettings from these keys (the rest defaults; none: no remote cache), validated."""
    return to_section(RemoteSettings, validate(given, REMOTE_SETTINGS, "remote settings"))


@dataclass(frozen=True)
class ContainerSettings:
    """[container], checked and in the units docker takes."""

    pids_limit: int
    memory: int          # bytes
    cpus: float          # 0: no cap
    tmp_size: int        # bytes
    user: str            # uid:gid of the steps when the host user is root


def default_container_settings() -> ContainerSettings:
    return container_settings(validate({}, CONTAINER_SCHEMA, "defaults"), lambda key: "defaults")


@dataclass(frozen=True)
class BuildConfig:
    """What one `doit` run builds: everything resolved, validated and cross-checked."""

    root: Path
    model: Model
    device: Device
    plan: Plan
    backend: str
    executor: str
    compile: CompileSettings
    tokenizer_specials: dict
    inputs: InputsSettings
    genie: DialogSettings
    config_files: tuple    # every config file read, for file_dep and the manifest
    build_root: Path       # build/ of the project, or $HEXBUNDLE_BUILD_ROOT (scratch builds)
    verify: Optional[VerifySettings] = None   # the model's [verify] (`doit verify`'s thresholds)
    export_dir: Optional[Path] = None   # inputs.dir, resolved, for an exported model
    container: ContainerSettings = field(default_factory=default_container_settings)
    remote: RemoteSettings = field(default_factory=remote_settings)   # remote_*, checked
    runtime: str = "bundled"   # the QAIRT runtime: in the bundle, or on the board

    def part(self, index: int) -> Part:
        """Part `index` (1-based) of the plan."""
        return self.plan.parts()[index - 1]

    def graph(self, part_index: int, slot: str) -> Graph:
        """The graph of part `part_index` in `slot` ("prompt", "token"; "prompt_cl512", ...
        with several context lengths: Graph.slot)."""
        return {g.slot: g for g in self.model.graphs(self.part(part_index))}[slot]



def size_bytes(text: str) -> int:
    """'256m' -> 268435456: bytes, or k/m/g (binary, as docker reads them)."""
    unit = text[-1].lower()
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(unit)
    return int(text[:-1]) * scale if scale else int(text)


def container_settings(table: dict, where) -> ContainerSettings:
    """[container] (already validated by CONTAINER_SCHEMA) checked as a whole; `where(key)` says
    where a key was given (the file or the command line) for the message."""
    memory, tmp_size = size_bytes(table["memory"]), size_bytes(table["tmp_size"])
    for key, value in (("memory", memory), ("tmp_size", tmp_size)):
        if value > I64:   # docker takes bytes as an int64
            raise ConfigError(f"{where(key)}: key 'container.{key}' is {table[key]!r}: more "
                              "bytes than docker can hold (2**63 - 1); give a size such as 32g")
    if memory < MIN_STEP_MEMORY:
        raise ConfigError(f"{where('memory')}: key 'container.memory' is {table['memory']!r}: a "
                          "step needs at least 64m (a 7B model needs many GB: the default is 32g)")
    if not 1 << 20 <= tmp_size < memory:
        raise ConfigError(f"{where('tmp_size')}: key 'container.tmp_size' is "
                          f"{table['tmp_size']!r}; expected at least 1m and less than "
                          f"container.memory ({table['memory']}): /tmp is a tmpfs, its pages count "
                          "in the step's memory")
    uid, gid = (int(n) for n in table["user"].split(":"))
    if max(uid, gid) > U32 - 1:   # uid_t is 32 bits, and 2**32 - 1 is (uid_t) -1: "no change"
        raise ConfigError(f"{where('user')}: key 'container.user' is {table['user']!r}: a uid "
                          f"and gid are at most {U32 - 1}")
    if uid == 0 or gid == 0:
        raise ConfigError(f"{where('user')}: key 'container.user' is {table['user']!r}: steps "
                          "never run as root (uid or gid 0); give an unprivileged uid:gid, e.g. "
                          "65534:65534 (nobody:nogroup)")
    return ContainerSettings(table["pids_limit"], memory, table["cpus"], tmp_size, table["user"])


def resolve_inside(root: Path, value: str, where: Path, key: str) -> Path:
    """A path from a config, relative to the project root; it must stay inside the project."""
    if not value:
        raise ConfigError(f"{where}: key '{key}' is empty; give a directory relative to {root}")
    path = (root / value).resolve()
    if root.resolve() not in (path, *path.parents):
        raise ConfigError(f"{where}: key '{key}' = {value!r} points outside the project "
                          f"({root}); put the files under it (a symlink to elsewhere is refused)")
    return path


def check_export_dir(root: Path, value: str, where: Path, build_root: Path) -> Path:
    """inputs.dir is checked when the config loads, not when a task first needs it (that would
    surface as a traceback from dodo.py): inside the project, and not under the build root,
    which holds outputs only (`doit clean` and the clean-up after a killed run act there)."""
    path = resolve_inside(root, value, where, "inputs.dir")
    if build_root in (path, *path.parents):
        raise ConfigError(f"{where}: key 'inputs.dir' = {value!r} is inside the build directory "
                          f"{build_root}, which holds outputs only; keep the export elsewhere "
                          "in the project (e.g. exports/<model>)")
    return path


def check_tree_dir(root: Path, value: str, where: Path, build_root: Path) -> Path:
    """A qai-hub-models export is used in place, wherever it is (read-only; the docker executor
    mounts it read-only), but never inside the build root, which holds outputs only."""
    if not value:
        raise ConfigError(f"{where}: inputs.source is 'qai-hub-models' but inputs.dir is empty; "
                          "run `doit import_export --dir PATH --name NAME` to write this config")
    path = (root / value).resolve()
    if build_root in (path, *path.parents):
        raise ConfigError(f"{where}: key 'inputs.dir' = {value!r} is inside the build directory "
                          f"{build_root}, which holds outputs only; keep the export elsewhere")
    if not path.is_dir():
        raise ConfigError(f"{where}: key 'inputs.dir' = {value!r}: {path} is not a directory; "
                          "mount or copy the export there, or re-run `doit import_export`")
    return path


def check_tree_covers_plan(model: Model, plan: Plan, inputs: dict, where: Path) -> None:
    """The export's own parts serve only the plan they were split for; any other plan needs the
    local split of the unsplit graphs."""
    if inputs["split"] == "local":
        missing = [g.slot for g in model.graphs(plan.parts()[0])
                   if g.slot not in inputs["unsplit"]]
        if missing:
            raise ConfigError(f"{where}: inputs.split is 'local' but [inputs.unsplit.{missing[0]}]"
                              " is missing; re-run `doit import_export`")
        return
    for part in plan.parts():
        for graph in model.graphs(part):
            if graph.name not in inputs["graphs"]:
                raise ConfigError(
                    f"{where}: plan {plan.name!r} needs graph {graph.name!r}, which is not among "
                    f"the export's parts ([inputs.graphs]); the export was split for plan "
                    f"{model.default_plan!r}. Build that plan, or re-run `doit import_export` "
                    "with --plan and an export that has the unsplit graphs (split locally)")


def load_model(root: Path, name: str) -> tuple:
    """Return (Model, raw sections) for configs/models/<name>.toml."""
    project = ProjectLayout(root)
    path = project.model_config(name)
    if not path.is_file():
        known = sorted(p.stem for p in project.models_dir.glob("*.toml"))
        raise UnknownNameError(f"unknown model {name!r}{did_you_mean(name, known)}: no {path}; "
                               f"known: {', '.join(known)}", key="model", name=name)
    d = read_toml(path, MODEL_SCHEMA)
    m, a, g, q = d["model"], d["architecture"], d["graphs"], d["quantization"]
    where = str(path)
    if m["name"] != name:
        raise ConfigError(f"{where}: key 'model.name' is {m['name']!r}; it must equal the file "
                          f"name {name!r}")
    if a["num_attention_heads"] % a["num_kv_heads"]:
        raise ConfigError(f"{where}: architecture.num_attention_heads ({a['num_attention_heads']})"
                          f" must be a multiple of num_kv_heads ({a['num_kv_heads']})")
    if a["head_dim"] % 2:
        raise ConfigError(f"{where}: architecture.head_dim must be even (RoPE rotates pairs)")
    if not float(a["rope_theta"]).is_integer():
        raise ConfigError(f"{where}: architecture.rope_theta is {a['rope_theta']!r}; Genie takes "
                          "a whole number (genie_config.json QnnHtp rope-theta is an integer in "
                          "Qualcomm's schema): use the model's integer theta")
    scaling = rope_scaling(a["rope_scaling"], where)
    lengths = context_lengths(g, where)
    if g["prompt_ar"] >= lengths[0] or g["token_ar"] >= lengths[0]:
        raise ConfigError(f"{where}: graphs.prompt_ar and token_ar must be < every context "
                          f"length (the smallest is {lengths[0]})")
    arch = Architecture(a["num_layers"], a["hidden_size"], a["num_attention_heads"],
                        a["num_kv_heads"], a["head_dim"], a["intermediate_size"],
                        a["vocab_size"], a["rope_theta"], a["rms_norm_eps"],
                        a["tie_word_embeddings"], a["family"], scaling)
    quant = Quantization(q["decoder_linear_bitwidth"], q["lm_head_bitwidth"],
                         q["embedding_bitwidth"], q["activation_bitwidth"],
                         unencoded_weights=q["unencoded_weights"])
    plans = {pname: make_plan(where, pname, p, arch) for pname, p in d["plans"].items()}
    if m["default_plan"] not in plans:
        raise ConfigError(f"{where}: model.default_plan {m['default_plan']!r} is not one of the "
                          f"[plans.*] tables: {', '.join(sorted(plans)) or 'none'}")
    model = Model(m["name"], m["slug"], arch, quant, lengths, g["prompt_ar"],
                  g["token_ar"], plans, m["default_plan"])
    v = d["verify"]
    if v["prompt_tokens"] + v["decode_steps"] > lengths[0]:   # verify runs at every length
        limit = f"graphs.context_length {lengths[0]}" if len(lengths) == 1 else \
            f"the smallest of graphs.context_lengths, {lengths[0]} (verify runs at every length)"
        raise ConfigError(f"{where}: verify.prompt_tokens + verify.decode_steps = "
                          f"{v['prompt_tokens'] + v['decode_steps']} exceeds {limit}; lower them")
    if d["inputs"]["source"] != "generated" and not d["inputs"]["dir"]:
        raise ConfigError(f"{where}: inputs.source is {d['inputs']['source']!r} but inputs.dir is "
                          "empty")
    return model, d


def rope_scaling(r: dict, where: str) -> Optional[RopeScaling]:
    """[architecture.rope_scaling] as a RopeScaling, or None for plain RoPE."""
    if r["rope_type"] == "none":
        return None
    if not r["high_freq_factor"] > r["low_freq_factor"]:
        raise ConfigError(f"{where}: architecture.rope_scaling.high_freq_factor "
                          f"({r['high_freq_factor']}) must be greater than low_freq_factor "
                          f"({r['low_freq_factor']}): llama3 scaling blends between the two; "
                          "copy both from the model's config.json")
    return RopeScaling(r["rope_type"], r["factor"], r["low_freq_factor"], r["high_freq_factor"],
                       r["original_max_position_embeddings"])


def context_lengths(g: dict, where: str) -> tuple:
    """[graphs] context_length = N or context_lengths = [N, M, ...] (exactly one of them): the
    lengths ascending, each once."""
    one, several = g["context_length"], g["context_lengths"]
    if (one is None) == (several is None):
        raise ConfigError(f"{where}: give exactly one of graphs.context_length (one length) and "
                          "graphs.context_lengths (a list)")
    if several is None:
        return (one,)
    if not several:
        raise ConfigError(f"{where}: graphs.context_lengths is empty; list at least one length")
    if len(set(several)) != len(several):
        raise ConfigError(f"{where}: graphs.context_lengths {several} names a length twice; "
                          "list each once")
    return tuple(sorted(several))


def make_plan(where: str, name: str, p: dict, arch: Architecture) -> Plan:
    check_name(name, "[plans.*] table: the plan name", where)
    layers = tuple(p["layers_per_part"])
    key = f"plans.{name}.layers_per_part"
    if len(layers) < 2:
        raise ConfigError(f"{where}: {key} needs at least 2 parts (embedding, then layers+head)")
    if layers[0] != 0:
        raise ConfigError(f"{where}: {key}[0] must be 0: part 1 is the embedding gather")
    if any(n == 0 for n in layers[1:]):
        raise ConfigError(f"{where}: {key}: every part after the first needs >= 1 layer")
    if sum(layers) != arch.num_layers:
        raise ConfigError(f"{where}: {key} sums to {sum(layers)} layers, but "
                          f"architecture.num_layers is {arch.num_layers}")
    parts_mib = tuple(p["expected_part_mib"])
    if parts_mib and len(parts_mib) != len(layers):
        raise ConfigError(f"{where}: plans.{name}.expected_part_mib has {len(parts_mib)} values "
                          f"for {len(layers)} parts")
    return Plan(name, layers, p["expected_total_mib"] or None, parts_mib, p["tolerance_pct"],
                tuple(p["known_to_fail_on"]), p["failure_note"])


def check_known_failure(devices: Devices, device: Device, model: Model, plan: Plan,
                        where: Path) -> None:
    """A plan known to fail on a device fails on its chipset, whatever name the build uses."""
    for name in plan.known_to_fail_on:
        try:
            failing = devices.get(name)
        except ConfigError as exc:
            raise ConfigError(f"{where}: plans.{plan.name}.known_to_fail_on names {name!r}: "
                              f"{exc}") from None
        if failing.chipset == device.chipset:
            same = "" if failing.name == device.name else \
                f" (device {device.typed} has its chipset, {device.chipset})"
            raise ConfigError(f"plan {plan.name!r} of {model.name} is known to fail on {name}"
                              f"{same}: {plan.failure_note or 'see the model config'}; choose "
                              f"another plan (known: {', '.join(sorted(model.plans))})")


def genie_settings(genie: dict, context_length: int, where: Path) -> dict:
    """[genie] with max_num_tokens resolved: Qualcomm's generator value, capped by the context
    (Genie cannot generate past it); a value given beyond the context is refused."""
    given = genie["max_num_tokens"]
    if given is None:
        return {**genie, "max_num_tokens": min(QUALCOMM_MAX_NUM_TOKENS, context_length)}
    if given > context_length:
        raise ConfigError(f"{where}: key 'genie.max_num_tokens' is {given}, beyond "
                          f"graphs.context_length {context_length}: Genie stops at the context; "
                          f"set it to at most {context_length} or leave it out")
    return genie


def parse_override(key: str, text: str, f: Field, where: str = "command line") -> Any:
    """Command-line (or environment) `key=value` strings, typed by the schema."""
    if f.type is bool:
        low = text.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{where}: {key}={text!r}: expected true or false")
    if f.type is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{where}: {key}={text!r}: expected an integer") from None
    if f.type is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{where}: {key}={text!r}: expected a number") from None
    return text


def remote_from_environment(settings: dict, environ=None) -> dict:
    """The remote_* settings with HEXBUNDLE_REMOTE_* variables of the environment applied."""
    environ = os.environ if environ is None else environ
    out = dict(settings)
    for key, f in REMOTE_SCHEMA.items():
        name = REMOTE_ENV_PREFIX + key.upper()
        if name in environ:
            text = environ[name]
            out[key] = check_value(parse_override(name, text, f, "environment"), f,
                                   "environment", name)
    return out


def load_build(root: Path, overrides: Optional[dict] = None) -> BuildConfig:
    """configs/build.toml + HEXBUNDLE_REMOTE_* + command-line overrides -> a BuildConfig."""
    project = ProjectLayout(root)
    root, path = project.root, project.build_config
    b = apply_overrides(remote_from_environment(read_toml(path, BUILD_SCHEMA)), overrides or {})
    devices = Devices(root)
    model, raw, device = look_up_names(root, devices, b, overrides or {}, path)
    plan = chosen_plan(project, devices, model, device, b["plan"])
    files = (path, project.model_config(model.name), *device.files)
    export_dir = inputs_dir(root, model, plan, raw["inputs"], files[1], project.build_root)
    genie = genie_settings(raw["genie"], model.context_length, files[1])
    container = container_settings(
        b["container"], lambda key: "command line" if f"container.{key}" in (overrides or {})
        else path)
    remote = to_section(RemoteSettings, {k.removeprefix("remote_"): b[k] for k in REMOTE_SCHEMA})
    check_remote_settings(remote, root)
    return BuildConfig(root, model, device, plan, b["backend"], b["executor"],
                       to_section(CompileSettings, b["compile"]), raw["tokenizer"],
                       to_section(InputsSettings, raw["inputs"]),
                       to_section(DialogSettings, genie), files, project.build_root,
                       verify=to_section(VerifySettings, raw["verify"]), export_dir=export_dir,
                       container=container, remote=remote, runtime=b["runtime"])


def apply_overrides(settings: dict, overrides: dict) -> dict:
    """The build settings with the command line's key=value overrides parsed and checked in
    (`settings` is changed and returned); an unknown key is named with the nearest."""
    for key, text in overrides.items():
        section, _, sub = key.partition(".")
        if key in COMPILE_SCHEMA:
            section, sub = "compile", key
        if sub:
            schema = SECTIONS.get(section, {})
            if sub not in schema:
                raise unknown_setting(key)
            settings[section][sub] = check_value(
                parse_override(key, text, schema[sub]), schema[sub], "command line", key)
        elif key in BUILD_SCHEMA and key not in SECTIONS:
            settings[key] = check_value(parse_override(key, text, BUILD_SCHEMA[key]),
                                        BUILD_SCHEMA[key], "command line", key)
        else:
            raise unknown_setting(key)
    return settings


def look_up_names(root: Path, devices: Devices, b: dict, overrides: dict, path: Path) -> tuple:
    """(Model, its raw sections, Device) the settings name; an unknown name is said where it
    was given (the command line or configs/build.toml)."""
    try:
        model, raw = load_model(root, b["model"])
        device = devices.get(b["device"])
    except UnknownNameError as exc:
        given = {k: "command line" for k in overrides}
        raise ConfigError(f"{given.get(exc.key, path)}: {exc.key} = {b[exc.key]!r}: {exc}") \
            from None
    return model, raw, device


def chosen_plan(project: ProjectLayout, devices: Devices, model: Model, device: Device,
                name: str) -> Plan:
    """The plan `name` (the model's default when empty), checked against the device and for
    graph names that sort in pipeline order."""
    plan_name = name or model.default_plan
    if plan_name not in model.plans:
        raise ConfigError(f"plan {plan_name!r} is not in {project.model_config(model.name)};"
                          f" known: {', '.join(sorted(model.plans))}")
    plan = model.plans[plan_name]
    check_known_failure(devices, device, model, plan, project.model_config(model.name))
    problem = pipeline_order_problem(model, plan)
    if problem:
        raise ConfigError(f"plan {plan_name!r} of {model.name}: {problem}. Graph names must sort "
                          "in pipeline order (Genie and the on-device loaders take the context "
                          "binaries in name order); use fewer than 10 parts")
    return plan


def inputs_dir(root: Path, model: Model, plan: Plan, inputs: dict, where: Path,
               build_root: Path) -> Optional[Path]:
    """The export directory an [inputs] of source "export" or "qai-hub-models" reads, checked
    (a qai-hub-models tree must hold every graph of the plan); None for generated inputs."""
    if inputs["source"] == "export":
        return check_export_dir(root, inputs["dir"], where, build_root)
    if inputs["source"] == "qai-hub-models":
        found = check_tree_dir(root, inputs["dir"], where, build_root)
        check_tree_covers_plan(model, plan, inputs, where)
        return found
    return None


def settable_keys() -> list:
    """Every key the command line may set: top-level keys, [compile] keys (bare), table.key."""
    return ([k for k in BUILD_SCHEMA if k not in SECTIONS] + list(COMPILE_SCHEMA)
            + [f"container.{k}" for k in CONTAINER_SCHEMA])


def did_you_mean(typed: str, known) -> str:
    """' (did you mean 'x'?)' for the nearest of `known` to a name the user typed, or ''."""
    near = difflib.get_close_matches(typed, list(known), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def unknown_setting(key: str) -> ConfigError:
    return ConfigError(f"command line: unknown setting {key!r}{did_you_mean(key, settable_keys())};"
                       " allowed: " + ", ".join(settable_keys()))


def setting_field(key: str) -> Field:
    """The schema field of a command-line key (as settable_keys names it)."""
    section, _, sub = key.partition(".")
    if key in COMPILE_SCHEMA:
        return COMPILE_SCHEMA[key]
    return SECTIONS[section][sub] if sub else BUILD_SCHEMA[key]


def run_settings_given(overrides: dict) -> dict:
    """The command line's run settings (Field.run_setting: the step containers' limits and user,
    the remote cache), as given."""
    return {k: v for k, v in overrides.items() if setting_field(k).run_setting}


def command_line_settings(root: Path) -> list:
    """(key, value without overrides, what it is) for every key the command line may set: the
    value configs/build.toml (and HEXBUNDLE_REMOTE_* for remote_*) gives, else the schema's
    default. What `doit help TASK` lists; the keys are load_build's own (settable_keys)."""
    values = remote_from_environment(read_toml(ProjectLayout(root).build_config, BUILD_SCHEMA))
    out = []
    for key in settable_keys():
        section, _, sub = key.partition(".")
        if key in COMPILE_SCHEMA:
            section, sub = "compile", key
        value = values[section][sub] if sub else values[key]
        f = setting_field(key)
        out.append((key, value, f.doc or (f"one of {', '.join(f.choices)}" if f.choices else "")))
    return out
