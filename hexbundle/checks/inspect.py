"""`doit inspect --path FILE_OR_DIR`: what a user has, and what the build would refuse, before
a compile of many minutes.

The path is an AIMET encodings file, an ONNX file, an export tree (formats/qaihm.py reads every
layout) or a directory of ONNX files. Printed: per graph, its inputs and outputs (dtype, shape),
op counts, IR version and opsets, the external-data files it records and the initializer bytes
inline and external; per encodings file, its schema and, for params and activations, counts per
(enc type, bitwidth, dtype, symmetric). Then every problem the build would refuse at once, not
only the first: the very checks the build runs, their HexbundleError messages collected -- the
export scan, the recorded data files, the input validation of each ONNX (inputs/validate.py:
structure, onnx.checker, and for an export tree each graph's inputs and outputs against the
model the import infers from it), the encodings loader, the reference backend's weight planning
for each ONNX with its encodings, each weight's values (NaN, infinity, float16 overflow at the
build's float_bitwidth; streamed, each window of a shared .data read once), and the tokenizer
next to an export. Nothing is written.

An ONNX is paired with its encodings as the export tree does: `<stem>.encodings` next to
`<stem>.onnx`, or Qualcomm's asset's one shared `<slug>.encodings` for `<slug>_ar<S>.onnx`.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import onnx

from hexbundle.backends.weightplan import plan_weights
from hexbundle.formats.encodings import Encodings, load_encodings
from hexbundle.formats.qaihm import (AR_DIR, ASSET_ONNX, KIND_DIRS, GraphIO, graph_io,
                                     load_structure, recorded_data_files, scan_export)
from hexbundle.formats.tokenizer import special_token_ids
from hexbundle.formats.hf_config import read_hf_config
from hexbundle.support.files import about_argument, require_named_path
from hexbundle.inputs.import_export import expected_graphs, expected_specials
from hexbundle.inputs.validate import check_weight_values, io_problem, structure_problems
from hexbundle.support import table as tables
from hexbundle.support.console import say
from hexbundle.support.errors import HexbundleError, InputError

ONNX_SUFFIX = ".onnx"
ENCODINGS_SUFFIX = ".encodings"
WIDTH = 100          # op-count lines wrap here


@dataclass
class GraphReport:
    onnx: Path
    encodings: Optional[Path]
    ir_version: int = 0
    opsets: tuple = ()                   # (domain, version)
    io: Optional[GraphIO] = None
    ops: Counter = field(default_factory=Counter)
    data_files: Optional[tuple] = None   # (path, size); None: the record is broken
    inline: tuple = (0, 0)               # (initializers, bytes)
    external: tuple = (0, 0)


@dataclass
class EncodingsReport:
    path: Path
    encodings: Optional[Encodings] = None   # None: it does not load

    def rows(self) -> list:
        """(class, enc type, bitwidth, dtype, symmetric, block size, count), sorted."""
        counts: Counter = Counter()
        for cls, section in (("params", self.encodings.params),
                             ("activations", self.encodings.activations)):
            for e in section.values():
                counts[(cls, enc_type(e), e.bitwidth, e.dtype, bool(e.symmetric),
                        int(getattr(e, "block_size", 0) or 0))] += 1
        order = {"params": 0, "activations": 1}
        return sorted(((*k, n) for k, n in counts.items()),
                      key=lambda r: (order[r[0]], -r[6], r[1:6]))


@dataclass
class Inspection:
    path: Path                           # what was inspected
    root: Path                           # paths print relative to it
    kind: str
    header: list = field(default_factory=list)
    graphs: list = field(default_factory=list)
    encodings: list = field(default_factory=list)
    problems: list = field(default_factory=list)

    def problem(self, message: str) -> None:
        if message not in self.problems:   # the scan and a graph's own check may say the same
            self.problems.append(message)

    def rel(self, path: Path) -> str:
        try:
            return str(Path(path).resolve().relative_to(self.root)) or Path(path).name
        except ValueError:
            return str(path)

    @property
    def summary(self) -> str:
        return (f"{plural(len(self.graphs), 'graph')}, "
                f"{plural(len(self.encodings), 'encodings file')}, "
                f"{plural(len(self.problems), 'problem')}")


# ============================================================================ the command

def inspect_command(path: str = "", float_bitwidth: int = 16, model_config: str = "") -> None:
    """The doit action: print the inspection; InputError (non-zero exit) if there are problems.
    float_bitwidth: the build's ([compile]), which decides what float16 must hold; model_config:
    the model's config.json, whose special token ids judge the export's tokenizer."""
    if not path:
        raise InputError("inspect needs --path FILE_OR_DIR: an AIMET .encodings file, an .onnx, "
                         "or an export directory, e.g. `doit inspect --path ~/qwen-export`")
    hf = read_hf_config(Path(model_config)) if model_config else None
    with about_argument("--path", path):
        require_named_path(Path(path).expanduser(), "file or directory to inspect", "--path")
        found = inspect_path(Path(path).expanduser(), float_bitwidth, hf)
        for line in render(found):
            say(line)
        if found.problems:
            raise InputError(f"{plural(len(found.problems), 'problem')} (listed above) that the "
                             "build would refuse; fix them before building")


def inspect_path(path: Path, float_bitwidth: int = 16, hf=None) -> Inspection:
    """Inspect a file or directory; every problem found is collected, none raised."""
    if not path.exists():
        raise InputError(f"{path}: no such file or directory; give an AIMET .encodings file, an "
                         ".onnx, or the directory your qai-hub-models export wrote")
    path = path.resolve()
    if path.is_dir():
        return _inspect_dir(path, float_bitwidth, hf)
    found = Inspection(path, path.parent, "ONNX model" if path.suffix == ONNX_SUFFIX
                       else "AIMET encodings")
    if path.suffix == ONNX_SUFFIX:
        _inspect_graphs(found, [path], float_bitwidth)
    else:
        _inspect_encodings(found, [path])
    return found


def _inspect_dir(root: Path, float_bitwidth: int, hf=None) -> Inspection:
    onnx_files = sorted(root.rglob("*" + ONNX_SUFFIX))
    found = Inspection(root, root, "directory of ONNX models")
    expected = {}
    if _looks_like_export(root):
        try:
            tree = scan_export(root)
            found.kind = tree.layout
            found.header = tree.describe()
            for message in tree.problems:
                found.problem(message)
            expected = _expected_graphs(found, tree, hf)
        except InputError as exc:   # an export layout the scan refuses: still show each graph
            found.problem(str(exc))
    elif not onnx_files:
        raise InputError(f"{root}: no .onnx file and no qai-hub-models export in it; give an "
                         "AIMET .encodings file, an .onnx, or the export's directory")
    _inspect_graphs(found, onnx_files, float_bitwidth, expected)
    return found


def _expected_graphs(found: Inspection, tree, hf=None) -> dict:
    """{ONNX path: (model, graph)} as the import would configure the export, and its tokenizer
    checked against that model (the special tokens import_export.expected_specials names); a
    problem (and nothing to compare) if it cannot be inferred."""
    try:
        model, graphs = expected_graphs(tree)
    except HexbundleError as exc:
        found.problem(str(exc))
        return {}
    if tree.tokenizer is not None:
        try:
            specials = expected_specials(model.architecture.family, hf, tree.tokenizer)
            special_token_ids(tree.tokenizer, specials, model.architecture.vocab_size)
        except HexbundleError as exc:
            found.problem(str(exc))
    return {path: (model.architecture, graph) for path, graph in graphs.items()}


def _looks_like_export(root: Path) -> bool:
    return (any(p.is_dir() and AR_DIR.fullmatch(p.name) for p in root.iterdir())
            or any((root / k).is_dir() for k in KIND_DIRS)
            or any(ASSET_ONNX.fullmatch(p.name) for p in root.glob("*" + ONNX_SUFFIX)))


def paired_encodings(onnx_path: Path) -> Optional[Path]:
    """The encodings the export tree pairs with this ONNX, if that file is there."""
    same_stem = onnx_path.with_suffix(ENCODINGS_SUFFIX)
    if same_stem.is_file():
        return same_stem
    asset = ASSET_ONNX.fullmatch(onnx_path.name)
    if asset and (onnx_path.parent / f"{asset['slug']}{ENCODINGS_SUFFIX}").is_file():
        return onnx_path.parent / f"{asset['slug']}{ENCODINGS_SUFFIX}"
    return None


def _inspect_graphs(found: Inspection, onnx_files: list, float_bitwidth: int,
                    expected: Optional[dict] = None) -> None:
    pairs = [(p, paired_encodings(p)) for p in onnx_files]
    loaded = _inspect_encodings(found, list(dict.fromkeys(e for _, e in pairs if e is not None)))
    scanned: set = set()   # windows of shared .data files whose values were checked
    for onnx_path, enc_path in pairs:
        report = GraphReport(onnx_path, enc_path)
        found.graphs.append(report)
        try:
            model = load_structure(onnx_path)
        except HexbundleError as exc:
            found.problem(str(exc))
            continue
        _describe_graph(report, model)
        try:
            files = recorded_data_files(onnx_path, model)
            report.data_files = tuple((f, f.stat().st_size) for f in files)
        except HexbundleError as exc:
            found.problem(str(exc))
        structure = structure_problems(onnx_path, model, records_broken=report.data_files is None)
        for message in structure:
            found.problem(message)
        if onnx_path in (expected or {}):
            problem = io_problem(onnx_path, model, *expected[onnx_path], None)
            if problem:
                found.problem(problem)
        encodings = loaded.get(enc_path)
        if encodings is not None:
            try:
                weights, _ = plan_weights(model.graph, encodings, onnx_path, enc_path)
            except HexbundleError as exc:
                found.problem(str(exc))
                continue
            if report.data_files is not None and not structure:
                _check_values(found, onnx_path, model, weights, float_bitwidth, scanned)


def _check_values(found: Inspection, onnx_path: Path, model, weights: list, float_bitwidth: int,
                  scanned: set) -> None:
    """Each weight's values, as convert checks them (streamed; NaN, infinity, float16)."""
    stored = {w.name: w.stored_dtype(float_bitwidth) for w in weights}
    try:
        check_weight_values(onnx_path, model, stored, seen=scanned)
    except HexbundleError as exc:
        found.problem(str(exc))


def _inspect_encodings(found: Inspection, paths: list) -> dict:
    """Load each encodings file once (the asset's is shared); path -> Encodings that loaded."""
    loaded = {}
    for path in paths:
        report = EncodingsReport(path)
        found.encodings.append(report)
        try:
            report.encodings = loaded[path] = load_encodings(path)
        except HexbundleError as exc:
            found.problem(str(exc))
    return loaded


def _describe_graph(report: GraphReport, model) -> None:
    report.ir_version = int(model.ir_version)
    report.opsets = tuple((o.domain or "ai.onnx", int(o.version)) for o in model.opset_import)
    report.io = graph_io(model)
    report.ops = Counter(node.op_type for node in model.graph.node)
    inline, external = [0, 0], [0, 0]
    for init in model.graph.initializer:
        is_external = init.data_location == onnx.TensorProto.EXTERNAL
        side = external if is_external else inline
        side[0] += 1
        side[1] += initializer_bytes(init, is_external)
    report.inline, report.external = tuple(inline), tuple(external)


def initializer_bytes(init, is_external: bool) -> int:
    if is_external:
        length = next((e.value for e in init.external_data if e.key == "length"), "")
        if length.isdigit():
            return int(length)
    elif init.raw_data:
        return len(init.raw_data)
    if init.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in init.string_data)
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 0
    return int(np.prod(init.dims, dtype=np.int64)) * itemsize


def enc_type(e) -> str:
    """PER_TENSOR / PER_CHANNEL / PER_BLOCK / LPBQ as the file says it (when the loader keeps
    it), else from the fields every loader version has; float encodings have none."""
    explicit = getattr(e, "enc_type", "")
    if explicit:
        return str(explicit)
    if e.dtype == "float":
        return "-"
    if getattr(e, "block_size", 0):
        return "PER_BLOCK"
    return "PER_CHANNEL" if e.per_channel else "PER_TENSOR"


# ============================================================================ printing

def render(found: Inspection) -> list:
    """The printout: the layout found, each graph with its encodings, the problems, a summary."""
    lines = [f"{found.path}: {found.kind}"]
    lines += [f"  {h}" for h in found.header]
    reports = {e.path: e for e in found.encodings}
    shown: set = set()
    for g in found.graphs:
        lines += [""] + graph_lines(found, g)
        if g.encodings in reports and g.encodings not in shown:
            shown.add(g.encodings)
            lines += encodings_lines(found, reports[g.encodings], indent=2)
    for e in found.encodings:
        if e.path not in shown:
            lines += [""] + encodings_lines(found, e, indent=0)
    lines.append("")
    if found.problems:
        lines.append(f"problems the build would refuse ({len(found.problems)}):")
        for i, message in enumerate(found.problems, 1):
            first, *rest = message.splitlines()
            lines.append(f"  {i}. {first}")
            lines += [f"     {r}" for r in rest]
    lines.append(found.summary)
    return lines


def graph_lines(found: Inspection, g: GraphReport) -> list:
    lines = [f"graph {found.rel(g.onnx)}"]
    if g.io is None:
        return lines + ["  (cannot be read: see problems)"]
    opsets = ", ".join(f"{d} {v}" for d, v in g.opsets)
    lines.append(f"  IR version {g.ir_version}; opset {opsets}")
    rows = ([("inputs", "", "")] + io_rows(g.io.inputs)
            + [("outputs", "", "")] + io_rows(g.io.outputs))
    lines += table(rows, indent=2, header=None)
    ops = sorted(g.ops.items(), key=lambda kv: (-kv[1], kv[0]))
    lines += wrap(f"  ops ({plural(sum(g.ops.values()), 'node')}):", [f"{op} {n}" for op, n in ops])
    lines.append(f"  initializers: {g.external[0]} external ({human(g.external[1])}), "
                 f"{g.inline[0]} inline ({human(g.inline[1])})")
    if g.data_files is None:
        lines.append("  external data: a recorded file is missing (see problems)")
    elif g.data_files:   # named as the ONNX records them: relative to its directory
        lines += [f"  external data: {p.name} ({human(size)})" for p, size in g.data_files]
    else:
        lines.append("  external data: none (weights inline)")
    if g.encodings is None:
        lines.append("  encodings: none next to it")
    return lines


def encodings_lines(found: Inspection, e: EncodingsReport, indent: int) -> list:
    pad = " " * indent
    lines = [f"{pad}encodings {found.rel(e.path) if indent == 0 else e.path.name}"]
    if e.encodings is None:
        return lines + [f"{pad}  (does not load: see problems)"]
    enc = e.encodings
    version = getattr(enc, "version", "") or enc.schema
    lines.append(f"{pad}  schema {enc.schema}"
                 + (f" (version {version})" if version != enc.schema else "")
                 + f"; {len(enc.params)} params, {len(enc.activations)} activations")
    rows = e.rows()
    blocks = any(r[5] for r in rows)
    head = ("class", "enc type", "bw", "dtype", "sym") + (("block",) if blocks else ()) + ("count",)
    body = [(cls, kind, str(bw), dtype, "yes" if sym else "no")
            + ((str(block) if block else "-",) if blocks else ()) + (str(n),)
            for cls, kind, bw, dtype, sym, block, n in rows]
    right = {2, len(head) - 1} | ({5} if blocks else set())
    return lines + table(body, indent=indent + 2, header=head, right=right)


def io_rows(values: dict) -> list:
    """(name, dtype, shape), runs of names differing in one number folded into one row:
    past_key_{0..5}_in."""
    groups: dict = {}
    for name, (dtype, shape) in values.items():
        key = (re.sub(r"\d+", "#", name), dtype, shape)
        groups.setdefault(key, []).append(name)
    rows = []
    for (_, dtype, shape), names in groups.items():
        rows.append(("  " + fold(names), dtype, "x".join(str(d) if d else "?" for d in shape)
                     or "scalar"))
    return rows


def fold(names: list) -> str:
    if len(names) == 1:
        return names[0]
    split = [re.split(r"(\d+)", n) for n in names]
    varying = [i for i in range(1, len(split[0]), 2) if len({s[i] for s in split}) > 1]
    if len(varying) != 1:
        return f"{names[0]} (+{len(names) - 1} alike)"
    i = varying[0]
    numbers = sorted(int(s[i]) for s in split)
    span = (f"{numbers[0]}..{numbers[-1]}" if numbers == list(range(numbers[0], numbers[-1] + 1))
            else ",".join(map(str, numbers)))
    return "".join(split[0][:i]) + "{" + span + "}" + "".join(split[0][i + 1:])


def table(rows: list, indent: int, header: Optional[tuple], right: set = frozenset()) -> list:
    return tables.table(header, rows, right=right, indent=indent)


def wrap(lead: str, items: list) -> list:
    lines, current = [], lead
    for item in items:
        if len(current) + 2 + len(item) > WIDTH and current.strip():
            lines.append(current)
            current = " " * 4 + item
        else:
            current += ("  " if current.strip() and not current.endswith(":") else " ") + item
    lines.append(current)
    return lines


def human(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def plural(n: int, word: str) -> str:
    if n == 1:
        return f"1 {word}"
    return f"{n} {word[:-4] + 'files' if word.endswith(' file') else word + 's'}"
