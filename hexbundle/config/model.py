"""What a model *is*, independent of files: architecture, split plan, quantization scheme.

These plain dataclasses are built by `hexbundle.config.build` from TOML and consumed by the input
generator, the backends, the size model and the bundle writer. No I/O here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# The decoder families hexbundle knows. All: GQA attention, RoPE, RMSNorm, SwiGLU MLP.
# qwen2: q/k/v projections with biases. qwen3: no q/k/v biases; each query and key head is
# RMS-normalized over head_dim before RoPE (q_norm, k_norm: one head_dim weight shared by all
# query heads, one by all key heads). llama: neither (Llama 3.x; Mistral and Falcon 3 have the
# same decoder), its RoPE often scaled (RopeScaling).
FAMILIES = ("qwen2", "qwen3", "llama")
ROPE_SCALING_TYPES = ("llama3",)


@dataclass(frozen=True)
class RopeScaling:
    """Hugging Face config.json's `rope_scaling` of type "llama3" (Llama 3.1 / 3.2): the
    frequencies of RoPE scaled per band (runtime.conventions.rope_inv_freq), written to
    genie_config.json's positional-encoding block."""

    rope_type: str                     # "llama3"
    factor: float                      # 8.0 for Llama 3.1 8B, 32.0 for Llama 3.2 1B/3B
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class Architecture:
    """A decoder of one of FAMILIES (`family`)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the logits width (Genie's n-vocab), not the tokenizer's length
    rope_theta: float
    rms_norm_eps: float
    # The float model's LM head IS the embedding matrix. On the device it is still a separate,
    # quantized copy in the last part (Qualcomm's export copies it into a 1x1 Conv).
    tie_word_embeddings: bool = False
    family: str = "qwen2"
    rope_scaling: Optional[RopeScaling] = None   # None: plain RoPE, theta^(-2i/d)

    @property
    def qkv_bias(self) -> bool:
        return self.family == "qwen2"

    @property
    def qk_norm(self) -> bool:
        return self.family == "qwen3"

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def pos_id_dim(self) -> int:
        """Width of the position_ids_cos/_sin inputs (half the head dim, as exported)."""
        return self.head_dim // 2


@dataclass(frozen=True)
class Quantization:
    """Bit widths of the quantization scheme (what the AIMET encodings are expected to say)."""

    decoder_linear_bitwidth: int = 4   # q/k/v/o, gate/up/down weights, per output channel
    lm_head_bitwidth: int = 8          # per output channel
    embedding_bitwidth: int = 16       # per tensor
    activation_bitwidth: int = 16
    float_bitwidth: int = 16           # biases, norms and anything left in float
    # A layer weight with no encoding: "refuse" (the default: say so, build nothing), "int8"
    # (quantize it to 8 bits per channel, as QNN's --quantize_full_type w8a16 does) or "float"
    # (keep it at float_bitwidth). The build says per tensor which it did.
    unencoded_weights: str = "refuse"


@dataclass(frozen=True)
class Part:
    """One context binary: a contiguous slice of the pipeline."""

    index: int            # 1-based, pipeline order
    count: int            # N, number of parts in the plan
    layers: tuple         # decoder layer indices held by this part (may be empty)
    has_embedding: bool   # part 1: the input_ids -> hidden gather
    has_head: bool        # last part: final norm + LM head -> logits

    @property
    def tag(self) -> str:
        return f"part_{self.index}_of_{self.count}"


@dataclass(frozen=True)
class Graph:
    """One graph of a part: the prompt (AR = prompt_ar) or the token (AR = 1) variant at one
    context length."""

    kind: str          # "prompt" | "token"
    ar: int            # tokens processed per call (sequence length S)
    context_length: int
    part: Part
    one_of_several_lengths: bool = False   # the model builds several context lengths

    @property
    def name(self) -> str:
        # "ar"/"cl" in the name matter to Genie, which groups graphs by (AR-n, CL-x).
        return f"{self.kind}_ar{self.ar}_cl{self.context_length}_{self.part.index}_of_{self.part.count}"

    @property
    def slot(self) -> str:
        """The graph within its part, for task names and step arguments: "prompt" / "token",
        or "prompt_cl512" / "token_cl512" when the model builds several context lengths."""
        return f"{self.kind}_cl{self.context_length}" if self.one_of_several_lengths else self.kind


@dataclass(frozen=True)
class Plan:
    """A split plan: how decoder layers are distributed over parts."""

    name: str
    layers_per_part: tuple           # e.g. (0, 6, 6, 6, 6, 4): part 1 embedding, last part + head
    expected_total_mib: Optional[float] = None   # measured reference figure, if any
    expected_part_mib: tuple = ()                # per-part measured figures, if any
    tolerance_pct: float = 2.0
    known_to_fail_on: tuple = ()                 # device names this plan is known to fail on
    failure_note: str = ""

    def parts(self) -> list:
        n = len(self.layers_per_part)
        out, first = [], 0
        for i, count in enumerate(self.layers_per_part, start=1):
            out.append(Part(index=i, count=n, layers=tuple(range(first, first + count)),
                            has_embedding=(i == 1), has_head=(i == n)))
            first += count
        return out


@dataclass(frozen=True)
class Model:
    name: str                 # config name, e.g. "qwen2-tiny"
    slug: str                 # file-name stem of the bins, e.g. "qwen2_tiny"
    architecture: Architecture
    quantization: Quantization
    context_lengths: tuple    # ascending; every part holds a prompt and a token graph of each
    prompt_ar: int
    token_ar: int
    plans: dict = field(default_factory=dict)   # name -> Plan
    default_plan: str = ""

    @property
    def context_length(self) -> int:
        """The largest context length: Genie's context size (dialog.context.size)."""
        return max(self.context_lengths)

    def graphs(self, part: Part, context_length: Optional[int] = None) -> list:
        """The graphs of a part in the order they go into its context binary (part_graphs); with
        `context_length`, only that length's prompt and token graph."""
        graphs = part_graphs(part, self.context_lengths, self.prompt_ar, self.token_ar)
        return [g for g in graphs if context_length in (None, g.context_length)]


def part_graphs(part: Part, context_lengths: tuple, prompt_ar: int, token_ar: int) -> list:
    """A part's graphs in bin order: for each context length, ascending, its prompt graph then its
    token graph (qai-hub-models' link order)."""
    several = len(context_lengths) > 1
    return [Graph(kind, ar, cl, part, several) for cl in sorted(context_lengths)
            for kind, ar in (("prompt", prompt_ar), ("token", token_ar))]


def boundary_tensor(part: Part) -> str:
    """Name of the hidden state a part hands to the next one (uint16 on device, float in ONNX)."""
    if part.has_embedding:
        return "embed_tokens_output"
    return f"layer_{part.layers[-1]}_output"


@dataclass(frozen=True)
class WeightSpec:
    """A weight tensor as the architecture implies it (ONNX layout) and how it is quantized."""

    name: str
    shape: tuple
    bitwidth: Optional[int]    # None: stays float (biases, norms)
    channels: int              # quantization channels: out-features, 1 per tensor, 0 for float

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def layer_weights(arch: Architecture, quant: Quantization, layer: int) -> list:
    """The weights of one decoder layer; MatMul weights are [in, out], quantized per out channel."""
    h, kv, ff, bw = arch.hidden_size, arch.kv_dim, arch.intermediate_size, quant.decoder_linear_bitwidth
    q = arch.num_attention_heads * arch.head_dim
    p = f"model.layers.{layer}."
    linear = [("self_attn.q_proj", h, q), ("self_attn.k_proj", h, kv), ("self_attn.v_proj", h, kv),
              ("self_attn.o_proj", q, h), ("mlp.gate_proj", h, ff), ("mlp.up_proj", h, ff),
              ("mlp.down_proj", ff, h)]
    out = [WeightSpec(p + n + ".weight", (i, o), bw, o) for n, i, o in linear]
    if arch.qkv_bias:
        out += [WeightSpec(p + f"self_attn.{n}_proj.bias", (size,), None, 0)
                for n, size in (("q", q), ("k", kv), ("v", kv))]
    if arch.qk_norm:   # one head_dim weight each, shared by every query (key) head
        out += [WeightSpec(p + f"self_attn.{n}_norm.weight", (arch.head_dim,), None, 0)
                for n in ("q", "k")]
    out += [WeightSpec(p + n + ".weight", (h,), None, 0)
            for n in ("input_layernorm", "post_attention_layernorm")]
    return out


def part_weights(arch: Architecture, quant: Quantization, part: Part) -> list:
    """Every weight a part holds (shared by its prompt and token graphs), in pipeline order."""
    out = []
    if part.has_embedding:
        out.append(WeightSpec("model.embed_tokens.weight", (arch.vocab_size, arch.hidden_size),
                              quant.embedding_bitwidth, 1))
    for layer in part.layers:
        out += layer_weights(arch, quant, layer)
    if part.has_head:
        out.append(WeightSpec("model.norm.weight", (arch.hidden_size,), None, 0))
        out.append(lm_head_weight(arch, quant))
    return out


def lm_head_weight(arch: Architecture, quant: Quantization) -> WeightSpec:
    """The LM head, quantized per vocab entry. Untied: a MatMul weight [hidden, vocab]. Tied: the
    embedding matrix itself as a 1x1 Conv weight [vocab, hidden, 1, 1] -- what qai-hub-models
    makes of the LM head (ConvInplaceLinear copies it; the embedding's Gather keeps its own
    16-bit copy in part 1) -- so its rows are exactly the embedding's rows."""
    if arch.tie_word_embeddings:
        shape = (arch.vocab_size, arch.hidden_size, 1, 1)
    else:
        shape = (arch.hidden_size, arch.vocab_size)
    return WeightSpec("lm_head.weight", shape, quant.lm_head_bitwidth, arch.vocab_size)


def pipeline_order_problem(model: Model, plan: Plan) -> str:
    """Runtimes that sort graphs or bins by name load `..._10_of_11` before `..._2_of_11`: the
    seeds hit this. Return a description of the first misordered pair, or "" when names sort in
    pipeline order."""
    parts = plan.parts()
    for kind_index in range(2 * len(model.context_lengths)):
        names = [model.graphs(p)[kind_index].name for p in parts]
        names_sorted = sorted(names)
        if names != names_sorted:
            for i, (want, got) in enumerate(zip(names, names_sorted)):
                if want != got:
                    return (f"graph {got!r} sorts before {want!r} although it comes later in the "
                            f"pipeline (part {names.index(got) + 1} vs part {i + 1})")
    return ""
