// libfp16 oracle, and the CPU checks for the instruction oracles. This file is compiled without
// ISA flags, so the checks can run on any x86-64 CPU (the instruction oracles' own files may
// use their ISA anywhere, prologues included).
#include <fp16.h>

#include <cstring>

#include "tests/cpu/oracles/convert_oracles.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace qmoe::testing {
namespace {

#if defined(__x86_64__) || defined(_M_X64)
struct CpuidRegs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuidRegs cpuid(unsigned leaf, unsigned subleaf) {
  CpuidRegs r;
  if (__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx) == 0) return CpuidRegs{};
  return r;
}

// XCR0 when the OS has enabled XSAVE (CPUID.1:ECX.OSXSAVE), else 0.
uint64_t xcr0() {
  if ((cpuid(1, 0).ecx & (1u << 27)) == 0) return 0;
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
#endif

}  // namespace

bool oracle_f16c_available() {
#if defined(__x86_64__) || defined(_M_X64)
  const CpuidRegs l1 = cpuid(1, 0);
  const bool avx = (l1.ecx & (1u << 28)) != 0;
  const bool f16c = (l1.ecx & (1u << 29)) != 0;
  return avx && f16c && (xcr0() & 0x6) == 0x6;  // XMM and YMM state
#else
  return false;
#endif
}

bool oracle_avx512bf16_available() {
#if defined(__x86_64__) || defined(_M_X64)
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  const bool avx512f = (cpuid(7, 0).ebx & (1u << 16)) != 0;
  const bool avx512bf16 = (cpuid(7, 1).eax & (1u << 5)) != 0;
  return avx512f && avx512bf16 && (xcr0() & 0xE6) == 0xE6;  // XMM, YMM, opmask, ZMM state
#else
  return false;
#endif
}

void oracle_libfp16_f16_to_f32(const uint16_t* src, uint32_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    // fp16_ieee_to_fp32_bits evaluates __builtin_clz(0) for +-0 (undefined behaviour that UBSan
    // reports; the result is then masked away), so +-0 is answered here: +-0.0f.
    dst[i] = (src[i] & 0x7FFFu) == 0 ? static_cast<uint32_t>(src[i]) << 16
                                     : fp16_ieee_to_fp32_bits(src[i]);
  }
}

void oracle_libfp16_f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, src + i, sizeof(f));
    dst[i] = fp16_ieee_from_fp32_value(f);
  }
}

}  // namespace qmoe::testing
