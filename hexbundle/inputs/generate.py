"""Full-size generated inputs (e.g. Qwen2.5-7B-shaped), streamed to disk tensor by tensor.

Writes exactly the files `hexbundle.inputs.synthetic.generate_part` writes -- same names, graphs,
encodings and weight bytes for the same (model, part, seed) -- but never holds a whole tensor:
each weight is drawn in blocks of rows from its own random stream (drawing in blocks continues
the same stream, so the values equal a whole-tensor draw), each block is scaled, folded into the
weight's encoding range (per-channel |max| or min/max) and written to the .data file, then
dropped. The 152064 x 3584 float32 embedding (2.2 GB) costs one block (CHUNK_BYTES) of memory.
A tied LM head ([vocab, hidden, 1, 1], the embedding's rows) is drawn again from the embedding's
stream, block by block, rather than kept.

The prompt and token graphs of a part hold the same weights, so both ONNX record the part's one
.data file (as Qualcomm's asset does): the same bytes once on disk, and no hard link (onnx >= 1.21
refuses external data in a file with more than one link).

Before writing anything the free disk space is checked against what will be written; too little
is a DiskSpaceError saying how much is needed and how much is free.

`onnx` is imported only when files are written (through inputs.synthetic): dodo.py imports this module.
"""
from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np

from hexbundle.config.build import load_model, resolve_inside
from hexbundle.config.layout import TOKENIZER, ProjectLayout, graph_files
from hexbundle.config.model import Model, Part, Plan, part_weights
from hexbundle.formats import weightdata
from hexbundle.formats.encodings import encodings_bytes
from hexbundle.support import progress
from hexbundle.support.errors import ConfigError, DiskSpaceError

CHUNK_BYTES = 32 << 20          # float32 bytes of one block of rows (the generator's memory)
# Besides the .data: per graph the .onnx (topology; weights are external) and the .encodings
# (JSON: ~50 bytes per quantization channel). Generous bounds, for the disk check only.
GRAPH_FILES_BYTES = 2 << 20
ENCODING_BYTES_PER_CHANNEL = 64
DISK_HEADROOM_BYTES = 256 << 20  # keep this much free: logs, doit's database, other writers


# --------------------------------------------------------------------------- sizes


def data_bytes(model: Model, part: Part) -> int:
    """Size of the part's .data file (formats/weightdata.py)."""
    return weightdata.data_size({w.name: w.shape for w in part_weights(
        model.architecture, model.quantization, part)})


def part_disk_bytes(model: Model, part: Part) -> int:
    """Disk space the part's generated files take (one .data shared by both graphs)."""
    channels = sum(w.channels for w in part_weights(model.architecture, model.quantization, part))
    graphs = len(model.graphs(part))
    return data_bytes(model, part) + graphs * (GRAPH_FILES_BYTES + ENCODING_BYTES_PER_CHANNEL * channels)


def free_bytes(directory: Path) -> int:
    """Free space of the file system `directory` is (or will be) on."""
    directory = Path(directory).resolve()
    while not directory.exists():
        directory = directory.parent
    return shutil.disk_usage(directory).free


def check_disk(directory: Path, needed: int, what: str) -> None:
    """Refuse before the first byte is written when the file system cannot take `needed`."""
    free = free_bytes(directory)
    if needed + DISK_HEADROOM_BYTES > free:
        raise DiskSpaceError(
            f"{directory}: writing {what} needs {gib(needed)} of free disk space (plus "
            f"{gib(DISK_HEADROOM_BYTES)} headroom), but only {gib(free)} is free there; free some "
            f"space, generate one part at a time, or write somewhere else")


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_pending_disk(model: Model, parts: list, out_dir: Path, index: int) -> None:
    """Before the inputs step of part `index` (a doit action): refuse early when the disk cannot
    also hold the parts still to be generated after it. Here, not in the step: which parts are
    still missing is no input of the step (its description covers its own files only)."""
    part = parts[index - 1]
    others = [p for p in missing_parts(model, parts, out_dir) if p.index != index]
    pending = sum(part_disk_bytes(model, p) for p in others)
    if pending:
        check_disk(Path(out_dir), part_disk_bytes(model, part) + pending,
                   f"the inputs of {model.name} {part.tag} and {gib(pending)} of other pending "
                   "inputs")


def missing_parts(model: Model, parts: Iterable, out_dir: Path) -> list:
    """The parts whose .data files are not (all) on disk yet."""
    out_dir = Path(out_dir)
    return [p for p in parts
            if not all(graph_files(out_dir, g)[1].is_file() for g in model.graphs(p))]


# --------------------------------------------------------------------------- weights


def weight_blocks(spec, seed: int, chunk_bytes: int = CHUNK_BYTES):
    """Yield the weight's values as consecutive blocks of rows (views of one reused buffer)."""
    from hexbundle.inputs import synthetic_weights
    rng = synthetic_weights.weight_rng(spec.stream, seed)   # a tied LM head: the embedding's stream
    rows = spec.shape[0]
    row_shape = tuple(spec.shape[1:])
    rows_per_block = max(1, chunk_bytes // (4 * max(1, math.prod(row_shape))))
    buffer = np.empty((min(rows, rows_per_block), *row_shape), dtype=np.float32)
    for start in range(0, rows, rows_per_block):
        block = buffer[:min(rows_per_block, rows - start)]
        rng.standard_normal(dtype=np.float32, out=block)
        yield synthetic_weights.finish_weight(spec, block)


def write_data(path: Path, model: Model, part: Part, seed: int,
               chunk_bytes: int = CHUNK_BYTES) -> dict:
    """Stream the part's weights into `path` (atomically); return name -> synthetic_encodings.WeightRange."""
    from hexbundle.inputs import synthetic, synthetic_encodings, synthetic_weights
    specs = synthetic_weights.weight_specs(model, part)
    layout = weightdata.plan_layout({s.name: s.shape for s in specs})
    ranges = {}
    total = sum(4 * math.prod(s.shape) for s in specs)
    with synthetic.open_input_file(path) as f, progress.meter(f"{path.name}", total):
        for spec in specs:
            f.write(weightdata.padding(f, layout[spec.name][0]))
            ranges[spec.name] = synthetic_encodings.WeightRange(spec)
            for block in weight_blocks(spec, seed, chunk_bytes):
                ranges[spec.name].update(block)
                data = weightdata.stored(block)
                f.write(data)
                progress.advance(data.nbytes)
    return ranges


# --------------------------------------------------------------------------- files


def generate_part(model: Model, part: Part, out_dir: Path, seed: int,
                  log: Callable[[str], None] = lambda msg: None,
                  chunk_bytes: int = CHUNK_BYTES, also_needed: int = 0) -> list:
    """Write the part's <graph>.onnx/.data/.encodings (synthetic.py's files and bytes), streamed.

    `also_needed`: bytes other pending work will write (counted in the disk check)."""
    from hexbundle.inputs import synthetic, synthetic_encodings, synthetic_graph
    out_dir = Path(out_dir)
    check_disk(out_dir, part_disk_bytes(model, part) + also_needed,
               f"the inputs of {model.name} {part.tag}"
               + (f" and {gib(also_needed)} of other pending inputs" if also_needed else ""))
    out_dir.mkdir(parents=True, exist_ok=True)
    graphs = model.graphs(part)
    first_data = graph_files(out_dir, graphs[0])[1]
    started = time.monotonic()
    ranges = write_data(first_data, model, part, seed, chunk_bytes)
    elapsed = time.monotonic() - started
    size = first_data.stat().st_size
    log(f"wrote {first_data.name}: {len(ranges)} weights, {size / 2**20:.1f} MiB in "
        f"{elapsed:.1f}s ({size / 2**20 / max(elapsed, 1e-9):.0f} MiB/s)")
    shapes = {name: r.spec.shape for name, r in ranges.items()}
    for graph in graphs:   # both graphs record the part's one data file
        onnx_path, data, encodings_path = graph_files(out_dir, graph)
        proto = synthetic_graph.build_graph(model, graph, synthetic_graph.external_tensors(shapes, data.name))
        synthetic.write_input_file(onnx_path, proto.SerializeToString(deterministic=True))
        encodings = synthetic_encodings.encodings_from_ranges(model, graph, ranges)
        synthetic.write_input_file(encodings_path, encodings_bytes(encodings))
    return synthetic.part_files(model, part, out_dir)


def generate_parts(model: Model, parts: list, out_dir: Path, seed: int,
             specials: Optional[dict] = None, log: Callable[[str], None] = print) -> list:
    """Several parts (and tokenizer.json if `specials`): the disk check covers all of them first."""
    from hexbundle.inputs import bpe
    out_dir = Path(out_dir)
    total = sum(part_disk_bytes(model, p) for p in parts)
    check_disk(out_dir, total, f"the inputs of {model.name} parts "
               f"{', '.join(str(p.index) for p in parts)}")
    written = []
    for i, part in enumerate(parts):
        pending = sum(part_disk_bytes(model, p) for p in parts[i + 1:])
        written += generate_part(model, part, out_dir, seed, log, also_needed=pending)
    if specials is not None:
        written.append(bpe.generate_tokenizer(model.architecture.vocab_size, out_dir / TOKENIZER,
                                                        specials))
        log(f"wrote {written[-1].name}")
    return written


# --------------------------------------------------------------------------- entry points


def generate_for_config(root: Path, model_name: str, plan_name: str = "", part_indexes=(),
                        out: Optional[Path] = None, seed: Optional[int] = None,
                        tokenizer: bool = True, log: Callable[[str], None] = print) -> list:
    """scripts/gen_7b_inputs.py: a model config's parts (all, or the chosen ones) + tokenizer,
    into `out` or where the config expects its inputs. Any plan, even one a device refuses."""
    project = ProjectLayout(root)
    root = project.root
    model, raw = load_model(root, model_name)
    where = project.model_config(model_name)
    plan_name = plan_name or model.default_plan
    if plan_name not in model.plans:
        raise ConfigError(f"{where}: no plan {plan_name!r}; known: {', '.join(sorted(model.plans))}")
    parts = model.plans[plan_name].parts()
    bad = [i for i in part_indexes if not 1 <= i <= len(parts)]
    if bad:
        raise ConfigError(f"part {bad[0]}: plan {plan_name!r} of {model_name} has parts 1..{len(parts)}")
    if part_indexes:
        parts = [parts[i - 1] for i in sorted(set(part_indexes))]
    if out is None:
        if raw["inputs"]["source"] == "generated":
            out = project.generated_inputs_dir(model.name)
        else:
            out = resolve_inside(root, raw["inputs"]["dir"], where, "inputs.dir")
    seed = raw["inputs"]["seed"] if seed is None else seed
    log(f"{model_name}, plan {plan_name}: parts {', '.join(str(p.index) for p in parts)} "
        f"-> {out} (seed {seed})")
    return generate_parts(model, parts, out, seed, raw["tokenizer"] if tokenizer else None, log)


def generate_action(model: Model, plan: Plan, out_dir: Path, seed: int, specials: dict,
                    shown: str, part: int = 0) -> None:
    """`doit gen_inputs [--part N]`: stand-in inputs for the configured model where the build
    reads them (`out_dir`, shown as `shown`; for an exported model, its inputs.dir)."""
    parts = plan.parts()
    if part:
        if not 1 <= part <= len(parts):
            raise ConfigError(f"--part {part}: plan {plan.name} of {model.name} has parts "
                              f"1..{len(parts)}")
        parts = [parts[part - 1]]
    from hexbundle.support.monitor import monitored
    started = time.monotonic()
    with monitored("gen_inputs", "gen_inputs"):   # bytes written, rate, ETA as it goes
        paths = generate_parts(model, parts, out_dir, seed, dict(specials),
                               lambda msg: print(msg, flush=True))
    print(f"{len(paths)} files in {shown} in "
          f"{time.monotonic() - started:.1f}s", flush=True)
