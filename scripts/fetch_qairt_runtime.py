"""Fetch Qualcomm's QAIRT runtime files for the tests: the onnxruntime-qnn wheels pinned, by
hash, in requirements/qairt-runtime.txt (standard library and pip only; .ci/run runs it).

    fetch_qairt_runtime.py [--requirements FILE] [--cache DIR]

Each pinned line is one wheel: `pip download --no-deps --require-hashes --only-binary=:all:`
for the platform its comment names (`# platform: win_arm64`), for CPython 3.12 (the only one
the Linux aarch64 wheels are built for; the runtime files do not depend on it). The wheels are
never installed. Of each, only the Hexagon v73 runtime files are kept (libGenie, QnnHtp,
QnnSystem, NetRunExtensions, the V73 stub and skel, libqnnhtpv73.cat), as
<cache>/onnxruntime-qnn-<versions>/<wheel file name without .whl>/<file>, a directory named
after the pins; a copy of the requirements file beside them marks it complete, so a second run
with the same pins downloads nothing. Prints the directory (the tests' HEXBUNDLE_QAIRT_WHEELS).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^(onnxruntime-qnn==(\S+))\s+(--hash=sha256:[0-9a-f]{64})"
                 r"\s+#\s*platform:\s*(\S+)")
KEEP = {"libGenie.so", "Genie.dll", "libQnnHtp.so", "QnnHtp.dll", "libQnnSystem.so",
        "QnnSystem.dll", "libQnnHtpNetRunExtensions.so", "QnnHtpNetRunExtensions.dll",
        "libQnnHtpV73Stub.so", "QnnHtpV73Stub.dll", "libQnnHtpV73Skel.so", "libqnnhtpv73.cat"}
MARKER = "hexbundle-requirements.txt"


def fail(msg: str) -> None:
    print(f"fetch_qairt_runtime: ERROR: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def pins(requirements: Path) -> list:
    """[(requirement, version, hash option, platform)] of the file's pinned lines."""
    found = []
    for line in requirements.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            m = PIN.match(line.strip())
            if not m:
                fail(f"{requirements}: {line!r} is not `onnxruntime-qnn==V --hash=sha256:H  "
                     "# platform: P`")
            found.append(m.groups())
    if not found:
        fail(f"{requirements}: no pinned wheel")
    return found


def cache_dir(requirements: Path, cache: Path) -> Path:
    versions = sorted({version for _, version, _, _ in pins(requirements)})
    return cache / f"onnxruntime-qnn-{'+'.join(versions)}"


def download(requirement: str, digest: str, platform: str, work: Path) -> Path:
    req = work / "req.txt"
    req.write_text(f"{requirement} {digest}\n")
    out = work / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--require-hashes", "--only-binary=:all:", "--python-version", "3.12",
                    "--platform", platform, "-r", str(req), "-d", str(out)], check=True)
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        fail(f"{requirement} for {platform}: pip left {len(wheels)} wheels")
    return wheels[0]


def extract(wheel: Path, dest: Path) -> int:
    dest.mkdir(parents=True)
    kept = 0
    with zipfile.ZipFile(wheel) as whl:
        for name in whl.namelist():
            base = name.rsplit("/", 1)[-1]
            if base in KEEP:
                (dest / base).write_bytes(whl.read(name))
                kept += 1
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requirements", type=Path, default=ROOT / "requirements" /
                        "qairt-runtime.txt")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hexbundle")
    args = parser.parse_args()
    final = cache_dir(args.requirements, args.cache)
    marker = final / MARKER
    if marker.is_file() and marker.read_bytes() == args.requirements.read_bytes():
        print(final)
        return
    staging = Path(f"{final}.new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for requirement, _, digest, platform in pins(args.requirements):
        with tempfile.TemporaryDirectory() as work:
            wheel = download(requirement, digest, platform, Path(work))
            kept = extract(wheel, staging / wheel.name[:-len(".whl")])
            print(f"  {wheel.name}: {kept} runtime file(s) kept", file=sys.stderr)
    shutil.copyfile(args.requirements, staging / MARKER)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    print(final)


if __name__ == "__main__":
    main()
