"""The user's exported inputs (real models): where they are expected and what to do if not."""
from __future__ import annotations

from pathlib import Path

from .config import BuildConfig
from .layout import Layout


# The generator's source: generated inputs are rebuilt when it changes. (Not imported here:
# importing onnx costs ~1 s, which a no-op `doit bundle` must not pay.)
GENERATOR_SOURCE = Path(__file__).with_name("tinygen.py")


def missing_exports(cfg: BuildConfig, layout: Layout) -> list:
    from .stages import all_inputs
    return [p for p in all_inputs(cfg, layout) if not p.is_file()]


def require_export(cfg: BuildConfig, layout: Layout):
    """doit action: fail, naming every missing file and how the export is produced."""
    from doit.exceptions import TaskFailed
    missing = missing_exports(cfg, layout)
    if not missing:
        return True
    listed = "\n".join(f"  {layout.rel(p)}" for p in missing[:12])
    more = f"\n  ... and {len(missing) - 12} more" if len(missing) > 12 else ""
    how = cfg.inputs["how_to_export"] or "export the model (ONNX + .data + AIMET .encodings)"
    return TaskFailed(f"{cfg.model.name}: {len(missing)} exported input file(s) missing:\n"
                      f"{listed}{more}\nHow to produce them: {how}")
