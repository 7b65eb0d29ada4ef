"""The bundle's launcher: run.sh (POSIX sh; Linux and Android boards) and run.cmd (Windows).
Writer (`render`) and reader (`library_paths`, what check_bundle judges).

Why a launcher (docs/deploy.md): relative paths in genie_config.json follow
the working directory, so it changes into the bundle; LD_LIBRARY_PATH finds the libraries QNN
loads by bare name; ADSP_LIBRARY_PATH is split on ';' only by fastrpc (a ':' joins nothing), and
fastrpc appends its own defaults after it, so the bundle's dsp/ goes first or a stale skel in
/usr/lib/rfsa/adsp wins (err 1008). Before the run it checks what the board must give: the
fastrpc node of the configured NPU, readable and writable; a bare libcdsprpc.so; glibc >= 2.34
and a libstdc++ with GLIBCXX_3.4.29 (every aarch64 QAIRT library needs both); and each runtime
file's own `AISW_VERSION: X.Y.Z` (the bundle's files, or the board's libGenie and libQnnHtp when
the board's install runs it). After the run it fails when the libGenie version genie-t2t-run
printed is not the bundle's. That Genie API version alone cannot name a release: it repeats
across QAIRT releases (2.46 and 2.47 both give 1.18.0, 2.49.40 and 2.50.40 both 1.20.0), which
is why the files' AISW_VERSION is checked first. `--profile FILE` is removed before the run:
genie-t2t-run refuses an existing profile file, so every second run would fail. run.cmd
checks, before the run, the size of each file run.sh checks the AISW_VERSION of (cmd reads no
binary: `_size_check`).

HEXBUNDLE_FASTRPC_NODE overrides the node checked (boards that name it otherwise).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from hexbundle.config.runtime_files import (BIN, DSP, GENIE_VERSION_LINE, LIB, MIN_GLIBC,
                                            MIN_GLIBCXX, WINDOWS)


@dataclass(frozen=True)
class RunScript:
    target: str           # board OS (config/runtime_files.TARGETS)
    runtime: str          # "bundled" | "board"
    qairt_version: str    # the compiling SDK's
    genie_version: str    # the libGenie version genie-t2t-run must print
    htp_device_id: int    # which NPU (IQ-9075: 0 or 1): its fastrpc node
    aisw_version: str = ""     # X.Y.Z: what each runtime file's AISW_VERSION must say
    aisw_files: tuple = ()     # the bundle's files that state it (bundle paths)
    sizes: tuple = ()          # ((bundle path, bytes), ...): run.cmd checks those files' sizes
    runner: str = "bundled"    # genie-t2t-run: in bin/ ("bundled"), or the board's ("board":
                               # the ortqnn bundles, whose wheels carry none)


def fastrpc_node(device_id: int) -> str:
    """/dev/fastrpc-cdsp for NPU 0, /dev/fastrpc-cdsp1 for NPU 1 (IQ-9075: domains 3 and 4)."""
    return "/dev/fastrpc-cdsp" + (str(device_id) if device_id else "")


def render(s: RunScript) -> str:
    return _render_cmd(s) if s.target == WINDOWS else _render_sh(s)


def _render_sh(s: RunScript) -> str:
    bundled = s.runtime == "bundled"
    android = s.target == "aarch64-android"
    lines = [
        "#!/bin/sh",
        "# Runs this Genie bundle: ./run.sh -c genie_config.json -p PROMPT [--profile OUT.json]",
        "# Written by hexbundle; check_bundle judges it and the manifest records its digest.",
        "set -eu",
        'HERE=$(cd "$(dirname "$0")" && pwd)',
        '# genie_config.json\'s relative paths follow the working directory',
        'cd "$HERE"',
        f'QAIRT_VERSION="{s.qairt_version}"',
        f'GENIE_VERSION="{s.genie_version}"',
        f'NODE="${{HEXBUNDLE_FASTRPC_NODE:-{fastrpc_node(s.htp_device_id)}}}"',
        "",
        "fail() {",
        '    echo "run.sh: $*" >&2',
        "    exit 2",
        "}",
        "",
    ]
    if bundled:
        lines += [
            f'LD_LIBRARY_PATH="$HERE/{LIB}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"',
            "# ';'-separated (fastrpc splits on ';' only); the bundle's skel first",
            f'ADSP_LIBRARY_PATH="$HERE/{DSP}${{ADSP_LIBRARY_PATH:+;$ADSP_LIBRARY_PATH}}"',
            "export LD_LIBRARY_PATH ADSP_LIBRARY_PATH",
        ]
        lines += [f'RUNNER="$HERE/{BIN}/genie-t2t-run"'] if s.runner == "bundled" else [
            "# genie-t2t-run is not in this bundle (no onnxruntime-qnn wheel carries it): the",
            "# board's, with the bundle's libraries first on LD_LIBRARY_PATH",
            'RUNNER=$(command -v genie-t2t-run || true)',
            '[ -n "$RUNNER" ] || fail "genie-t2t-run is not on PATH: this bundle carries the' +
            ' QAIRT $QAIRT_VERSION libraries but no runner; put QAIRT $QAIRT_VERSION\'s' +
            ' bin/<target>/genie-t2t-run on PATH"',
        ]
    else:
        lines += [
            "# runtime = \"board\": the board's own QAIRT install, on PATH and LD_LIBRARY_PATH",
            'RUNNER=$(command -v genie-t2t-run || true)',
            '[ -n "$RUNNER" ] || fail "genie-t2t-run is not on PATH: install QAIRT' +
            ' $QAIRT_VERSION on the board (bin/ and lib/ of its target folder on PATH and' +
            ' LD_LIBRARY_PATH, its hexagon skel folder on ADSP_LIBRARY_PATH)"',
        ]
    lines += [
        "",
        "# the board, before the run",
        'if [ ! -e "$NODE" ]; then',
        '    fail "$NODE: no such fastrpc device: this board has no NPU of htp_device_id ' +
        f'{s.htp_device_id} (htp_backend_ext_config.json) or its fastrpc driver is not loaded"',
        "fi",
        'if [ ! -r "$NODE" ] || [ ! -w "$NODE" ]; then',
        '    fail "$NODE: not readable and writable by $(id -un): add the user to the fastrpc ' +
        'group (usermod -aG fastrpc $(id -un), then log in again) or run as root"',
        "fi",
        "found=",
        "dirs=\"$(echo \"${LD_LIBRARY_PATH:-}\" | tr ':' ' ') /usr/lib /usr/lib64 /lib /lib64 "
        "/usr/lib/aarch64-linux-gnu /vendor/lib64 /system/lib64 /system/vendor/lib64\"",
        "for dir in $dirs; do",
        '    if [ -e "$dir/libcdsprpc.so" ]; then found=$dir; break; fi',
        "done",
        'if [ -z "$found" ]; then',
        "    for dir in $dirs; do",
        '        if [ -e "$dir/libcdsprpc.so.1" ]; then',
        '            fail "libcdsprpc.so: only $dir/libcdsprpc.so.1 is installed; the stub ' +
        'loads the bare name: ln -s libcdsprpc.so.1 $dir/libcdsprpc.so (as root)"',
        "        fi",
        "    done",
        '    fail "libcdsprpc.so: not found (LD_LIBRARY_PATH and the system library folders): ' +
        'install the board\'s fastrpc user library (Qualcomm Linux: the fastrpc package)"',
        "fi",
    ]
    if not android:   # Android's libc is bionic
        lines += [
            f'MIN_GLIBC="{MIN_GLIBC}"',
            'glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | sed -n "s/^glibc //p")',
            'lowest=$(printf "%s\\n%s\\n" "$MIN_GLIBC" "${glibc:-0}" | sort -t. -k1,1n -k2,2n '
            '| head -n 1)',
            'if [ -z "$glibc" ] || [ "$lowest" != "$MIN_GLIBC" ]; then',
            '    fail "glibc ${glibc:-unknown} on this board; QAIRT $QAIRT_VERSION\'s aarch64 ' +
            'libraries need glibc >= $MIN_GLIBC: use a newer board image"',
            "fi",
        ]
        lines += _glibcxx_check()
    lines += _aisw_check(s)
    lines += _profile_removal()
    lines += [
        "",
        "# the run; its output streams, and is read afterwards for the libGenie version",
        "# (in a folder of its own, made by mktemp -d: never a name in /tmp someone else made)",
        'work=$(mktemp -d "${TMPDIR:-/tmp}/genie-run.XXXXXX")',
        'out="$work/out"',
        'trap \'rm -rf "$work"\' EXIT',
        '{ "$RUNNER" "$@" 2>&1; echo $? > "$work/rc"; } | tee "$out"',
        'rc=$(cat "$work/rc")',
        f'printed=$(sed -n "s/^{GENIE_VERSION_LINE}\\([^ ]*\\).*/\\1/p" "$out" | head -n 1)',
        'if [ "$printed" != "$GENIE_VERSION" ]; then',
        '    fail "genie-t2t-run used libGenie.so version ${printed:-(none printed)}, the bundle ' +
        'was compiled with QAIRT $QAIRT_VERSION (libGenie $GENIE_VERSION): ' +
        ("a library of another SDK came first on LD_LIBRARY_PATH\"" if bundled else
         'install QAIRT $QAIRT_VERSION on the board"'),
        "fi",
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def _glibcxx_check() -> list:
    """The board's libstdc++ (the first on LD_LIBRARY_PATH or in the system folders) must
    define the symbol version every aarch64 QAIRT library needs."""
    return [
        f'MIN_GLIBCXX="{MIN_GLIBCXX}"',
        "cxx=",
        "for dir in $dirs; do",
        '    if [ -e "$dir/libstdc++.so.6" ]; then cxx=$dir/libstdc++.so.6; break; fi',
        "done",
        'if [ -z "$cxx" ]; then',
        '    fail "libstdc++.so.6: not found (LD_LIBRARY_PATH and the system library folders); ' +
        'QAIRT $QAIRT_VERSION\'s aarch64 libraries need one with $MIN_GLIBCXX"',
        "fi",
        'if ! tr -c "[:print:]" "\n" < "$cxx" | grep -q -x "$MIN_GLIBCXX"; then',
        '    fail "$cxx has no $MIN_GLIBCXX; QAIRT $QAIRT_VERSION\'s aarch64 libraries need it ' +
        '(GCC 11 or newer\'s libstdc++): use a newer board image"',
        "fi",
    ]


def _aisw_check(s: RunScript) -> list:
    """Each runtime file's own AISW_VERSION, before the run: the bundle's files (a file
    replaced on the board by another release's), or the board's libGenie and libQnnHtp when
    the board's install runs the bundle. The Genie API version checked after the run repeats
    across releases and cannot tell them apart."""
    if not s.aisw_version:
        return []
    lines = [
        "",
        "# each runtime file's own release (AISW_VERSION, in its bytes): the Genie API version",
        "# checked after the run repeats across QAIRT releases (2.46 and 2.47: 1.18.0)",
        f'AISW_VERSION="{s.aisw_version}"',
        "aisw_of() {",
        '    tr -c "[:print:]" "\n" < "$1" | sed -n "s/^AISW_VERSION: *//p" | head -n 1',
        "}",
        "check_aisw() {",
        '    said=$(aisw_of "$1")',
        '    if [ "$said" != "$AISW_VERSION" ]; then',
        '        fail "$1: AISW_VERSION ${said:-(none)}, the bundle is QAIRT $QAIRT_VERSION ' +
        '(AISW_VERSION $AISW_VERSION): $2"',
        "    fi",
        "}",
    ]
    if s.runtime == "bundled":
        lines += [f'for f in {" ".join(s.aisw_files)}; do',
                  '    check_aisw "$HERE/$f" "the runtime files must come from one QAIRT ' +
                  'release: deploy the bundle again"',
                  "done"] if s.aisw_files else []
    else:
        lines += [
            "for name in libGenie.so libQnnHtp.so; do",
            "    for dir in $dirs; do",
            '        if [ -e "$dir/$name" ]; then',
            '            check_aisw "$dir/$name" "install QAIRT $QAIRT_VERSION on the board"',
            "            break",
            "        fi",
            "    done",
            "done",
        ]
    return lines


def _profile_removal() -> list:
    """genie-t2t-run refuses a profile file that exists: the one `--profile FILE` names is
    removed first, so a second run works as the first."""
    return [
        "",
        "# genie-t2t-run refuses an existing profile file: remove the one --profile names",
        "prev=",
        'for arg in "$@"; do',
        '    if [ "$prev" = "--profile" ]; then rm -f -- "$arg"; fi',
        '    prev=$arg',
        "done",
    ]


def _render_cmd(s: RunScript) -> str:
    lines = [
        "@echo off",
        "rem Runs this Genie bundle: run.cmd -c genie_config.json -p PROMPT",
        "rem Written by hexbundle; check_bundle judges it and the manifest records its digest.",
        "setlocal",
        'cd /d "%~dp0"',
        f"set QAIRT_VERSION={s.qairt_version}",
        f"set GENIE_VERSION={s.genie_version}",
    ]
    if s.runtime == "bundled":
        lines += [
            f'set "PATH=%~dp0{LIB};%PATH%"',
            f'set "ADSP_LIBRARY_PATH=%~dp0{DSP};%ADSP_LIBRARY_PATH%"',
        ]
        lines += _size_check(s)
        lines += [f'"%~dp0{BIN}\\genie-t2t-run.exe" %*' if s.runner == "bundled" else
                  "genie-t2t-run.exe %*"]
    else:
        lines += ["genie-t2t-run.exe %*"]
    lines += ["exit /b %ERRORLEVEL%"]
    if s.runtime == "bundled" and s.sizes:
        lines += [
            ":stale",
            ">&2 echo run.cmd: %STALE%; the bundle was made with QAIRT %QAIRT_VERSION%: the "
            "runtime files must come from one QAIRT release, a file of another release fails on "
            "the NPU: copy the bundle folder again",
            "exit /b 2",
        ]
    return "\r\n".join(lines) + "\r\n"


def _size_check(s: RunScript) -> list:
    """Before the run, each file run.sh checks the AISW_VERSION of, by its size as the bundle
    step wrote it: cmd itself reads no bytes of a binary, and a file of another QAIRT release
    is another size (the 2.45.40 and 2.51.0 files, tests/test_real_runtime.py). Reading
    AISW_VERSION would take findstr or PowerShell, which no interpreter here runs (Wine's
    findstr is a stub; docs/deploy.md "run.cmd")."""
    if not s.sizes:
        return []
    lines = ["rem each runtime file as the bundle step wrote it, by its size (a file of another "
             "QAIRT release is another size)",
             "set STALE="]
    for rel, size in s.sizes:
        win = rel.replace("/", "\\")
        lines += [f'if not exist "{win}" set "STALE={win} is missing"',
                  f'for %%F in ("{win}") do if exist "{win}" if not "%%~zF"=="{size}" '
                  f'set "STALE={win} is %%~zF bytes, not the {size} bytes bundled"']
    return lines + ["if defined STALE goto stale"]


# ---------------------------------------------------------------------------------------------
# reader

_ASSIGN = re.compile(r'^\s*(?:set\s+"?)?(LD_LIBRARY_PATH|ADSP_LIBRARY_PATH|PATH)="?(.*?)"?\s*$')


def library_paths(text: str) -> dict:
    """{variable: [value, ...]} for each assignment of LD_LIBRARY_PATH, ADSP_LIBRARY_PATH or
    PATH in a run.sh / run.cmd, as written (unexpanded)."""
    out = {}
    for line in text.splitlines():
        m = _ASSIGN.match(line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


def adsp_problems(value: str, dsp: str = DSP) -> list:
    """What is wrong with an ADSP_LIBRARY_PATH value: fastrpc splits on ';' only, and the
    bundle's dsp/ must come first (fastrpc's defaults follow it)."""
    # ${VAR:+WORD}: shell syntax (its ':' joins nothing); the WORD is what is appended
    plain = re.sub(r"\$\{(\w+):[+-]([^}]*)\}", r"\2", value)
    problems = []
    if ":" in plain.replace("%~dp0", ""):
        problems.append(f"ADSP_LIBRARY_PATH={value} joins folders with ':', which fastrpc does "
                        "not split on (it is one folder): join them with ';'")
    first = re.split(r"[;:]", plain.replace("%~dp0", "%~dp0/"))[0].replace("\\", "/")
    if first.rstrip("/") not in (f"$HERE/{dsp}", f"%~dp0/{dsp}"):
        problems.append(f"ADSP_LIBRARY_PATH={value} does not start with the bundle's {dsp}/ "
                        "folder: fastrpc may load another skel (err 1008)")
    return problems
