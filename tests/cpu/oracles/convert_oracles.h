// Independent oracles for the row-conversion tests: the CPU's own conversion instructions and
// Debian's libfp16, each behind a plain function so that ISA flags stay in the file that wraps
// the instruction (convert_oracle_f16c.cc: -mavx -mf16c; convert_oracle_avx512bf16.cc:
// -mavx512f -mavx512bf16). Call an instruction oracle only after its *_available() check.
//
// What each oracle defines (see the comparisons in tests/convert_*_test.cc):
//  - F16C vcvtph2ps / vcvtps2ph (imm8 = round to nearest even): exact IEEE conversions; NaN:
//    quiet bit forced, payload shifted (widening) or truncated to its top bits (narrowing).
//  - AVX512-BF16 vcvtneps2bf16: round to nearest even, but FP32 denormal inputs become signed
//    zero; NaN -> (x >> 16) | 0x0040.
//  - libfp16: fp16_ieee_to_fp32_bits is exact but does not quiet a signalling NaN;
//    fp16_ieee_from_fp32_value is exact under the default MXCSR but returns sign | 0x7E00 for
//    every NaN (payload dropped).
#ifndef QMOE_TESTS_ORACLES_CONVERT_ORACLES_H_
#define QMOE_TESTS_ORACLES_CONVERT_ORACLES_H_

#include <cstddef>
#include <cstdint>

namespace qmoe::testing {

/// True when the CPU has F16C and AVX and the OS saves YMM state (CPUID + XGETBV).
bool oracle_f16c_available();
/// True when the CPU has AVX512F and AVX512-BF16 and the OS saves ZMM/opmask state.
bool oracle_avx512bf16_available();

/// vcvtph2ps over a row (any n).
void oracle_f16c_f16_to_f32(const uint16_t* src, float* dst, size_t n);
/// vcvtps2ph with imm8 = 0 (round to nearest even, MXCSR.RC ignored) over a row (any n).
void oracle_f16c_f32_to_f16(const float* src, uint16_t* dst, size_t n);

/// vcvtneps2bf16 over a row (any n).
void oracle_avx512bf16_f32_to_bf16(const float* src, uint16_t* dst, size_t n);

/// fp16_ieee_to_fp32_bits over a row, FP32 bit patterns out.
void oracle_libfp16_f16_to_f32(const uint16_t* src, uint32_t* dst, size_t n);
/// fp16_ieee_from_fp32_value over a row. Exact only under the default MXCSR (no DAZ/FTZ,
/// round to nearest), which the caller must ensure.
void oracle_libfp16_f32_to_f16(const float* src, uint16_t* dst, size_t n);

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_ORACLES_CONVERT_ORACLES_H_
