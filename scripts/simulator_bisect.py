#!/usr/bin/env python3
"""Which op makes Qualcomm's simulator differ from onnxruntime on a part's reference graph (the
"simulated reference vs reference" row of `doit verify` for an ortqnn build; issue 48).

  python3 scripts/simulator_bisect.py MODEL PART GRAPH [--run N] [--first I] [--last J]

Builds the part's reference graphs in the form ortqnn compiles (runtime/qdq.py, the derived
activation encodings of checks/simulated.derived_for) and feeds them as verify does: parts 1..PART
chained on verify's prompt (its seed and token counts), recording the inputs of each call of
GRAPH ("prompt" or "token"). Then the dequantized value of every tensor that nodes I..J make
(their DequantizeLinear outputs, at most MAX_OUTPUTS: the driver's limit) becomes a graph
output, the graph is compiled alone for the part's device and call N is run on the x64 HTP
simulator and in onnxruntime (CPU, no optimization). Printed in node order: each tensor's
largest and mean difference in steps (LSB) of its own encoding. The first tensor far above its
inputs names the op; narrow it with scripts of your own (a node alone, fed the simulator's
inputs) from there. Needs the ortqnn kit (`doit ortqnn_kit`), wine64 and a built `doit
bundle` of MODEL with backend=ortqnn (its genie_config.json); writes under the build's
variant directory, simulator-bisect/.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MAX_OUTPUTS = 250          # ortqnn_driver.c takes at most 256 inputs and outputs


def recorded_calls(cfg, layout, part_index: int, kind: str, scratch: Path) -> list:
    """The feeds of each call of the part's `kind` graph in verify's sequence, and the reference
    graphs' files {kind: path}."""
    from hexbundle.checks.simulated import derived_for
    from hexbundle.checks.verify import run_sequence
    from hexbundle.formats.genie import read_genie_config
    from hexbundle.runtime.parts import reference_graphs, reference_session
    from hexbundle.runtime.prompt import ordinary_prompt
    v = cfg.verify
    genie = read_genie_config(layout.bundle_dir)
    x = np.asarray(ordinary_prompt(genie.tokenizer, genie.n_vocab, v.seed,
                                   v.prompt_tokens + v.decode_steps).ids)
    cl, bits = cfg.model.context_length, cfg.compile.float_bitwidth
    calls, files = [], {}
    for part in cfg.plan.parts()[:part_index]:
        derived = derived_for(layout, part, cl, bits, scratch / f"derive{part.index}")
        graphs = reference_graphs(part, cfg.model, layout.every_graph_files(), cl,
                                  scratch / f"reference{part.index}", "half-even", bits, derived)
        if part.index == part_index:
            files = {k: g.path for k, g in graphs.items()}
            graphs[kind] = _Recorder(graphs[kind], calls)
        x = run_sequence(reference_session(part, cfg, graphs), x, v.prompt_tokens).outputs
    return calls, files


class _Recorder:
    """A graph executor that keeps a copy of each call's feeds."""

    def __init__(self, graph, calls: list):
        self.graph, self.calls = graph, calls
        self.inputs, self.outputs, self.name = graph.inputs, graph.outputs, graph.name

    def run(self, feeds: dict) -> dict:
        self.calls.append({k: np.array(v) for k, v in feeds.items()})
        return self.graph.run(feeds)


def exposed(model_path: Path, out: Path, first: int, last: int) -> list:
    """The model, one file, with the DequantizeLinear outputs of nodes first..last's outputs as
    graph outputs; returns their names in node order."""
    import onnx
    from onnx import TensorProto, helper
    model = onnx.load(str(model_path), load_external_data=True)
    dq = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    have = {o.name for o in model.graph.output}
    names = [o + "__qdq" for i, n in enumerate(model.graph.node) if first <= i <= last
             and n.op_type not in ("QuantizeLinear", "DequantizeLinear", "Constant")
             for o in n.output if o + "__qdq" in dq and o + "__qdq" not in have]
    if len(names) > MAX_OUTPUTS:
        raise SystemExit(f"nodes {first}..{last} make {len(names)} tensors, more than the "
                         f"driver's {MAX_OUTPUTS}: give a narrower --first/--last")
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                              for n in names)
    onnx.save(model, str(out))
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("part", type=int)
    parser.add_argument("graph", choices=("prompt", "token"))
    parser.add_argument("--run", type=int, default=0, help="which call of the graph (0: first)")
    parser.add_argument("--first", type=int, default=0, help="first node index to expose")
    parser.add_argument("--last", type=int, default=10 ** 9, help="last node index to expose")
    args = parser.parse_args()
    from hexbundle.backends.ortqnn_kit import ensure_kit
    from hexbundle.backends.ortqnn_sim import SimulatedGraph, output_encodings, own_bins
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    from hexbundle.runtime.onnx_graph import OnnxGraph
    from hexbundle.steps.options import compile_options
    cfg = load_build(ROOT, {"model": args.model, "backend": "ortqnn"})
    layout = Layout(cfg)
    scratch = layout.build_dir / "simulator-bisect" / f"part{args.part}-{args.graph}"
    scratch.mkdir(parents=True, exist_ok=True)
    calls, files = recorded_calls(cfg, layout, args.part, args.graph, scratch)
    model = scratch / "exposed.onnx"
    names = exposed(files[args.graph], model, args.first, args.last)
    part = cfg.plan.parts()[args.part - 1]
    own = own_bins({"g": model}, compile_options(cfg, part), scratch / "own", print)["g"]
    simulated = SimulatedGraph(ensure_kit(ROOT), own, model, scratch / "run", print)
    try:
        sim = simulated.run(calls[args.run])
    finally:
        simulated.close()
    cpu = OnnxGraph(model, optimize=False).run(calls[args.run])
    steps = output_encodings(model)
    print(f"{'tensor':40s} {'shape':22s} {'max LSB':>10s} {'mean LSB':>10s}")
    for name in [o.name for o in simulated.outputs if o.name not in names] + names:
        d = np.abs(sim[name].astype(np.float64) - cpu[name]) / steps[name]["scale"][0]
        print(f"{name:40s} {str(tuple(sim[name].shape)):22s} {np.nanmax(d):10.1f} "
              f"{np.nanmean(d):10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
