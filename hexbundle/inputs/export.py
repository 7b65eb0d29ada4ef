"""The user's exported inputs (real models): where they are expected and what to do if not."""
from __future__ import annotations

from pathlib import Path

from hexbundle.config.build import BuildConfig
from hexbundle.support.errors import InputError
from hexbundle.config.layout import Layout


# The generator's source: generated inputs are rebuilt when it changes. (Not imported here:
# importing onnx costs ~1 s, which a no-op `doit bundle` must not pay.)
GENERATOR_SOURCE = Path(__file__).with_name("synthetic.py")
# biggen streams tinygen's files to disk (the `inputs` task runs it): a change to either
# regenerates the inputs.
GENERATOR_SOURCES = (GENERATOR_SOURCE, Path(__file__).with_name("generate.py"))


def generator_digest() -> list:
    from hexbundle.support import hashing
    return [hashing.digest(p) for p in GENERATOR_SOURCES]


def missing_exports(cfg: BuildConfig, layout: Layout) -> list:
    from hexbundle.steps.runner import all_inputs
    return [p for p in all_inputs(cfg, layout) if not p.is_file()]


def require_export(cfg: BuildConfig, layout: Layout):
    """doit action: fail, naming every missing file and how the export is produced."""
    from doit.exceptions import TaskFailed
    missing = missing_exports(cfg, layout)
    if not missing:
        return _check_tokenizer(cfg, layout)
    listed = "\n".join(f"  {layout.rel(p)}" for p in missing[:12])
    more = f"\n  ... and {len(missing) - 12} more" if len(missing) > 12 else ""
    how = cfg.inputs["how_to_export"] or "export the model (ONNX + .data + AIMET .encodings)"
    return TaskFailed(f"{cfg.model.name}: {len(missing)} exported input file(s) missing:\n"
                      f"{listed}{more}\nHow to produce them: {how}")


def _check_tokenizer(cfg: BuildConfig, layout: Layout):
    """A tokenizer.json that cannot serve the bundle fails now, not after hours of compiling."""
    from doit.exceptions import TaskFailed
    from hexbundle.steps.bundle import special_token_ids
    from hexbundle.support.errors import HexbundleError
    try:
        special_token_ids(layout.tokenizer, cfg.tokenizer_specials,
                          cfg.model.architecture.vocab_size)
    except HexbundleError as exc:
        return TaskFailed(str(exc))
    return True


def pinned(cfg: BuildConfig, paths: list) -> dict:
    """The pins (from the model config's [inputs.pins]) that apply to these files."""
    pins = cfg.inputs.get("pins", {})
    return {p.name: pins[p.name] for p in paths if p.name in pins}


def check_pins(cfg: BuildConfig, paths: list) -> None:
    """A pinned input whose bytes changed is refused, naming the file and both digests."""
    from hexbundle.support import hashing
    for path in paths:
        pin = cfg.inputs.get("pins", {}).get(path.name)
        if pin is None:
            continue
        algorithm, want = pin.split(":", 1)
        if algorithm == "sha256":
            from hexbundle.support.hashing import sha256_file
            got = sha256_file(path)
        else:
            got = hashing.digest(path)
        if got != want:
            raise InputError(f"{path}: {algorithm} is {got}, but {cfg.model_path} pins "
                             f"[inputs.pins] {path.name!r} = \"{pin}\"; re-export the model or "
                             "update the pin if this change is intended")
