"""The user's exported inputs (real models): where they are expected and what to do if not."""
from __future__ import annotations

import errno
import os
from pathlib import Path

from hexbundle.formats.qaihm import recorded_data_files
from hexbundle.formats.tokenizer import special_token_ids
from hexbundle.support.errors import InputError


def _shown(root: Path, path: Path) -> str:
    """The path as the config names it (project-relative, links not followed): the export's
    file, not where a symbolic link there points."""
    try:
        return str(Path(path).relative_to(root))
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


def require_export(sources: list, tokenizer: Path, graphs: list, specials: dict,
                   vocab_size: int, model: str, how_to_export: str, model_config: Path,
                   root: Path) -> None:
    """Every exported file (`sources`: the user's files the build reads) is there and the
    tokenizer can serve the bundle; else an InputError naming every missing file and how the
    export is produced. `graphs` (GraphInputs; none for generated inputs): each ONNX must still
    record the data files the import found in it (`model_config` lists them)."""
    missing = [p for p in sources if not p.is_file()]
    if missing:
        listed = "\n".join(f"  {_shown(root, p)}{_why_missing(p)}" for p in missing[:12])
        more = f"\n  ... and {len(missing) - 12} more" if len(missing) > 12 else ""
        how = how_to_export or "export the model (ONNX + .data + AIMET .encodings)"
        missing_graphs = [p for p in missing if p != tokenizer]
        hows = ([f"How to produce them: {how}"] if missing_graphs else []) + (
            [f"{_shown(root, tokenizer)}: no export writes it; it is the model's own "
             "tokenizer.json from its Hugging Face repository: put it there, or import again "
             "with --tokenizer FILE"] if tokenizer in missing else [])
        raise InputError(f"{model}: {len(missing)} exported input file(s) missing:\n"
                         f"{listed}{more}\n" + "\n".join(hows))
    for files in graphs:
        recorded = recorded_data_files(files.onnx)
        if set(recorded) != set(files.data):
            raise InputError(f"{files.onnx}: records data files {[p.name for p in recorded]}, "
                             f"but {model_config} lists "
                             f"{[p.name for p in files.data]}; the export changed: re-run "
                             "`doit import_export`")
    # A tokenizer.json that cannot serve the bundle fails now, not after hours of compiling.
    special_token_ids(tokenizer, specials, vocab_size)
