"""Write configs/devices.toml, the chipset table, from Qualcomm's own files in a qai-hub-models
wheel (hexbundle/config/qualcomm_wheel.py reads them, hexbundle/config/devices_table.py renders
the table; nothing of the wheel is imported or run).

    pip download qai-hub-models==0.65.0 --no-deps -d /tmp/q
    python3 scripts/make_devices.py --wheel /tmp/q/qai_hub_models-0.65.0-py3-none-any.whl

Needs PyYAML."""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hexbundle.config.devices_table import render_table  # noqa: E402
from hexbundle.config.qualcomm_wheel import htp_chipsets, read_qualcomm_wheel  # noqa: E402
from hexbundle.config.layout import ProjectLayout  # noqa: E402
from hexbundle.support.atomic import write_atomic  # noqa: E402
from hexbundle.support.errors import HexbundleError  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", required=True, type=Path, help="a qai-hub-models wheel")
    parser.add_argument("--out", type=Path, default=ProjectLayout(ROOT).devices_table,
                        help="where to write the table (default: configs/devices.toml)")
    args = parser.parse_args(argv)
    try:
        facts = read_qualcomm_wheel(args.wheel)
        write_atomic(args.out, render_table(facts).encode())
    except HexbundleError as exc:
        print(f"make_devices: {exc}", file=sys.stderr)
        return 1
    chips = htp_chipsets(facts)
    print(f"make_devices: wrote {args.out}: {len(chips)} chipsets with an HTP of "
          f"{len(facts.chipsets)} in qai-hub-models {facts.version}'s {facts.chipsets_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
