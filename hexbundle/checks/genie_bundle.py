"""`doit check_bundle --path DIR`: lint any Genie bundle directory before a device sees it -- one
`doit bundle` made, one downloaded from AI Hub, or one assembled by hand as ai-hub-apps'
manual_bundle.md describes (genie_config.json, htp_backend_ext_config.json, tokenizer.json and
the context binaries side by side). Every problem is listed; the command exits non-zero if any.

Checks that work on any bundle (QNN context binaries from any tool):
  files        the three JSON files present and parseable; the tokenizer and extension paths
               genie_config.json names exist in the bundle
  genie        genie_config.json's structure: every object Qualcomm's dialog schema requires,
               with its value types ("version": 1 on each); max-num-tokens <= context size
  ctx-bins     each listed once, each present (a plain file name in the bundle), no .bin left
               unlisted, in pipeline order: numbered 1..N of N, listed in that order, and names
               that sort in that order (loaders that sort by name must see the same pipeline)
  tokenizer    tokenizer.json loaded by the `tokenizers` library; its ids < n-vocab; bos, eos
               and eot ids in range and tokens of the tokenizer
  device       htp_backend_ext_config.json's soc_model / dsp_arch pairs against Qualcomm's
               chipset table (configs/devices.toml, generated from qai-hub-models' files)
  sizes        each context binary <= 4 GiB (the HTP's 32-bit address space per context: why
               7B models are split), and the total
  model        with --model-config (the model's Hugging Face config.json): n-vocab, rope-theta,
               kv-dim, pos-id-dim, RoPE scaling and the bos/eos ids against it
Checks that need hexbundle-format bins (the reference backend's; QNN bins are opaque here):
  graphs       each bin's graphs: their part numbers in ctx-bins order and every graph's
               context length <= the context size, the largest equal to it
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hexbundle.config.layout import GENIE_CONFIG, HTP_EXT_CONFIG, TOKENIZER
from hexbundle.support.errors import HexbundleError

CONTEXT_LIMIT_BYTES = 4 << 30
PART_NAME = re.compile(r"(\d+)_of_(\d+)")

# Qualcomm's dialog schema as genie_config.json needs it: key -> type, or a nested table.
# (number: int or float; ids: an int or a list of ints)
NUMBER, IDS = (int, float), "ids"
DIALOG_SCHEMA = {
    "version": int, "type": str, "max-num-tokens": int,
    "context": {"version": int, "size": int, "n-vocab": int, "bos-token": IDS,
                "eos-token": IDS},
    "sampler": {"version": int, "seed": int, "temp": NUMBER, "top-k": int, "top-p": NUMBER},
    "tokenizer": {"version": int, "path": str},
    "engine": {"version": int, "n-threads": int,
               "backend": {"version": int, "type": str, "extensions": str,
                           "QnnHtp": {"version": int, "use-mmap": bool, "spill-fill-bufsize": int,
                                      "mmap-budget": int, "poll": bool, "cpu-mask": str,
                                      "kv-dim": int, "pos-id-dim": int, "rope-theta": int}},
               "model": {"version": int, "type": str,
                         "binary": {"version": int, "ctx-bins": list}}},
}


@dataclass
class BundleReport:
    path: Path
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    checked: list = field(default_factory=list)    # the checks that ran

    def problem(self, check: str, message: str) -> None:
        self.problems.append(f"[{check}] {message}")


def check_bundle(bundle: Path, chipsets: dict, model_config: Optional[Path] = None
                 ) -> BundleReport:
    """Every check of the module docstring on `bundle`. `chipsets`: soc_model -> dsp_arch of
    Qualcomm's table."""
    report = BundleReport(Path(bundle))
    if not report.path.is_dir():
        report.problem("files", f"{bundle}: not a directory")
        return report
    genie = _read_json(report, GENIE_CONFIG)
    htp = _read_json(report, HTP_EXT_CONFIG)
    dialog = genie.get("dialog") if isinstance(genie, dict) else None
    if genie is not None and not isinstance(dialog, dict):
        report.problem("genie", f"{GENIE_CONFIG}: no top-level object 'dialog'")
    if isinstance(dialog, dict):
        _check_schema(report, dialog, DIALOG_SCHEMA, "dialog")
        _check_paths(report, dialog)
        bins = _check_ctx_bins(report, dialog)
        _check_context(report, dialog, bins)
        _check_tokenizer(report, dialog)
        if model_config:
            _check_model_config(report, dialog, Path(model_config))
    if htp is not None:
        _check_device(report, htp, chipsets)
    _check_sizes(report)
    return report


# ============================================================================ files and schema


def _read_json(report: BundleReport, name: str):
    path = report.path / name
    report.checked.append(f"files: {name}")
    if not path.is_file():
        report.problem("files", f"{name}: missing from the bundle")
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        report.problem("files", f"{name}: not readable JSON ({exc})")
        return None


def _dig(table, *keys):
    for key in keys:
        if not isinstance(table, dict) or key not in table:
            return None
        table = table[key]
    return table


def _type_ok(value, kind) -> bool:
    if kind == IDS:
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, list) and value and all(isinstance(v, int) for v in value))
    if kind is int or kind == NUMBER:
        return isinstance(value, kind) and not isinstance(value, bool)
    return isinstance(value, kind)


def _check_schema(report: BundleReport, table: dict, schema: dict, where: str) -> None:
    report.checked.append(f"genie: {where}")
    for key, kind in schema.items():
        if key not in table:
            report.problem("genie", f"{GENIE_CONFIG}: '{where}.{key}' is missing")
        elif isinstance(kind, dict):
            if isinstance(table[key], dict):
                _check_schema(report, table[key], kind, f"{where}.{key}")
            else:
                report.problem("genie", f"{GENIE_CONFIG}: '{where}.{key}' must be an object")
        elif not _type_ok(table[key], kind):
            want = "an id or a list of ids" if kind == IDS else (
                kind.__name__ if isinstance(kind, type) else "a number")
            report.problem("genie", f"{GENIE_CONFIG}: '{where}.{key}' is {table[key]!r}, "
                                    f"expected {want}")
        elif key == "version" and table[key] != 1:
            report.problem("genie", f"{GENIE_CONFIG}: '{where}.version' is {table[key]}, not 1")
    for key, want in (("type", "basic"),):
        if where == "dialog" and table.get(key) not in (None, want):
            report.problem("genie", f"{GENIE_CONFIG}: 'dialog.{key}' is {table[key]!r}, "
                                    f"not {want!r}")
    if where == "dialog.engine.backend" and table.get("type") not in (None, "QnnHtp"):
        report.problem("genie", f"{GENIE_CONFIG}: '{where}.type' is {table['type']!r}, not "
                                "'QnnHtp'")


def _check_paths(report: BundleReport, dialog: dict) -> None:
    for keys, what in ((("tokenizer", "path"), "tokenizer"),
                       (("engine", "backend", "extensions"), "HTP extensions config")):
        name = _dig(dialog, *keys)
        if isinstance(name, str) and not (report.path / name).is_file():
            report.problem("files", f"{GENIE_CONFIG}: 'dialog.{'.'.join(keys)}' names {name!r}"
                                    f" ({what}), which is not in the bundle")


# ============================================================================ ctx-bins


def _check_ctx_bins(report: BundleReport, dialog: dict) -> list:
    """The listed bins that exist, in listed order."""
    report.checked.append("ctx-bins")
    listed = _dig(dialog, "engine", "model", "binary", "ctx-bins")
    if not isinstance(listed, list) or not listed:
        report.problem("ctx-bins", f"{GENIE_CONFIG}: 'ctx-bins' lists no context binary")
        return []
    key = "'dialog.engine.model.binary.ctx-bins'"
    present = []
    for index, name in enumerate(listed):
        if not isinstance(name, str) or Path(name).name != name:
            report.problem("ctx-bins", f"{key}[{index}] is {name!r}: a file name in the bundle "
                                       "is expected")
            continue
        if listed.index(name) != index:
            report.problem("ctx-bins", f"{key}[{index}] lists {name} again")
            continue
        if not (report.path / name).is_file():
            report.problem("ctx-bins", f"{key}[{index}] is {name}, which is not in the bundle")
            continue
        present.append(name)
    stray = sorted(p.name for p in report.path.glob("*.bin") if p.name not in listed)
    if stray:
        report.problem("ctx-bins", f"{', '.join(stray)}: in the bundle but not in {key}: "
                                   "list it in pipeline order or remove it")
    _check_order(report, [n for n in listed if isinstance(n, str)], key)
    return present


def _check_order(report: BundleReport, names: list, key: str) -> None:
    numbers = [PART_NAME.search(n) for n in names]
    if all(numbers):
        index = [int(m.group(1)) for m in numbers]
        counts = {int(m.group(2)) for m in numbers}
        if counts != {len(names)} or index != list(range(1, len(names) + 1)):
            report.problem("ctx-bins", f"{key} is not parts 1..{len(names)} of {len(names)} in "
                                       f"order: {', '.join(names)}")
    if sorted(names) != names:
        report.problem("ctx-bins", f"{key}: the names sort as {', '.join(sorted(names))}, not in "
                                   "the listed order: a loader that sorts by name would feed the "
                                   "parts out of order (fewer than 10 parts, or zero-padded "
                                   "numbers)")


# ============================================================================ context and graphs


def _check_context(report: BundleReport, dialog: dict, bins: list) -> None:
    size = _dig(dialog, "context", "size")
    most = dialog.get("max-num-tokens")
    if isinstance(size, int) and isinstance(most, int) and most > size:
        report.problem("genie", f"'dialog.max-num-tokens' {most} exceeds the context size {size}")
    lengths = _graph_context_lengths(report, bins)
    if lengths and isinstance(size, int):
        if max(lengths.values()) != size:
            report.problem("graphs", f"'dialog.context.size' is {size} but the bins' largest "
                                     f"context length is {max(lengths.values())} "
                                     f"({max(lengths, key=lengths.get)})")


def _graph_context_lengths(report: BundleReport, bins: list) -> dict:
    """graph -> context length (its attention mask's last dimension), from hexbundle-format
    bins; also their part numbers against the listed order. {} for QNN bins."""
    from hexbundle.formats.ctxbin import read_ctxbin
    from hexbundle.support.errors import FormatError
    lengths, foreign = {}, []
    for position, name in enumerate(bins, start=1):
        try:
            reader = read_ctxbin(report.path / name)
        except (FormatError, OSError):
            foreign.append(name)
            continue
        with reader:
            for graph in reader.graph_names:
                part = PART_NAME.search(graph)
                if part and int(part.group(1)) != position:
                    report.problem("graphs", f"{name} (ctx-bins position {position}) holds graph "
                                             f"{graph} of part {part.group(1)}")
                mask = [s for s in reader.graph(graph).inputs if "mask" in s.name]
                if mask and mask[0].shape:
                    lengths[graph] = int(mask[0].shape[-1])
    report.checked.append("graphs" if not foreign else "graphs (hexbundle-format bins only)")
    if foreign:
        report.notes.append(f"{len(foreign)} bin(s) not in hexbundle's format (QNN context "
                            "binaries): their graphs' context lengths and part order are not "
                            "checked")
    return lengths


# ============================================================================ tokenizer


def _ids(value) -> list:
    return value if isinstance(value, list) else [value] if isinstance(value, int) else []


def _check_tokenizer(report: BundleReport, dialog: dict) -> None:
    report.checked.append("tokenizer")
    name = _dig(dialog, "tokenizer", "path") or TOKENIZER
    path = report.path / name if isinstance(name, str) else report.path / TOKENIZER
    if not path.is_file():
        return   # reported by the paths check
    try:
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_str(path.read_text())
    except Exception as exc:   # the library raises its own exception types
        report.problem("tokenizer", f"{path.name}: the tokenizers library cannot load it ({exc})")
        return
    n_vocab = _dig(dialog, "context", "n-vocab")
    largest = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    if isinstance(n_vocab, int) and largest >= n_vocab:
        report.problem("tokenizer", f"{path.name} has token id {largest}, but 'dialog.context."
                                    f"n-vocab' is {n_vocab}: the logits have no such column")
    for role in ("bos-token", "eos-token", "eot-token"):
        for token_id in _ids(_dig(dialog, "context", role)):
            if isinstance(n_vocab, int) and not 0 <= token_id < n_vocab:
                report.problem("tokenizer", f"'dialog.context.{role}' {token_id} is outside "
                                            f"[0, n-vocab {n_vocab})")
            elif tokenizer.id_to_token(token_id) is None:
                report.problem("tokenizer", f"'dialog.context.{role}' {token_id} is no token "
                                            f"of {path.name}")


# ============================================================================ the model's config.json


def _check_model_config(report: BundleReport, dialog: dict, path: Path) -> None:
    report.checked.append("model")
    try:
        model = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        report.problem("model", f"{path}: not readable JSON ({exc})")
        return
    htp = _dig(dialog, "engine", "backend", "QnnHtp") or {}
    heads = model.get("num_attention_heads")
    head_dim = model.get("head_dim") or (model["hidden_size"] // heads
                                         if heads and model.get("hidden_size") else None)
    pairs = [("context.n-vocab", _dig(dialog, "context", "n-vocab"), "vocab_size",
              model.get("vocab_size")),
             ("engine.backend.QnnHtp.rope-theta", htp.get("rope-theta"), "rope_theta",
              model.get("rope_theta")),
             ("engine.backend.QnnHtp.kv-dim", htp.get("kv-dim"), "head_dim", head_dim),
             ("engine.backend.QnnHtp.pos-id-dim", htp.get("pos-id-dim"), "head_dim / 2",
              head_dim // 2 if head_dim else None)]
    for key, got, source, want in pairs:
        if want is not None and got is not None and got != want:
            report.problem("model", f"'dialog.{key}' is {got}, {path.name} {source} is {want}")
    for role, source in (("bos-token", "bos_token_id"), ("eos-token", "eos_token_id")):
        want, got = _ids(model.get(source)), _ids(_dig(dialog, "context", role))
        if want and got and not set(got) & set(want):
            report.problem("model", f"'dialog.context.{role}' {got} is not {path.name} "
                                    f"{source} {want}")
    scaling = model.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) not in (
            None, "default"):
        block = _dig(dialog, "engine", "backend", "QnnHtp", "positional-encoding") or \
            _dig(dialog, "positional-encoding")
        given = _dig(block, "rope-scaling") if isinstance(block, dict) else None
        kind = scaling.get("rope_type", scaling.get("type"))
        if not isinstance(given, dict):
            report.problem("model", f"{path.name} has rope_scaling of type {kind!r} (factor "
                                    f"{scaling.get('factor')}), but {GENIE_CONFIG} gives no "
                                    "'rope-scaling': the device would use plain RoPE tables")
        elif given.get("factor") != scaling.get("factor"):
            report.problem("model", f"'rope-scaling.factor' is {given.get('factor')}, "
                                    f"{path.name} says {scaling.get('factor')}")


# ============================================================================ device and sizes


def _check_device(report: BundleReport, htp: dict, chipsets: dict) -> None:
    report.checked.append("device")
    devices = htp.get("devices") if isinstance(htp, dict) else None
    if not isinstance(devices, list) or not devices:
        report.problem("device", f"{HTP_EXT_CONFIG}: no 'devices' list")
        return
    archs = set(chipsets.values())
    for index, device in enumerate(devices):
        soc, arch = (device.get("soc_model"), device.get("dsp_arch")) \
            if isinstance(device, dict) else (None, None)
        where = f"{HTP_EXT_CONFIG}: devices[{index}]"
        if arch not in archs:
            report.problem("device", f"{where}: dsp_arch {arch!r} is no Hexagon version of "
                                     f"Qualcomm's chipset table (known: "
                                     f"{', '.join(sorted(archs))})")
        if soc not in chipsets:
            report.problem("device", f"{where}: soc_model {soc!r} is not in Qualcomm's chipset "
                                     "table")
        elif arch in archs and chipsets[soc] != arch:
            report.problem("device", f"{where}: soc_model {soc} is a {chipsets[soc]} chipset, "
                                     f"not {arch} (the device refuses the context: err 1008)")


def _check_sizes(report: BundleReport) -> None:
    report.checked.append("sizes")
    total = 0
    for path in sorted(report.path.glob("*.bin")):
        size = path.stat().st_size
        total += size
        if size > CONTEXT_LIMIT_BYTES:
            report.problem("sizes", f"{path.name}: {size / (1 << 30):.2f} GiB, over the 4 GiB an "
                                    "HTP context can map: split the model into more parts")
    report.notes.append(f"context binaries: {total / (1 << 20):.2f} MiB in all")


# ============================================================================ the command


def check_bundle_command(root: str, path: str = "", model_config: str = "") -> None:
    """`doit check_bundle --path DIR [--model-config config.json]`; the chipset table is the
    project's (root)."""
    from hexbundle.config.devices import read_table
    from hexbundle.config.layout import ProjectLayout
    if not path:
        raise HexbundleError("check_bundle: give the bundle directory: --path DIR")
    table = read_table(ProjectLayout(Path(root)))
    chipsets = {soc: row["dsp_arch"] for soc, row in table["qualcomm_soc_models"].items()}
    report = check_bundle(Path(path), chipsets, Path(model_config) if model_config else None)
    for note in report.notes:
        print(f"  note: {note}")
    for problem in report.problems:
        print(f"  PROBLEM {problem}")
    verdict = (f"{len(report.problems)} problem(s)" if report.problems else "no problem")
    print(f"check_bundle {path}: {verdict} ({len(report.checked)} checks)", flush=True)
    if report.problems:
        raise HexbundleError(f"check_bundle: {path}: {len(report.problems)} problem(s), listed "
                             "above")
