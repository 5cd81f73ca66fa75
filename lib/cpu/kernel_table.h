// The kernel table: the function pointers one tier's calls go through. A const table per ISA is
// generated from lib/cpu/kernel_list.inc (lib/cpu/kernel_tables.cc); lib/dispatch.cc overlays
// them into one table per tier, once, and never writes it again.
//
// Invariants:
//  - Types and constants only (no functions): lib/cpu/kernels.h includes this header into
//    translation units compiled with different -m flags, and an inline function emitted by an
//    AVX-512 unit could be the copy the linker keeps for the scalar path.
//  - A per-ISA table leaves the entries it does not provide empty ({nullptr, nullptr}); an
//    assembled table takes each entry from the last ISA at or below its tier that provides it
//    and the host runs, and the scalar ISA provides every entry, so assembled tables are full.
#ifndef QMOE_LIB_CPU_KERNEL_TABLE_H_
#define QMOE_LIB_CPU_KERNEL_TABLE_H_

#include <cstddef>
#include <cstdint>

#include "lib/gemm/group_args.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// CPU tiers, numerically equal to the public qmoe_isa values.
enum class Isa : int {
  kScalar = QMOE_ISA_SCALAR,
  kAvx2 = QMOE_ISA_AVX2,
  kAvx512 = QMOE_ISA_AVX512
};
constexpr int kIsaCount = 3;  // scalar, avx2, avx512

/// The instruction sets kernels are compiled for (lib/cpu/isa_list.inc), in overlay order.
enum class CpuIsa : uint32_t {
#define QMOE_CPU_ISA(token, tier, feature) token,
#include "lib/cpu/isa_list.inc"
#undef QMOE_CPU_ISA
};
constexpr uint32_t kCpuIsaCount = 0
#define QMOE_CPU_ISA(token, tier, feature) +1
#include "lib/cpu/isa_list.inc"
#undef QMOE_CPU_ISA
    ;

// Kernel signatures. Kernels validate nothing: the ABI layer checks arguments first.
// FP16/BF16 values travel as raw bit patterns.
using ConvertF16ToF32Fn = void (*)(const uint16_t* src, float* dst, size_t n);
using ConvertF32ToF16Fn = void (*)(const float* src, uint16_t* dst, size_t n);
using ConvertBf16ToF32Fn = void (*)(const uint16_t* src, float* dst, size_t n);
using ConvertF32ToBf16Fn = void (*)(const float* src, uint16_t* dst, size_t n);
// Reads every byte of [data, data + bytes) once, with the widest loads of the ISA, and
// returns the XOR of all its 64-bit little-endian words (the same value on every ISA, and the
// loads cannot be elided). `data` is 64-byte aligned and `bytes` a multiple of 64.
using ReadBandwidthFn = uint64_t (*)(const void* data, size_t bytes);
// One activation row for the fast level: x[0, k) -> q (ceil(k/32) * 32 int8, zero past k),
// scale and sum_q per 32 k (see Q8Activations). Every ISA produces identical values for
// finite inputs.
using QuantizeActivationsQ8Fn = void (*)(const float* x, size_t k, int8_t* q, float* scale,
                                         float* sum_q);
// One 8-row group of a dequant-GEMM (see GemmGroupArgs), for one format and accuracy level.
using GemmGroupFn = void (*)(const GemmGroupArgs& args);

// The entries that do not depend on a format: X(table member, function-pointer type).
#define QMOE_CPU_OPS(X)                              \
  X(convert_f16_to_f32, ::qmoe::ConvertF16ToF32Fn)   \
  X(convert_f32_to_f16, ::qmoe::ConvertF32ToF16Fn)   \
  X(convert_bf16_to_f32, ::qmoe::ConvertBf16ToF32Fn) \
  X(convert_f32_to_bf16, ::qmoe::ConvertF32ToBf16Fn) \
  X(read_bandwidth, ::qmoe::ReadBandwidthFn)         \
  X(quantize_activations_q8, ::qmoe::QuantizeActivationsQ8Fn)

template <typename Fn>
struct KernelEntry {
  using Function = Fn;
  Fn fn;             // nullptr in a per-ISA table that does not provide this entry
  const char* name;  // "qmoe_<op>__<isa>", static storage
};

// GEMM entries are indexed by format (its row's position in lib/formats/format_list.inc,
// format_slot()) and accuracy level (value - 1).
constexpr uint32_t kFormatSlots = 0
#define QMOE_FORMAT(token, value, traits) +1
#include "lib/formats/format_list.inc"
#undef QMOE_FORMAT
    ;
constexpr uint32_t kAccuracySlots = 2;  // QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST

struct KernelTable {
#define QMOE_KERNEL_TABLE_MEMBER_(member, type) KernelEntry<type> member;
  QMOE_CPU_OPS(QMOE_KERNEL_TABLE_MEMBER_)
#undef QMOE_KERNEL_TABLE_MEMBER_
  KernelEntry<GemmGroupFn> gemm[kFormatSlots][kAccuracySlots];
};

// The tokens of the kernel list's format and accuracy columns, as values.
namespace list_format {
#define QMOE_FORMAT(token, value, traits) constexpr qmoe_weight_format token = value;
#include "lib/formats/format_list.inc"
#undef QMOE_FORMAT
}  // namespace list_format
namespace list_accuracy {
constexpr qmoe_accuracy exact = QMOE_ACCURACY_EXACT;
constexpr qmoe_accuracy fast = QMOE_ACCURACY_FAST;
}  // namespace list_accuracy

}  // namespace qmoe

#endif  // QMOE_LIB_CPU_KERNEL_TABLE_H_
