/* Wine 8 has no bcryptprimitives.dll; Genie.dll (its Rust tokenizer's std) imports ProcessPrng
   from it. This shim answers it through advapi32's RtlGenRandom (SystemFunction036). */
#include <windows.h>
BOOLEAN WINAPI SystemFunction036(PVOID, ULONG);
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
  while (len) { ULONG n = len > 0x10000000 ? 0x10000000 : (ULONG)len;
    if (!SystemFunction036(data, n)) return FALSE; data += n; len -= n; }
  return TRUE;
}
