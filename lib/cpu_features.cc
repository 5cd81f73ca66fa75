#include "lib/cpu_features.h"

#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define QMOE_PROBE_X86 1
#endif

namespace qmoe {
namespace {

#if defined(QMOE_PROBE_X86)
struct CpuidRegs {
  uint32_t eax, ebx, ecx, edx;
};

CpuidRegs cpuid(uint32_t leaf, uint32_t subleaf) {
  CpuidRegs r{};
  __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

// XGETBV by opcode, so this file needs no -mxsave (it is compiled without -m flags).
uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

constexpr bool bit(uint32_t reg, int n) {
  return (reg >> n) & 1u;
}

// XCR0: bit 1 SSE (XMM), bit 2 AVX (YMM upper halves), bits 5-7 opmask, ZMM0-15 upper
// halves, ZMM16-31. The OS must save all of them before we may touch the registers.
constexpr uint64_t kXcr0Ymm = (1u << 1) | (1u << 2);
constexpr uint64_t kXcr0Zmm = kXcr0Ymm | (1u << 5) | (1u << 6) | (1u << 7);
#endif

}  // namespace

CpuFeatures probe_cpu_features() {
  CpuFeatures f;
#if defined(QMOE_PROBE_X86)
  const CpuidRegs l0 = cpuid(0, 0);
  const uint32_t max_leaf = l0.eax;
  std::memcpy(f.vendor + 0, &l0.ebx, 4);
  std::memcpy(f.vendor + 4, &l0.edx, 4);
  std::memcpy(f.vendor + 8, &l0.ecx, 4);
  if (max_leaf < 1) return f;
  const CpuidRegs l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.ecx, 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm_ok = (xcr0 & kXcr0Ymm) == kXcr0Ymm;
  const bool zmm_ok = (xcr0 & kXcr0Zmm) == kXcr0Zmm;

  CpuidRegs l7{}, l7s1{};
  if (max_leaf >= 7) {
    l7 = cpuid(7, 0);
    if (l7.eax >= 1) l7s1 = cpuid(7, 1);
  }
  uint32_t b = 0;
  if (ymm_ok) {
    if (bit(l1.ecx, 28)) b |= QMOE_CPU_FEATURE_AVX;
    if (bit(l1.ecx, 12)) b |= QMOE_CPU_FEATURE_FMA;
    if (bit(l1.ecx, 29)) b |= QMOE_CPU_FEATURE_F16C;
    if (bit(l7.ebx, 5)) b |= QMOE_CPU_FEATURE_AVX2;
    if (bit(l7s1.eax, 4)) b |= QMOE_CPU_FEATURE_AVXVNNI;
  }
  if (zmm_ok) {
    if (bit(l7.ebx, 16)) b |= QMOE_CPU_FEATURE_AVX512F;
    if (bit(l7.ebx, 17)) b |= QMOE_CPU_FEATURE_AVX512DQ;
    if (bit(l7.ebx, 30)) b |= QMOE_CPU_FEATURE_AVX512BW;
    if (bit(l7.ebx, 31)) b |= QMOE_CPU_FEATURE_AVX512VL;
    if (bit(l7.ecx, 11)) b |= QMOE_CPU_FEATURE_AVX512VNNI;
    if (bit(l7.ecx, 1)) b |= QMOE_CPU_FEATURE_AVX512VBMI;
    // GFNI's instructions come in SSE, VEX and EVEX forms; the library's kernels use the EVEX
    // ones (vgf2p8affineqb on ZMM), so it counts where ZMM state is saved.
    if (bit(l7.ecx, 8)) b |= QMOE_CPU_FEATURE_GFNI;
    if (bit(l7s1.eax, 5)) b |= QMOE_CPU_FEATURE_AVX512BF16;
  }
  f.bits = b;

  if (cpuid(0x80000000u, 0).eax >= 0x80000004u) {
    char raw[49] = {};
    for (uint32_t i = 0; i < 3; ++i) {
      const CpuidRegs r = cpuid(0x80000002u + i, 0);
      std::memcpy(raw + 16 * i + 0, &r.eax, 4);
      std::memcpy(raw + 16 * i + 4, &r.ebx, 4);
      std::memcpy(raw + 16 * i + 8, &r.ecx, 4);
      std::memcpy(raw + 16 * i + 12, &r.edx, 4);
    }
    const char* start = raw;
    while (*start == ' ') ++start;
    std::strncpy(f.brand, start, sizeof(f.brand) - 1);
    for (size_t n = std::strlen(f.brand); n > 0 && f.brand[n - 1] == ' '; --n) f.brand[n - 1] = 0;
  }
#endif
  return f;
}

const CpuFeatures& host_cpu_features() {
  static const CpuFeatures features = probe_cpu_features();
  return features;
}

uint32_t isa_required_features(Isa isa) {
  constexpr uint32_t kAvx2 =
      QMOE_CPU_FEATURE_AVX | QMOE_CPU_FEATURE_AVX2 | QMOE_CPU_FEATURE_FMA | QMOE_CPU_FEATURE_F16C;
  constexpr uint32_t kAvx512 = kAvx2 | QMOE_CPU_FEATURE_AVX512F | QMOE_CPU_FEATURE_AVX512BW |
                               QMOE_CPU_FEATURE_AVX512DQ | QMOE_CPU_FEATURE_AVX512VL;
  switch (isa) {
    case Isa::kScalar:
      return 0;
    case Isa::kAvx2:
      return kAvx2;
    case Isa::kAvx512:
      return kAvx512;
  }
  return ~0u;
}

}  // namespace qmoe
