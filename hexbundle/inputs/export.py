"""The user's exported inputs (real models): where they are expected and what to do if not."""
from __future__ import annotations

import errno
import os
from pathlib import Path

from hexbundle.config.layout import Layout
from hexbundle.formats.qaihm import recorded_data_files
from hexbundle.formats.tokenizer import special_token_ids
from hexbundle.support.errors import InputError


def missing_exports(layout: Layout) -> list:
    """The user's files the build reads that are not there (the unsplit graphs when the export
    is split locally)."""
    return [p for p in layout.source_inputs() if not p.is_file()]


def _shown(layout: Layout, path: Path) -> str:
    """The path as the config names it (project-relative, links not followed): the export's
    file, not where a symbolic link there points."""
    try:
        return str(Path(path).relative_to(layout.root))
    except ValueError:
        return str(path)


def _why_missing(path: Path) -> str:
    """Why a path is no file, when it is a symbolic link (a loop, or to nothing)."""
    if not os.path.islink(path):
        return ""
    target = os.readlink(path)
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f" (a symbolic link loop: it points at {target!r}, which leads back to it)"
        return f" (a symbolic link to {target!r}, which does not exist)"
    return f" (a symbolic link to {target!r}, which is not a regular file)"


def require_export(layout: Layout) -> None:
    """Every exported file is there and the tokenizer can serve the bundle; else an InputError
    naming every missing file and how the export is produced."""
    cfg = layout.cfg
    missing = missing_exports(layout)
    if missing:
        listed = "\n".join(f"  {_shown(layout, p)}{_why_missing(p)}" for p in missing[:12])
        more = f"\n  ... and {len(missing) - 12} more" if len(missing) > 12 else ""
        how = cfg.inputs.how_to_export or "export the model (ONNX + .data + AIMET .encodings)"
        graphs = [p for p in missing if p != layout.tokenizer]
        hows = ([f"How to produce them: {how}"] if graphs else []) + (
            [f"{_shown(layout, layout.tokenizer)}: no export writes it; it is the model's own "
             "tokenizer.json from its Hugging Face repository: put it there, or import again "
             "with --tokenizer FILE"] if layout.tokenizer in missing else [])
        raise InputError(f"{cfg.model.name}: {len(missing)} exported input file(s) missing:\n"
                         f"{listed}{more}\n" + "\n".join(hows))
    if layout.is_tree:   # each ONNX must still record the data files the import found
        graphs = ([layout.unsplit_files(k) for k in layout.unsplit_slots()] if layout.splits_locally
                  else [layout.graph_files(g) for p in cfg.plan.parts() for g in cfg.model.graphs(p)])
        for files in graphs:
            recorded = recorded_data_files(files.onnx)
            if set(recorded) != set(files.data):
                raise InputError(f"{files.onnx}: records data files {[p.name for p in recorded]}, "
                                 f"but {layout.model_config_path} lists "
                                 f"{[p.name for p in files.data]}; the export changed: re-run "
                                 "`doit import_export`")
    # A tokenizer.json that cannot serve the bundle fails now, not after hours of compiling.
    special_token_ids(layout.tokenizer, cfg.tokenizer_specials, cfg.model.architecture.vocab_size)
