"""The pieces of the board runtime that need no build: ELF/PE headers, ADSP_LIBRARY_PATH by
fastrpc's rules, run.sh through shellcheck (issue 41)."""
import shutil
import struct
import subprocess

import pytest

from hexbundle.config.runtime_files import ANDROID, LINUX
from hexbundle.formats.binimage import parse_image
from hexbundle.formats.runscript import RunScript, adsp_problems, library_paths, render

pytestmark = pytest.mark.deploy


def test_elf_and_pe_headers_are_read_from_their_bytes():
    elf64 = bytearray(64)
    elf64[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<H", elf64, 18, 183)
    assert parse_image(bytes(elf64)).describe() == "ELF aarch64"
    elf32 = bytearray(52)
    elf32[:6] = b"\x7fELF\x01\x01"
    struct.pack_into("<HI", elf32, 18, 164, 0)
    struct.pack_into("<I", elf32, 36, 0x75)
    assert parse_image(bytes(elf32)).hexagon_arch == "v75"
    pe = bytearray(0x100)
    pe[:2] = b"MZ"
    struct.pack_into("<I", pe, 0x3C, 0x80)
    pe[0x80:0x84] = b"PE\0\0"
    struct.pack_into("<H", pe, 0x84, 0x8664)
    assert parse_image(bytes(pe)).describe() == "PE x86-64"
    assert parse_image(b"#!/bin/sh\n").format == ""


def test_adsp_paths_are_judged_by_fastrpcs_rules():
    assert adsp_problems("$HERE/dsp${ADSP_LIBRARY_PATH:+;$ADSP_LIBRARY_PATH}") == []
    assert adsp_problems("%~dp0dsp;%ADSP_LIBRARY_PATH%") == []
    assert "joins folders with ':'" in adsp_problems("$HERE/dsp:/usr/lib/rfsa/adsp")[0]
    # /usr/lib/rfsa/adsp ends in "dsp" too: the bundle's own folder must come first
    assert "does not start with the bundle's dsp/" in \
        adsp_problems("/usr/lib/rfsa/adsp;$HERE/dsp")[0]


@pytest.mark.parametrize("target", [LINUX, ANDROID])
@pytest.mark.parametrize("mode", ["bundled", "board"])
def test_run_sh_passes_shellcheck(tmp_path, target, mode):
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed: apt-get install shellcheck (.ci/run does)"
    script = tmp_path / "run.sh"
    script.write_text(render(RunScript(target, mode, "2.42.0.251225", "1.14.0", 1, "2.42.0",
                                       ("lib/libGenie.so", "dsp/libQnnHtpV73Skel.so"))))
    proc = subprocess.run([shellcheck, "--shell=sh", str(script)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout
    assert library_paths(script.read_text()).get("ADSP_LIBRARY_PATH", []) == \
        (["$HERE/dsp${ADSP_LIBRARY_PATH:+;$ADSP_LIBRARY_PATH}"] if mode == "bundled" else [])


def test_the_second_npu_is_named_in_the_htp_config_and_checked_by_run_sh():
    """IQ-9075 has two NPUs: [htp] device_id = 1 is written to htp_backend_ext_config.json
    (0, QAIRT's default, is left unsaid) and run.sh checks /dev/fastrpc-cdsp1."""
    import dataclasses
    from pathlib import Path

    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    from hexbundle.formats.genie import htp_backend_ext_config
    from hexbundle.steps.options import bundle_options
    genie = bundle_options(Layout(load_build(Path(__file__).resolve().parent.parent))).genie
    assert "device_id" not in htp_backend_ext_config(genie)["devices"][0]
    second = htp_backend_ext_config(dataclasses.replace(genie, device_id=1))["devices"][0]
    assert second["device_id"] == 1 and second["soc_model"] == 77
    text = render(RunScript(LINUX, "bundled", "2.42.0.251225", "1.14.0", 1))
    assert 'NODE="${HEXBUNDLE_FASTRPC_NODE:-/dev/fastrpc-cdsp1}"' in text
    assert "no NPU of htp_device_id 1" in text


@pytest.mark.parametrize("text, expect", [
    ("ssh://root@iq9075:2222/opt/qwen", ("root", "iq9075", 2222, "/opt/qwen")),
    ("ssh://iq9075/opt/qwen/", ("", "iq9075", None, "/opt/qwen")),
])
def test_deploy_targets_are_parsed(text, expect):
    from hexbundle.deploy.push import parse_target
    t = parse_target(text)
    assert (t.user, t.host, t.port, t.path) == expect


@pytest.mark.parametrize("text", ["root@iq9075:/opt/qwen", "ssh://iq9075", "ssh://iq9075:x/a"])
def test_a_malformed_deploy_target_says_the_form(text):
    from hexbundle.deploy.push import DeployError, parse_target
    with pytest.raises(DeployError, match="ssh://USER@HOST|not a number"):
        parse_target(text)
