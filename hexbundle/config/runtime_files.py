"""The QAIRT runtime a board needs beside a Genie bundle: the one table of its files.

Which files, where they are in the SDK root, where they go in the bundle, which are required
and which optional, per board OS (the SDK's target folder names). The qairt backend's bundle
step copies them by this table (backends/qairt_runtime.py), run.sh is written from it
(formats/runscript.py), and check_bundle judges a bundle by it (checks/runtime_check.py).

Facts (docs/deploy.md): libQnnHtp, libQnnSystem and
libQnnHtpNetRunExtensions are loaded by bare name through LD_LIBRARY_PATH (PATH on Windows);
without the extensions library Genie only warns and ignores htp_backend_ext_config.json, so
it is required here. The skel runs on the NPU and is found through ADSP_LIBRARY_PATH; it lives
in lib/hexagon-vNN/unsigned/ of the SDK whatever the board's OS. libQnnHtpPrepare is for
on-device graph preparation, which prebuilt context binaries do not need: optional.
On Windows the skel is signature-checked and loads only with its signing catalog
(libqnnhtpvNN.cat) in the same folder (Qualcomm's Windows "HTP Library Loading" tutorial; every
win_arm64 onnxruntime-qnn wheel ships it beside the skel): required there, in dsp/. The
catalog is not a library: it is judged by the skel digests it lists (formats/catalog.py).
"""
from __future__ import annotations

from dataclasses import dataclass

LINUX = "aarch64-oe-linux-gcc11.2"
ANDROID = "aarch64-android"
WINDOWS = "aarch64-windows-msvc"
TARGETS = (LINUX, ANDROID, WINDOWS)

# A chipset entry names no OS; Qualcomm's table gives each chipset a "world": its usual OS.
# A board names its own (configs/boards/<board>.toml, [device] os).
WORLD_TARGETS = {"IoT": LINUX, "Automotive": LINUX, "Mobile": ANDROID, "XR": ANDROID,
                 "Compute": WINDOWS}
DEFAULT_TARGET = ANDROID

RUNTIME_MODES = ("bundled", "board")   # build.toml `runtime`: in the bundle, or on the board

# Bundle folders
LIB, DSP, BIN = "lib", "dsp", "bin"

# What the board's genie-t2t-run prints first: the Genie library version it loaded.
GENIE_VERSION_LINE = "Using libGenie.so version "
# glibc the SDK's aarch64 Linux libraries need (onnxruntime#26634)
MIN_GLIBC = "2.34"
# the libstdc++ symbol version every aarch64 QAIRT library needs (2.45.40 to 2.51.0, read from
# the onnxruntime-qnn wheels' files: their highest GLIBCXX_ version)
MIN_GLIBCXX = "GLIBCXX_3.4.29"


@dataclass(frozen=True)
class RuntimeFile:
    role: str            # what it is, for messages: "libGenie", "skel", ...
    sdk_path: str        # relative to the SDK root
    bundle_path: str     # relative to the bundle
    kind: str            # "cpu" (the board's CPU: ELF aarch64 / PE arm64), "hexagon", or
                         # "catalog" (Windows: the skel's signing catalog)
    required: bool
    by_name: bool        # Genie or QNN dlopen()s it by bare name: it must be in lib/


def is_windows(target: str) -> bool:
    return target == WINDOWS


RUNNER = "genie-t2t-run"   # the runner's role in the table


def script_name(target: str) -> str:
    """The bundle's launcher: run.sh, or run.cmd on Windows."""
    return "run.cmd" if is_windows(target) else "run.sh"


def _lib(target: str, stem: str) -> str:
    return f"{stem}.dll" if is_windows(target) else f"lib{stem}.so"


def catalog_name(dsp_arch: str) -> str:
    """The skel's signing catalog, as Qualcomm names it: libqnnhtpv73.cat (lower case)."""
    return f"libqnnhtpv{dsp_arch.lower().lstrip('v')}.cat"


def runtime_files(target: str, dsp_arch: str) -> tuple:
    """Every runtime file for a board OS (`target`) and a Hexagon version (`dsp_arch`, "v73")."""
    if target not in TARGETS:
        raise ValueError(f"unknown board OS {target!r}; one of {', '.join(TARGETS)}")
    nn = dsp_arch.lower().lstrip("v")
    lib_dir = f"lib/{target}"
    cpu = [("libGenie", "Genie", True, False),
           ("libQnnHtp", "QnnHtp", True, True),
           ("libQnnSystem", "QnnSystem", True, True),
           ("libQnnHtpNetRunExtensions", "QnnHtpNetRunExtensions", True, True),
           ("stub", f"QnnHtpV{nn}Stub", True, True),
           ("libQnnHtpPrepare", "QnnHtpPrepare", False, True)]
    files = [RuntimeFile(role, f"{lib_dir}/{_lib(target, stem)}", f"{LIB}/{_lib(target, stem)}",
                         "cpu", required, by_name)
             for role, stem, required, by_name in cpu]
    skel = f"libQnnHtpV{nn}Skel.so"
    files.append(RuntimeFile("skel", f"lib/hexagon-v{nn}/unsigned/{skel}", f"{DSP}/{skel}",
                             "hexagon", True, True))
    if is_windows(target):
        cat = catalog_name(dsp_arch)
        files.append(RuntimeFile("skel's signing catalog", f"lib/hexagon-v{nn}/unsigned/{cat}",
                                 f"{DSP}/{cat}", "catalog", True, False))
    runner = "genie-t2t-run.exe" if is_windows(target) else "genie-t2t-run"
    files.append(RuntimeFile(RUNNER, f"bin/{target}/{runner}", f"{BIN}/{runner}",
                             "cpu", True, False))
    return tuple(files)


# The onnxruntime-qnn wheels that carry a board OS's QAIRT runtime (requirements/ortqnn-runtime.txt,
# backends/ortqnn_runtime.py): their pip platform tag. No wheel carries an Android runtime.
WHEEL_PLATFORMS = {LINUX: "manylinux_2_34_aarch64", WINDOWS: "win_arm64"}
WHEEL_DIR = "onnxruntime_qnn/"   # every runtime file sits flat here, under its bundle name


def wheel_member(f: RuntimeFile) -> str:
    """Where a runtime file is in an onnxruntime-qnn wheel of its board OS: flat, under the
    name it has in the bundle (libGenie.so / Genie.dll, libQnnHtpV73Skel.so, libqnnhtpv73.cat,
    ...: read from 2.1.0-2.7.0's Linux aarch64 and win_arm64 wheels). genie-t2t-run is in none."""
    return WHEEL_DIR + f.bundle_path.rsplit("/", 1)[-1]


# Other Genie clients' files in a bundle: where they go (formats/genie_clients.py writes them,
# docs/deploy.md). Neither client runs on Windows.
CLIENTS = "clients"
OPEN_GENIE_SERVER = f"{CLIENTS}/open-genie-server"    # its working directory
OPEN_GENIE_SERVER_SDK = "sdk"     # its QAIRT_SDK_ROOT, relative to its working directory
CLIENT_TARGETS = (LINUX, ANDROID)


def client_paths(model: str, target: str, dsp_arch: str) -> dict:
    """{role: bundle path} of the clients' files in a bundle carrying its runtime for `target`
    ({} for a board OS neither client runs on): open-genie-server's config, its slot folder
    (named after the model: the model's id there) and the skel at its SDK path under its
    QAIRT_SDK_ROOT; chipwright's run block."""
    if target not in CLIENT_TARGETS:
        return {}
    skel = next(f for f in runtime_files(target, dsp_arch) if f.role == "skel")
    return {"env_config": f"{OPEN_GENIE_SERVER}/env_config.json",
            "slot_config": f"{OPEN_GENIE_SERVER}/{model}/genie_config.json",
            "skel": f"{OPEN_GENIE_SERVER}/{OPEN_GENIE_SERVER_SDK}/{skel.sdk_path}",
            "chipwright": f"{CLIENTS}/chipwright.json"}


def target_for(world: str, board_os: str = "") -> str:
    """The board OS of a device: the board's own, else its chipset's world's usual one."""
    return board_os or WORLD_TARGETS.get(world, DEFAULT_TARGET)
