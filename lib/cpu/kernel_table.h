// The kernel table: one const table of function pointers per ISA folder, assembled once per
// tier by lib/dispatch.cc and never written afterwards.
//
// Invariants:
//  - This header holds types and macros only: no inline functions, because it is included by
//    translation units compiled with different -m flags (an inline function emitted by an
//    AVX-512 unit could be the copy the linker keeps for the scalar path).
//  - A per-ISA table may leave an entry empty ({nullptr, nullptr}); the assembled table for a
//    tier takes each entry from the highest tier at or below it that provides one, so the
//    assembled tables are always complete (the scalar table provides every entry).
//  - Slots are the public qmoe_kernel_slot values; the X-macro below is the single list that
//    drives the table struct, the slot names, the assembly and the tests.
#ifndef QMOE_LIB_CPU_KERNEL_TABLE_H_
#define QMOE_LIB_CPU_KERNEL_TABLE_H_

#include <cstddef>
#include <cstdint>

#include "lib/formats/int4_layout.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// CPU tiers, numerically equal to the public qmoe_isa values.
enum class Isa : int {
  kScalar = QMOE_ISA_SCALAR,
  kAvx2 = QMOE_ISA_AVX2,
  kAvx512 = QMOE_ISA_AVX512
};
constexpr int kIsaCount = 3;  // scalar, avx2, avx512

// Kernel signatures. Kernels validate nothing: the ABI layer checks arguments first.
// FP16/BF16 values travel as raw bit patterns.
using ConvertF16ToF32Fn = void (*)(const uint16_t* src, float* dst, size_t n);
using ConvertF32ToF16Fn = void (*)(const float* src, uint16_t* dst, size_t n);
using ConvertBf16ToF32Fn = void (*)(const uint16_t* src, float* dst, size_t n);
using ConvertF32ToBf16Fn = void (*)(const float* src, uint16_t* dst, size_t n);
// Reads every byte of [data, data + bytes) once, with the widest loads of the tier, and
// returns the XOR of all its 64-bit little-endian words (the same value on every tier, and the
// loads cannot be elided). `data` is 64-byte aligned and `bytes` a multiple of 64.
using ReadBandwidthFn = uint64_t (*)(const void* data, size_t bytes);
// One activation row for the fast level: x[0, k) -> q (ceil(k/32) * 32 int8, zero past k),
// scale and sum_q per 32 k (see Q8Activations). Every tier produces identical values for
// finite inputs.
using QuantizeActivationsQ8Fn = void (*)(const float* x, size_t k, int8_t* q, float* scale,
                                         float* sum_q);
// One 8-row group of the INT4 dequant-GEMM (see Int4GroupArgs).
using GemmInt4GroupFn = void (*)(const Int4GroupArgs& args);

// X(slot enumerator, table member, function-pointer type)
#define QMOE_KERNEL_TABLE_ENTRIES(X)                                                               \
  X(QMOE_KERNEL_CONVERT_F16_TO_F32, convert_f16_to_f32, ::qmoe::ConvertF16ToF32Fn)                 \
  X(QMOE_KERNEL_CONVERT_F32_TO_F16, convert_f32_to_f16, ::qmoe::ConvertF32ToF16Fn)                 \
  X(QMOE_KERNEL_CONVERT_BF16_TO_F32, convert_bf16_to_f32, ::qmoe::ConvertBf16ToF32Fn)              \
  X(QMOE_KERNEL_CONVERT_F32_TO_BF16, convert_f32_to_bf16, ::qmoe::ConvertF32ToBf16Fn)              \
  X(QMOE_KERNEL_READ_BANDWIDTH, read_bandwidth, ::qmoe::ReadBandwidthFn)                           \
  X(QMOE_KERNEL_QUANTIZE_ACTIVATIONS_Q8, quantize_activations_q8, ::qmoe::QuantizeActivationsQ8Fn) \
  X(QMOE_KERNEL_GEMM_INT4_EXACT, gemm_int4_exact, ::qmoe::GemmInt4GroupFn)                         \
  X(QMOE_KERNEL_GEMM_INT4_FAST, gemm_int4_fast, ::qmoe::GemmInt4GroupFn)

template <typename Fn>
struct KernelEntry {
  Fn fn;             // nullptr in a per-ISA table that does not provide this entry
  const char* name;  // "qmoe_<job>__<isa>", static storage
};

struct KernelTable {
#define QMOE_KERNEL_TABLE_MEMBER_(slot, member, type) KernelEntry<type> member;
  QMOE_KERNEL_TABLE_ENTRIES(QMOE_KERNEL_TABLE_MEMBER_)
#undef QMOE_KERNEL_TABLE_MEMBER_
};

// The per-ISA tables, each defined in its ISA folder (kernel_table_<isa>.cc).
extern const KernelTable kScalarKernelTable;
#if defined(QMOE_HAVE_X86_TIERS)
extern const KernelTable kAvx2KernelTable;
extern const KernelTable kAvx512KernelTable;
// Extension tables: kernels that need a feature beyond their tier's requirements, compiled in
// translation units of their own and overlaid only when the probe reports the feature.
extern const KernelTable kAvxVnniKernelTable;     // avx2 tier + AVX-VNNI
extern const KernelTable kAvx512VnniKernelTable;  // avx512 tier + AVX512-VNNI
#endif

}  // namespace qmoe

#endif  // QMOE_LIB_CPU_KERNEL_TABLE_H_
