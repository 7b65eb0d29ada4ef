"""Executable and library headers: ELF (Linux, Android, the Hexagon NPU) and PE (Windows).

Only what the bundle check judges: which CPU a file is for, and for Hexagon which version.
ELF: the 16-byte identification (class, byte order), e_machine and e_flags. PE: the "MZ" DOS
header's e_lfanew, the "PE\\0\\0" signature and the COFF header's Machine.

Hexagon (LLVM's ELF.h): e_machine 164; the low bits of e_flags are the architecture,
EF_HEXAGON_MACH_V73 = 0x73, V75 = 0x75, ... (the hex digits read as the version).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ELF_MAGIC = b"\x7fELF"
EM_X86_64, EM_AARCH64, EM_HEXAGON = 62, 183, 164
ELF_MACHINES = {EM_X86_64: "x86-64", EM_AARCH64: "aarch64", EM_HEXAGON: "hexagon", 3: "x86",
                40: "arm"}
EF_HEXAGON_MACH = 0x3ff
PE_MACHINES = {0xAA64: "arm64", 0x8664: "x86-64", 0x14C: "x86", 0x1C4: "arm"}
HEADER_BYTES = 4096


@dataclass(frozen=True)
class Image:
    format: str                 # "ELF", "PE", or "" (neither)
    machine: str                # "aarch64", "x86-64", "hexagon", "arm64" (PE), ...; "" unknown
    bits: int = 0               # 32 / 64 (ELF)
    hexagon_arch: Optional[str] = None    # "v73" for a Hexagon ELF

    def describe(self) -> str:
        if not self.format:
            return "neither an ELF nor a PE file"
        arch = f" {self.hexagon_arch}" if self.hexagon_arch else ""
        return f"{self.format} {self.machine or 'unknown machine'}{arch}"


def read_image(path: Path) -> Image:
    """The header of `path` (OSError if unreadable)."""
    with open(path, "rb") as fh:
        head = fh.read(HEADER_BYTES)
    return parse_image(head)


def parse_image(head: bytes) -> Image:
    if head[:4] == ELF_MAGIC:
        return _elf(head)
    if head[:2] == b"MZ":
        return _pe(head)
    return Image("", "")


def _elf(head: bytes) -> Image:
    if len(head) < 52 or head[4] not in (1, 2) or head[5] not in (1, 2):
        return Image("ELF", "")
    bits = 32 if head[4] == 1 else 64
    order = "<" if head[5] == 1 else ">"
    (machine,) = struct.unpack_from(order + "H", head, 18)
    flags_at = 36 if bits == 32 else 48
    if len(head) < flags_at + 4:
        return Image("ELF", ELF_MACHINES.get(machine, f"e_machine {machine}"), bits)
    (flags,) = struct.unpack_from(order + "I", head, flags_at)
    name = ELF_MACHINES.get(machine, f"e_machine {machine}")
    arch = f"v{flags & EF_HEXAGON_MACH:x}" if machine == EM_HEXAGON else None
    return Image("ELF", name, bits, arch)


def _pe(head: bytes) -> Image:
    if len(head) < 64:
        return Image("", "")
    (lfanew,) = struct.unpack_from("<I", head, 0x3C)
    if lfanew + 6 > len(head) or head[lfanew:lfanew + 4] != b"PE\0\0":
        return Image("", "")
    (machine,) = struct.unpack_from("<H", head, lfanew + 4)
    return Image("PE", PE_MACHINES.get(machine, f"machine 0x{machine:x}"))
