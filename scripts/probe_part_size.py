"""One part's size check on its own: the seeds' trap for a part too big to build whole here.

    python3 scripts/probe_part_size.py PART [key=value ...]     (e.g. 2 model=qwen2.5-7b-shape
                                                                 backend=ortqnn)

The part's bin must be built already (`doit compile:part_N_of_M ...`). With backend ortqnn this
compiles the probe the size check judges by (checks/sizes.py probe_part: the part again with its
4-bit weights stored as bytes) and prints the size check's table row, then the bin's size beside
the plan's expected_part_mib (the seeds' measured sizes for qwen2.5-7b-shape). Exit 1 when the
size check fails for the part. docs/full-scale.md records a run.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hexbundle.backends.registry import get_backend  # noqa: E402
from hexbundle.checks.sizes import MIB, format_probed_table, probe_part   # noqa: E402
from hexbundle.config.build import load_build                     # noqa: E402
from hexbundle.config.layout import Layout                        # noqa: E402
from hexbundle.steps.options import bundle_options                # noqa: E402
from hexbundle.support.errors import HexbundleError               # noqa: E402


def main(argv: list) -> int:
    if not argv or not argv[0].isdigit():
        print(__doc__, file=sys.stderr)
        return 2
    index = int(argv[0])
    overrides = dict(a.split("=", 1) for a in argv[1:])
    try:
        cfg = load_build(ROOT, overrides)
        layout = Layout(cfg)
        options = bundle_options(layout)
        backend = get_backend(cfg.backend)
        parts = {p.index: (p, c) for p, c in zip(cfg.plan.parts(), options.compile)}
        if index not in parts:
            print(f"probe_part_size: plan {cfg.plan.name} has parts {sorted(parts)}",
                  file=sys.stderr)
            return 2
        part, compiled_with = parts[index]
        if not layout.bin(part).is_file():
            print(f"probe_part_size: {layout.rel(layout.bin(part))} missing: run `python3 -m doit "
                  f"compile:{part.tag} " + " ".join(argv[1:]) + "` first", file=sys.stderr)
            return 2
        row = probe_part(layout, backend, part, options.convert, compiled_with)
    except HexbundleError as exc:
        print(f"probe_part_size: {exc}", file=sys.stderr)
        return 1
    print(format_probed_table(cfg.model, cfg.plan, [row]))
    expected = list(getattr(cfg.plan, "expected_part_mib", None) or [])
    if len(expected) >= index:
        mib = row.actual / MIB
        print(f"part {index}: {row.actual} B = {mib:.2f} MiB; the plan's expected "
              f"{expected[index - 1]} MiB (ratio {mib / expected[index - 1]:.4f})")
    return 0 if row.verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
