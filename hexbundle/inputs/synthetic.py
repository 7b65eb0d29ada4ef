"""Generate the input files of a small Qwen2- or Qwen3-architecture model, laid out like a
qai-hub-models export.

For every graph of a part (prompt, then token) this writes `<graph>.onnx` (float32, opset 17,
standard ops only), its external weights `<graph>.data` and its AIMET v1.0.0 `<graph>.encodings`,
plus a byte-level BPE `tokenizer.json`. Everything is a pure function of (model, part, seed):
generating twice gives byte-identical files, so doit can trust file hashes.

This module writes a part's files; the weights are synthetic_weights.py's, the graphs
synthetic_graph.py's, the encodings synthetic_encodings.py's and the tokenizer bpe.py's (the
conventions below are theirs).

Conventions
-----------
* The runtime conventions -- the KV window and layouts, the additive attention mask, the RoPE
  cos/sin inputs and every input's name -- are written down once, in
  hexbundle.runtime.conventions; the graphs declare their inputs and outputs with it
  (`graph_inputs`, `graph_outputs`) and compute with them. Inside a graph: query head h is
  served by kv head h // (nh / nkv) (HF repeat_kv); cos/sin are duplicated to width d
  (concat([c, c])) and RoPE is applied with the rotate-half convention of HF Qwen2; the new keys
  are stored after RoPE, pre-transposed for q @ K.
* Families (config.model.FAMILIES). qwen2: q/k/v projections add a bias. qwen3 (HF
  modeling_qwen3): no q/k/v bias; every query and key head is RMS-normalized over head_dim
  (q_norm, k_norm) after the projection and before RoPE; the value heads are not.
* Tied embeddings (`tie_word_embeddings`): the LM head is the embedding matrix. As in Qualcomm's
  export it is a separate initializer of the last part, a 1x1 Conv weight [vocab, hidden, 1, 1]
  (qai-hub-models' ConvInplaceLinear), holding the embedding's values row for row: both are drawn
  from the embedding's random stream, at the embedding's unit scale. The logits then reach about
  hidden_size (the input token's own row), so their activation range is hidden_size.
* Weights are a function of (seed, initializer name) only, so every split plan cuts the SAME
  model and the prompt and token graphs of a part hold identical weight bytes. All HF weights
  (even small biases and norms) live in the external .data file, 64-byte aligned, in
  `weight_names` order; the small helper constants (reshape shapes, slice bounds, eps, 1/sqrt(d))
  are inline initializers named "/const/...".
* Encodings. Every HF weight has exactly one param encoding: decoder linears INT per output
  channel symmetric (decoder_linear_bitwidth), lm_head INT per output channel symmetric
  (lm_head_bitwidth), embedding INT per tensor asymmetric (embedding_bitwidth); biases and norm
  weights are listed as {"dtype": "FLOAT", "bw": float_bitwidth}. The "/const/..." helpers are not
  listed. Activation encodings: every float graph input and output, 16-bit per tensor, from fixed
  ranges (ACTIVATION_RANGES), never from a calibration run (that would tie bytes to onnxruntime).
  Convention: q in [0, 2^bw - 1], real = (q + offset) * scale.
"""
from __future__ import annotations

from pathlib import Path

from hexbundle.config.layout import graph_files
from hexbundle.config.model import Model, Part
from hexbundle.formats import encodings, weightdata
from hexbundle.inputs.synthetic_encodings import build_encodings
from hexbundle.inputs.synthetic_graph import build_graph, external_tensors
from hexbundle.inputs.synthetic_weights import make_weights
from hexbundle.support.atomic import atomic_output


# --------------------------------------------------------------------------- files


def data_layout(shapes: dict) -> dict:
    """name -> (offset, nbytes) of float32 weights in the .data file (formats/weightdata.py)."""
    return weightdata.plan_layout(shapes)


def _shapes(weights: dict) -> dict:
    return {name: array.shape for name, array in weights.items()}


def _write_data(path: Path, weights: dict) -> None:
    layout = data_layout(_shapes(weights))
    with open_input_file(path) as f:
        for name, array in weights.items():
            f.write(weightdata.padding(f, layout[name][0]))
            f.write(weightdata.stored(array))


def open_input_file(path: Path):
    """A binary file object whose bytes replace `path` when complete (support.atomic): readers
    never see halves; a full disk is a clean error naming the file, nothing partial kept. Not
    fsynced and the umask decides the mode, as these inputs always were."""
    return atomic_output(path, "wb", sync=False, perms=None)


def write_input_file(path: Path, data: bytes) -> None:
    with open_input_file(path) as f:
        f.write(data)


def part_files(model: Model, part: Part, out_dir: Path) -> list:
    """The paths generate_part writes, in its order, each once: per graph .onnx, the part's
    .data (shared by its graphs), .encodings."""
    paths = [path for g in model.graphs(part) for path in graph_files(out_dir, g)]
    return [p for i, p in enumerate(paths) if p not in paths[:i]]


def generate_part(model: Model, part: Part, out_dir: Path, seed: int) -> list:
    """Write <graph>.onnx and <graph>.encodings for each graph of the part, and the part's one
    .data both graphs record."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = make_weights(model, part, seed)
    _write_data(graph_files(out_dir, model.graphs(part)[0])[1], weights)   # first: the ONNX refer to it
    for graph in model.graphs(part):
        onnx_path, data_path, encodings_path = graph_files(out_dir, graph)
        proto = build_graph(model, graph, external_tensors(_shapes(weights), data_path.name))
        write_input_file(onnx_path, proto.SerializeToString(deterministic=True))
        write_input_file(encodings_path,
                         encodings.encodings_bytes(build_encodings(model, graph, weights)))
    return part_files(model, part, out_dir)
