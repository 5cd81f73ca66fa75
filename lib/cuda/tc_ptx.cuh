// One-instruction PTX wrappers for the sm_80+ tensor-core kernels (cp.async, ldmatrix,
// mma.sync m16n8k16, packed FMA), and the in-register dequantisation of one canonical INT4
// chunk row into mma B fragments. Device code only.
#ifndef QMOE_LIB_CUDA_TC_PTX_CUH_
#define QMOE_LIB_CUDA_TC_PTX_CUH_

#include <cstdint>

namespace qmoe::cuda::ptx {

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, asynchronously (cp.async.cg: cached in L2 only). With valid false
// the source size is 0: nothing is read and the 16 destination bytes are zeroed (PTX ISA,
// cp.async: the bytes past src-size are filled with zeros); `src` must still be a mapped
// address, so callers pass a base pointer then.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const uint32_t src_bytes = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `kPending` of this thread's most recent groups are still in flight. The
// copies become visible to other threads only after a barrier that follows.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 matrices of 16-bit elements. Lanes 8i..8i+7 give the 16-byte rows of matrix i;
// register i of lane L receives elements 2(L % 4), 2(L % 4) + 1 of row L / 4 of matrix i, the
// lower index in the low half (PTX ISA, ldmatrix, fragment layout of one 8x8 matrix).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// D = A * B + C for a 16x8x16 tile, FP32 accumulators. With g = lane / 4 and t = lane % 4
// (PTX ISA, matrix fragments for mma.m16n8k16 with floating point type):
//   a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// each pair with the lower index in the low 16 bits.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1, const float (&c)[4]) {
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  }
}

// a * b + c on two packed 16-bit lanes, rounded once (sm_80+ for BF16).
template <bool kBf16>
__device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  if constexpr (kBf16) {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else {
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  }
  return d;
}

// Exponent-trick constants, per 16-bit lane: OR-ing a nibble c into the mantissa of kMagic
// gives exactly kMagic + c (BF16 128: 7 mantissa bits of spacing 1; FP16 1024: 10 bits of
// spacing 1); adding zero_constant(z) = -(kMagic + z) then gives c - z exactly, an integer in
// [-15, 15] that both types hold.
template <bool kBf16>
struct NibbleMagic {
  static constexpr uint32_t kMagic = kBf16 ? 0x43004300u : 0x64006400u;     // 128 / 1024
  static constexpr uint32_t kOne = kBf16 ? 0x3F803F80u : 0x3C003C00u;       // 1.0
  static constexpr uint32_t kNegMagic = kBf16 ? 0xC300C300u : 0xE400E400u;  // -128 / -1024
};

// -(kMagic + z) in both lanes, for a zero point z in 0..15.
template <bool kBf16>
__device__ __forceinline__ uint32_t zero_constant(uint32_t z) {
  return NibbleMagic<kBf16>::kNegMagic | (z * 0x00010001u);
}

// (a & kMask) | magic in one LOP3 (0xEA = (a & b) | c): with both constants as immediates
// ptxas emits two.
template <uint32_t kMask>
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t magic) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "n"(kMask), "r"(magic));
  return d;
}

// The B fragments of one 8-row x 32-k canonical chunk for the calling lane (g = lane / 4 is the
// row, t = lane % 4): lo = the mma over chunk k 0..15, hi = over k 16..31, each {b[0], b[1]}.
// Row g's 16 bytes are byte j = code j | code j+16 << 4, and the lane needs k = 2t, 2t+1,
// 2t+8, 2t+9 of each half: the nibbles of bytes 2t, 2t+1, 2t+8, 2t+9, i.e. half t % 2 of
// word t / 2 (`word_a`) and of word 2 + t / 2 (`word_b`). One byte permute makes
//   v = byte 2t | byte 2t+8 << 8 | byte 2t+1 << 16 | byte 2t+9 << 24
// so that its nibble pairs at bits (s, s + 16) are: s = 0: k (2t, 2t+1); s = 4: (2t+16, 2t+17);
// s = 8: (2t+8, 2t+9); s = 12: (2t+24, 2t+25) -- exactly lo[0], hi[0], lo[1], hi[1].
// `permute` = permute_selector(t). z_lo / z_hi: zero_constant() of the zero points of k 0..15
// and 16..31 (equal unless the block size is 16).
template <bool kBf16>
__device__ __forceinline__ void dequant_chunk_row(uint32_t word_a, uint32_t word_b,
                                                  uint32_t permute, uint32_t z_lo, uint32_t z_hi,
                                                  uint32_t (&lo)[2], uint32_t (&hi)[2]) {
  using M = NibbleMagic<kBf16>;
  const uint32_t v = __byte_perm(word_a, word_b, permute);
  constexpr uint32_t kMask = 0x000F000Fu;
  lo[0] = fma2<kBf16>(and_or<kMask>(v, M::kMagic), M::kOne, z_lo);
  hi[0] = fma2<kBf16>(and_or<kMask>(v >> 4, M::kMagic), M::kOne, z_hi);
  lo[1] = fma2<kBf16>(and_or<kMask>(v >> 8, M::kMagic), M::kOne, z_lo);
  hi[1] = fma2<kBf16>(and_or<kMask>(v >> 12, M::kMagic), M::kOne, z_hi);
}

// __byte_perm picks byte i of its result by selector nibble i from {word_a bytes 0-3, word_b
// bytes 4-7}: t even takes a0, b0, a1, b1; t odd a2, b2, a3, b3.
__host__ __device__ constexpr uint32_t permute_selector(uint32_t t) {
  return (t & 1) != 0 ? 0x7362u : 0x5140u;
}

}  // namespace qmoe::cuda::ptx

#endif  // QMOE_LIB_CUDA_TC_PTX_CUH_
