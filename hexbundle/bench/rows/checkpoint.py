"""Row 11: `import_export` of a Qwen3-8B-shaped qai-hub-models quantize checkpoint (every layer;
its model.data past 2 GiB, as aimet-onnx writes it): wall time and peak RSS (goal <= 3 GiB)."""
from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from hexbundle.bench.common import GIB, BenchError, run_measured

IDS, NEEDS_BUILD = (11,), False
# Qwen3-8B's config.json (qai-hub-models' qwen3_8b: NUM_SPLITS 5): every layer, every tensor at
# its real shape.
CHECKPOINT_SHAPE = {"num_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
                    "num_kv_heads": 8, "head_dim": 128, "intermediate_size": 12288,
                    "vocab_size": 151936}
CHECKPOINT_RSS_GOAL = 3 << 30


def measure(bench, full) -> dict:
    """`import_export` of a quantize checkpoint of CHECKPOINT_SHAPE (--small: the small model's
    shape as a Qwen3), in its own process: what it holds at its peak."""
    model = checkpoint_model(bench.cfg.model, bench.small)
    ckpt = bench.build_root / "checkpoint-bench" / "ckpt"
    bench.log(f"checkpoint: writing a {model.architecture.num_layers}-layer quantize "
              "checkpoint (graph, encodings, config.json, model.data) ...")
    facts = write_checkpoint(model, ckpt)
    project = ckpt.parent / "project"
    (project / "configs" / "models").mkdir(parents=True, exist_ok=True)
    code = ("import sys; from pathlib import Path; from hexbundle.inputs.import_export "
            "import import_export; import_export(Path(sys.argv[1]), sys.argv[2], 'bench', "
            "context_length=sys.argv[3], model_id='qwen3_8b')")
    bench.log("checkpoint: import_export ...")
    seconds, rc, out, err, rss = run_measured(
        [sys.executable, "-c", code, str(project), str(ckpt), str(model.context_lengths[-1])],
        bench.root, bench.env())
    shutil.rmtree(ckpt.parent, ignore_errors=True)
    if rc:
        raise BenchError("import_export of the checkpoint failed: " + (out + err).strip()[-2000:])
    return {"seconds": round(seconds, 2), "peak_rss_bytes": rss, **facts}


def table(ck: dict, bench, full) -> list:
    return [{"id": 11, "what": f"`import_export` of a {ck['layers']}-layer quantize checkpoint "
                               f"(hidden {ck['hidden_size']}, vocab {ck['vocab_size']}; "
                               f"model.data {ck['data_bytes'] / GIB:.2f} GiB, encodings "
                               f"{ck['encodings_bytes'] / 2**20:.1f} MiB)",
             "ours": f"{ck['seconds']:.2f} s, peak RSS {ck['peak_rss_bytes'] / GIB:.2f} GiB",
             "baseline": "-", "ratio": "-", "target": "peak RSS <= 3 GiB",
             "met": ck["peak_rss_bytes"] <= CHECKPOINT_RSS_GOAL, "detail": ck}]


def checkpoint_model(model, small: bool):
    arch = model.architecture if small else replace(model.architecture, **CHECKPOINT_SHAPE)
    return replace(model, architecture=replace(arch, family="qwen3"))


def write_checkpoint(model, out: Path, seed: int = 0) -> dict:
    """A quantize checkpoint of `model`'s shape, written through the input generator's graph and
    encodings writers: model_dynamic.onnx (the whole model; the AR- and context-dependent dims
    symbolic, as torch.export leaves them), model.encodings (from every weight's drawn values,
    block by block), config.json, and model.data at the graph's recorded offsets. model.data is
    a sparse file (zeros): the import reads its size and a few elements of the two vocabulary
    tables, never the rest, and 33 GB of float32 written to disk would measure the disk."""
    from hexbundle.formats import encodings, weightdata
    from hexbundle.inputs import validate
    from hexbundle.inputs.generate import weight_blocks
    from hexbundle.inputs.synthetic_encodings import WeightRange, encodings_from_ranges
    from hexbundle.inputs.synthetic_graph import build_graph, external_tensors
    from hexbundle.inputs.synthetic_weights import weight_specs
    out.mkdir(parents=True, exist_ok=True)
    whole = validate.whole_model_part(model)
    ranges = {}
    for spec in weight_specs(model, whole):
        ranges[spec.name] = WeightRange(spec)
        for block in weight_blocks(spec, seed):
            ranges[spec.name].update(block)
    shapes = {name: r.spec.shape for name, r in ranges.items()}
    data_bytes = max(offset + n for offset, n in weightdata.plan_layout(shapes).values())
    with open(out / "model.data", "wb") as f:
        f.truncate(data_bytes)
    graph = model.graphs(whole)[0]
    proto = build_graph(model, graph, external_tensors(shapes, "model.data"))
    _make_symbolic(proto, model, graph)
    graph_bytes = proto.SerializeToString(deterministic=True)
    (out / "model_dynamic.onnx").write_bytes(graph_bytes)
    encoded = encodings.encodings_bytes(encodings_from_ranges(model, graph, ranges))
    (out / "model.encodings").write_bytes(encoded)
    (out / "config.json").write_text(json.dumps(_config_json(model.architecture)))
    a = model.architecture
    return {"layers": a.num_layers, "hidden_size": a.hidden_size, "vocab_size": a.vocab_size,
            "data_bytes": data_bytes, "graph_bytes": len(graph_bytes),
            "encodings_bytes": len(encoded)}


def _make_symbolic(proto, model, graph) -> None:
    """Every input and output dim that depends on AR or the context length made symbolic (found
    by comparing with the I/O of a graph of other AR and context length)."""
    from hexbundle.inputs import validate
    other = replace(graph, ar=graph.ar + 3, context_length=graph.context_length + 7)
    for side, values in ((0, proto.graph.input), (1, proto.graph.output)):
        alt = {s.name or ("logits" if s.role == "logits" else ""): s
               for s in validate.expected_io(model, other)[side]}
        for value in values:
            if value.name in alt:
                for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                    if dim.dim_value != alt[value.name].shape[axis]:
                        dim.Clear()
                        dim.dim_param = f"{value.name}_dim{axis}"


def _config_json(a) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "num_hidden_layers": a.num_layers, "hidden_size": a.hidden_size,
            "num_attention_heads": a.num_attention_heads, "num_key_value_heads": a.num_kv_heads,
            "head_dim": a.head_dim, "intermediate_size": a.intermediate_size,
            "vocab_size": a.vocab_size, "rope_theta": a.rope_theta,
            "rms_norm_eps": a.rms_norm_eps, "tie_word_embeddings": False}
