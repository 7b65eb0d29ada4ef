"""The Genie API version a Genie library states in its own code: the one reader.

A QAIRT SDK states it in include/Genie/GenieCommon.h (backends/qairt_runtime.py reads that); the
onnxruntime-qnn wheels carry the library without headers. There the version is what the
library's exported functions `Genie_getApiMajorVersion`, `Genie_getApiMinorVersion` and
`Genie_getApiPatchVersion` return, and each is two AArch64 instructions, `mov w0, #N; ret`
(after a `bti c` landing pad in the Linux build; `mov w0, wzr` for 0 in the Windows one)
(read from libGenie.so and Genie.dll of onnxruntime-qnn 2.1.0-2.7.0: 2.51.0's gives 1.21.0,
../shared/reference/qualcomm-on-pypi.md). This is what genie-t2t-run prints as "Using
libGenie.so version X.Y.Z", so run.sh compares against it.

ELF64 AArch64 (libGenie.so): the function's address from .dynsym (through the section headers),
mapped to a file offset through the PT_LOAD program headers. PE32+ ARM64 (Genie.dll): the
export directory's name and function RVA tables, mapped through the section table.
"""
from __future__ import annotations

import struct
from pathlib import Path

from hexbundle.support.errors import FormatError

FUNCTIONS = ("Genie_getApiMajorVersion", "Genie_getApiMinorVersion", "Genie_getApiPatchVersion")
RET = 0xD65F03C0            # AArch64 `ret`
MOV_W0_WZR = 0x2A1F03E0     # `mov w0, wzr` (orr w0, wzr, wzr): how the Windows build returns 0
HINT, HINT_MASK = 0xD503201F, 0xFFFFF01F   # the HINT space: `bti c` (d503245f), `nop`, ...
MAX_BYTES = 256 << 20       # a Genie library is ~10-13 MB


def read_genie_api_version(path: Path) -> str:
    """"M.m.p" from a libGenie.so (ELF AArch64) or Genie.dll (PE ARM64); FormatError naming the
    file when it is neither or its functions are not `mov w0, #N; ret`."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise FormatError(f"{path}: {size} B, larger than any Genie library ({MAX_BYTES} B)")
    return genie_api_version_of(path.read_bytes(), str(path))


def genie_api_version_of(data: bytes, where: str) -> str:
    """read_genie_api_version of a library's bytes (`where` names it in errors)."""
    try:
        if data[:4] == b"\x7fELF":
            offsets = _elf_functions(data, where)
        elif data[:2] == b"MZ":
            offsets = _pe_functions(data, where)
        else:
            raise FormatError(f"{where}: neither an ELF nor a PE file: not a Genie library")
        return ".".join(str(_mov_w0_ret(data, offsets[name], name, where)) for name in FUNCTIONS)
    except (struct.error, ValueError, IndexError):   # a table pointing past the end
        raise FormatError(f"{where}: its headers point outside the file: damaged") from None


def _mov_w0_ret(data: bytes, offset: int, name: str, where: str) -> int:
    """N of `movz w0, #N; ret` at offset."""
    if offset + 12 > len(data):
        raise FormatError(f"{where}: {name} lies outside the file: damaged")
    mov, ret = struct.unpack_from("<II", data, offset)
    if mov & HINT_MASK == HINT:   # a `bti c` landing pad first (the Linux build has one)
        mov, ret = struct.unpack_from("<II", data, offset + 4)
    if mov == MOV_W0_WZR and ret == RET:   # 0, as MSVC writes it
        return 0
    # MOVZ (32-bit): sf=0 opc=10 100101 hw=00 imm16 Rd; Rd = 0 (w0)
    if mov & 0xFFE0001F != 0x52800000 or ret != RET:
        raise FormatError(f"{where}: {name} is not `mov w0, #N; ret` ({mov:08x} {ret:08x}): "
                          "a Genie library of another form; its API version cannot be read")
    return (mov >> 5) & 0xFFFF


def _elf_functions(data: bytes, where: str) -> dict:
    if data[4] != 2 or data[5] != 1:
        raise FormatError(f"{where}: not a 64-bit little-endian ELF: not an AArch64 Genie library")
    e_phoff, e_shoff = struct.unpack_from("<QQ", data, 0x20)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, 0x36)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
                for i in range(e_shnum)]
    found = {}
    for sh in sections:
        if sh[1] != 11:   # SHT_DYNSYM
            continue
        strtab = sections[sh[6]]   # sh_link: its string table
        for i in range(sh[5] // sh[9]):
            st_name, _, _, _, st_value, _ = struct.unpack_from("<IBBHQQ", data, sh[4] + i * sh[9])
            start = strtab[4] + st_name
            name = data[start:data.index(b"\0", start)].decode("ascii", "replace")
            if name in FUNCTIONS and st_value:
                found[name] = st_value
    loads = [struct.unpack_from("<IIQQQQQQ", data, e_phoff + i * e_phentsize)
             for i in range(e_phnum)]
    return {name: _elf_offset(loads, found, name, where) for name in FUNCTIONS}


def _elf_offset(loads: list, found: dict, name: str, where: str) -> int:
    if name not in found:
        raise FormatError(f"{where}: exports no {name}: not a Genie library")
    for p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ in loads:
        if p_type == 1 and p_vaddr <= found[name] < p_vaddr + p_filesz:   # PT_LOAD
            return found[name] - p_vaddr + p_offset
    raise FormatError(f"{where}: {name} is in no loaded segment: damaged")


def _pe_functions(data: bytes, where: str) -> dict:
    (lfanew,) = struct.unpack_from("<I", data, 0x3C)
    if data[lfanew:lfanew + 4] != b"PE\0\0":
        raise FormatError(f"{where}: no PE signature: damaged")
    machine, nsections, _, _, _, opt_size, _ = struct.unpack_from("<HHIIIHH", data, lfanew + 4)
    opt = lfanew + 24
    if struct.unpack_from("<H", data, opt)[0] != 0x20B:
        raise FormatError(f"{where}: not a PE32+ image: not an ARM64 Genie library")
    export_rva, _ = struct.unpack_from("<II", data, opt + 112)   # data directory 0
    table = opt + opt_size
    sections = [struct.unpack_from("<8xIIII", data, table + 40 * i) for i in range(nsections)]

    def offset(rva: int) -> int:
        for vsize, vaddr, rawsize, rawptr in sections:
            if vaddr <= rva < vaddr + max(vsize, rawsize):
                return rva - vaddr + rawptr
        raise FormatError(f"{where}: RVA {rva:#x} is in no section: damaged")

    exp = offset(export_rva)
    # Characteristics, TimeDateStamp, versions, Name, Base, NumberOfFunctions, NumberOfNames,
    # AddressOfFunctions, AddressOfNames, AddressOfNameOrdinals
    nnames, funcs, names, ordinals = struct.unpack_from("<IIHHIIIIIII", data, exp)[7:]
    found = {}
    for i in range(nnames):
        start = offset(struct.unpack_from("<I", data, offset(names) + 4 * i)[0])
        name = data[start:data.index(b"\0", start)].decode("ascii", "replace")
        if name in FUNCTIONS:
            (ordinal,) = struct.unpack_from("<H", data, offset(ordinals) + 2 * i)
            found[name] = offset(struct.unpack_from("<I", data, offset(funcs) + 4 * ordinal)[0])
    missing = [n for n in FUNCTIONS if n not in found]
    if missing:
        raise FormatError(f"{where}: exports no {missing[0]}: not a Genie library")
    return found
