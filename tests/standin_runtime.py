"""The stand-in SDK's runtime files (tests only): REAL binaries, built here, at the real SDK's
paths for the three board OSes (hexbundle/config/runtime_files.py is the table they follow).

  aarch64 ELF   Debian's cross compiler (gcc-aarch64-linux-gnu): lib/<target>/lib*.so and
                bin/<target>/genie-t2t-run, for aarch64-oe-linux-gcc11.2 and aarch64-android
  arm64 PE      clang --target=aarch64-pc-windows-msvc + lld-link: lib/aarch64-windows-msvc/*.dll
                and bin/aarch64-windows-msvc/genie-t2t-run.exe
  Hexagon ELF   clang --target=hexagon: lib/hexagon-vNN/unsigned/libQnnHtpVNNSkel.so. LLVM 14
                (Debian 12's clang) knows CPUs up to hexagonv69, so the skel is built for v69 and
                its e_flags' architecture field set to NN, as the SDK's own skels carry it.
  catalog       Windows: the skel's signing catalog, libqnnhtpvNN.cat, holding the skel's
                SHA-256 and SHA-1 as the real ones do (formats/catalog.py)
  x86-64 ELF    the host's cc: a library of the wrong CPU, for the refusal tests
Each says its release in its bytes as the real file of its role does (the onnxruntime-qnn
wheels' files): QnnHtp, the stub and the skel the build string and `AISW_VERSION: X.Y.Z`,
libGenie and NetRunExtensions AISW_VERSION only, QnnSystem, genie-t2t-run and the catalog
nothing. The release is the stand-in sdk.yaml's, 2.42.0.251225: v2.42.0.251225135753_193295.

The tools come from .ci/run's apt-get install; a missing one fails the test naming the package.
"""
from __future__ import annotations

import hashlib
import shutil
import struct
import subprocess
from pathlib import Path

from hexbundle.config.runtime_files import TARGETS, WINDOWS, runtime_files

STANDIN_SDK = Path(__file__).resolve().parent / "standin_qairt"
TOOLS = {"aarch64-linux-gnu-gcc": "gcc-aarch64-linux-gnu", "clang": "clang",
         "lld-link": "lld", "cc": "gcc"}
ARCHS = ("v73", "v75")

LIB_C = 'const char *standin_name(void) { return "%s"; }\n'
VERSION_C = 'const char standin_%s[] = "%s";\n'
BUILD = "v2.42.0.251225135753_193295"      # the real QAIRT 2.42.0.251225's build string
# which roles carry which statement, as Qualcomm's own files do
STATES_BUILD = {"libQnnHtp", "stub", "skel", "libQnnHtpPrepare"}
STATES_AISW = STATES_BUILD | {"libGenie", "libQnnHtpNetRunExtensions"}
MAIN_C = '#include <stdio.h>\nint main(void) { puts("%s"); return 0; }\n'
PE_MAIN_C = "int mainCRTStartup(void) { return 0; }\n"


def need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise AssertionError(f"{tool} is not installed: apt-get install {TOOLS[tool]} "
                             "(.ci/run installs it)")
    return path


def run(*cmd) -> None:
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True)


def aarch64_so(src: Path, out: Path) -> None:
    run(need("aarch64-linux-gnu-gcc"), "-shared", "-fPIC", "-O1", src, "-o", out)


def aarch64_exe(src: Path, out: Path) -> None:
    run(need("aarch64-linux-gnu-gcc"), "-O1", src, "-o", out)


def x86_so(src: Path, out: Path) -> None:
    run(need("cc"), "-shared", "-fPIC", src, "-o", out)


def pe_dll(src: Path, out: Path) -> None:
    obj = out.with_suffix(".obj")
    run(need("clang"), "--target=aarch64-pc-windows-msvc", "-c", src, "-o", obj)
    run(need("lld-link"), "/dll", "/noentry", "/machine:arm64", obj, f"/out:{out}")
    obj.unlink()
    out.with_suffix(".lib").unlink(missing_ok=True)


def pe_exe(src: Path, out: Path) -> None:
    obj = out.with_suffix(".obj")
    run(need("clang"), "--target=aarch64-pc-windows-msvc", "-c", src, "-o", obj)
    run(need("lld-link"), "/entry:mainCRTStartup", "/subsystem:console", "/machine:arm64",
        obj, f"/out:{out}")
    obj.unlink()


def hexagon_so(src: Path, out: Path, arch: str) -> None:
    run(need("clang"), "--target=hexagon", "-mcpu=hexagonv69", "-shared", "-nostdlib",
        "-fuse-ld=lld", src, "-o", out)
    set_hexagon_arch(out, arch)


def set_hexagon_arch(path: Path, arch: str) -> None:
    """e_flags (offset 36 of a 32-bit ELF): EF_HEXAGON_MACH_VNN = 0xNN."""
    data = bytearray(path.read_bytes())
    assert data[:4] == b"\x7fELF" and data[4] == 1, path
    (flags,) = struct.unpack_from("<I", data, 36)
    struct.pack_into("<I", data, 36, (flags & ~0x3ff) | int(arch.lstrip("v"), 16))
    path.write_bytes(bytes(data))


def library_c(name: str, role: str, build: str = BUILD) -> str:
    """A library's source: its name, and the release statements a real one of `role` has."""
    text = LIB_C % name
    if role in STATES_AISW:
        text += VERSION_C % ("aisw", "AISW_VERSION: " + build.lstrip("v").rsplit(".", 1)[0])
    if role in STATES_BUILD:
        text += VERSION_C % ("build", build)
    return text


def catalog_for(skel: Path, out: Path) -> None:
    """A stand-in signing catalog: the skel's digests, as a real catalog lists its members."""
    data = skel.read_bytes()
    out.write_bytes(b"stand-in catalog\0" + hashlib.sha256(data).digest()
                    + hashlib.sha1(data).digest())


def build_runtime(sdk: Path, work: Path) -> Path:
    """The stand-in SDK copied to `sdk` with every runtime file of every target built in."""
    shutil.copytree(STANDIN_SDK, sdk, ignore=shutil.ignore_patterns("__pycache__"))
    work.mkdir(parents=True, exist_ok=True)
    for target in TARGETS:
        for arch in ARCHS:
            for f in runtime_files(target, arch):
                out = sdk / f.sdk_path
                if out.exists():
                    continue
                out.parent.mkdir(parents=True, exist_ok=True)
                src = work / (out.name + ".c")
                if f.kind == "catalog":
                    skel = [g for g in runtime_files(target, arch) if g.kind == "hexagon"][0]
                    catalog_for(sdk / skel.sdk_path, out)
                elif f.kind == "hexagon":
                    src.write_text(library_c(out.name, f.role))
                    hexagon_so(src, out, arch)
                elif f.role == "genie-t2t-run":
                    src.write_text(PE_MAIN_C if target == WINDOWS else MAIN_C % out.name)
                    (pe_exe if target == WINDOWS else aarch64_exe)(src, out)
                else:
                    src.write_text(library_c(out.name, f.role))
                    (pe_dll if target == WINDOWS else aarch64_so)(src, out)
    return sdk


def bin_sizes(project, device: str, backend: str = "qairt") -> dict:
    """The bytes the size model expects of each bin (the stand-in compile pads to them:
    $STANDIN_QAIRT_BIN_BYTES)."""
    from hexbundle.checks import sizes
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    from hexbundle.steps.options import bundle_options
    layout = Layout(load_build(project.root, {"backend": backend, "device": device}))
    o = bundle_options(layout)
    return {layout.bin_name(e.part): e.packed
            for e in sizes.expect_from_inputs(layout, o.convert, o.compile)}
