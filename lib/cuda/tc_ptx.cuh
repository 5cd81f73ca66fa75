// One-instruction PTX wrappers for the sm_80+ tensor-core kernels: cp.async, ldmatrix,
// mma.sync m16n8k16 and the CTA barrier, and the byte, logic and packed-FMA operations of the
// in-register dequantisation. On the device each is its instruction. On the host each follows
// the PTX ISA's (or CUDA's) description: the plain ones directly, the warp- and CTA-wide ones
// through the emulator that tests/cuda/int4_gemm_tc_emulation_test.cu installs (HostEmulator
// below), so that the kernels' own code runs, unchanged, on a machine without a GPU. Library
// code never calls the host paths.
#ifndef QMOE_LIB_CUDA_TC_PTX_CUH_
#define QMOE_LIB_CUDA_TC_PTX_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace qmoe::cuda::ptx {

// The host side of the warp- and CTA-wide operations: one emulator per emulated thread, set by
// the test before it runs kernel code on that thread.
struct HostEmulator {
  virtual ~HostEmulator() = default;
  virtual uint8_t* shared_memory() = 0;
  virtual void cta_barrier() = 0;
  virtual void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) = 0;
  virtual void mma_16816(bool bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                         const float (&c)[4]) = 0;
  // cp.async of cp_size bytes to shared offset dst, the first src_bytes of them from src and the
  // rest zero. By default the copy lands at once; an emulator may instead hold it until the
  // cp_async_wait that covers its group (the latest the PTX ISA allows), so that a read before
  // that wait sees stale bytes.
  virtual void cp_async(uint32_t dst, const void* src, uint32_t cp_size, uint32_t src_bytes) {
    uint8_t* to = shared_memory() + dst;
    if (src_bytes != 0) memcpy(to, src, src_bytes);
    memset(to + src_bytes, 0, cp_size - src_bytes);
  }
  virtual void cp_async_commit() {}
  virtual void cp_async_wait(int /*pending*/) {}
  // The warpgroup MMA of wgmma_ptx.cuh, for the emulators that run a wgmma kernel; the others
  // never see these calls (a kernel without wgmma makes none).
  virtual void wgmma_fence() {}
  // wgmma m64nNk16 (N = 128 or 256): d holds the thread's N / 2 accumulators.
  virtual void wgmma_m64k16(bool /*bf16*/, uint32_t /*n*/, float* /*d*/, const uint32_t (&/*a*/)[4],
                            uint64_t /*desc*/, bool /*accumulate*/) {
    abort();
  }
  virtual void wgmma_commit() {}
  virtual void wgmma_wait(int /*pending*/) {}
  // The mbarriers and the tensor copy of tma_ptx.cuh (shared addresses; `tensor_map` is what
  // the kernel holds, which an emulator's test fills with its own description).
  virtual void mbarrier_init(uint32_t /*bar*/, uint32_t /*count*/) { abort(); }
  virtual void mbarrier_arrive_expect_tx(uint32_t /*bar*/, uint32_t /*bytes*/) { abort(); }
  virtual bool mbarrier_try_wait_parity(uint32_t /*bar*/, uint32_t /*parity*/) { abort(); }
  virtual void mbarrier_arrive(uint32_t /*bar*/) { abort(); }
  virtual void cp_async_mbarrier_arrive_noinc(uint32_t /*bar*/) { abort(); }
  // bar.sync id, threads: a barrier of `threads` threads (warps) of the CTA, not all of them.
  virtual void named_barrier(uint32_t /*id*/, uint32_t /*threads*/) { abort(); }
  virtual void tma_load_2d(uint32_t /*dst*/, const void* /*tensor_map*/, int32_t /*c0*/,
                           int32_t /*c1*/, uint32_t /*bar*/) {
    abort();
  }
  // The cluster's barrier and a read of a cluster CTA's shared memory (cluster_ptx.cuh).
  virtual void cluster_barrier() { abort(); }
  virtual void cluster_load_f32x2(uint32_t /*address*/, uint32_t /*rank*/, float (&/*v*/)[2]) {
    abort();
  }
};
inline thread_local HostEmulator* host_emulator = nullptr;

__host__ __device__ __forceinline__ uint32_t shared_address(const void* pointer) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
#else
  return static_cast<uint32_t>(static_cast<const uint8_t*>(pointer) -
                               host_emulator->shared_memory());
#endif
}

__host__ __device__ __forceinline__ void cta_barrier() {
#if defined(__CUDA_ARCH__)
  __syncthreads();
#else
  host_emulator->cta_barrier();
#endif
}

// Barrier `id` (1..15; 0 is cta_barrier's) among `threads` threads, a multiple of 32: the warps
// that take part, whole, and no other warp of the CTA uses that id meanwhile. Orders shared
// memory as cta_barrier does, among them.
__host__ __device__ __forceinline__ void named_barrier(uint32_t id, uint32_t threads) {
#if defined(__CUDA_ARCH__)
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#else
  host_emulator->named_barrier(id, threads);
#endif
}

// 16 bytes global -> shared, asynchronously (cp.async.cg: cached in L2 only). With valid false
// the source size is 0: nothing is read and the 16 destination bytes are zeroed (PTX ISA,
// cp.async: the bytes past src-size are filled with zeros); `src` must still be a mapped
// address, so callers pass a base pointer then.
__host__ __device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__)
  const uint32_t src_bytes = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
#else
  host_emulator->cp_async(dst, src, 16, valid ? 16u : 0u);
#endif
}

// 4 bytes global -> shared, asynchronously (cp.async.ca: .cg takes only 16): the first src_bytes
// (0..4) from src, which must be 4-byte aligned, the rest of the 4 destination bytes zeroed.
// Only the src_bytes bytes are read.
__host__ __device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src,
                                                    uint32_t src_bytes) {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
#else
  host_emulator->cp_async(dst, src, 4, src_bytes);
#endif
}

__host__ __device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
  host_emulator->cp_async_commit();
#endif
}

// Waits until at most `kPending` of this thread's most recent groups are still in flight. The
// copies become visible to other threads only after a barrier that follows.
template <int kPending>
__host__ __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#else
  host_emulator->cp_async_wait(kPending);
#endif
}

// `value`, unknown to the compiler: it cannot hoist what is computed from the result out of the
// enclosing loop, nor recompute the result from what made `value` (it has to keep it).
__host__ __device__ __forceinline__ size_t opaque(size_t value) {
#if defined(__CUDA_ARCH__)
  size_t result;
  asm volatile("mov.b64 %0, %1;\n" : "=l"(result) : "l"(value));
  return result;
#else
  return value;
#endif
}
__host__ __device__ __forceinline__ uint32_t opaque32(uint32_t value) {
#if defined(__CUDA_ARCH__)
  uint32_t result;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(result) : "r"(value));
  return result;
#else
  return value;
#endif
}

// The FP32 value of a bit pattern, and of an FP16 bit pattern (exact).
__host__ __device__ __forceinline__ float float_from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  memcpy(&f, &bits, 4);
  return f;
#endif
}
__host__ __device__ __forceinline__ float half_bits_to_float(uint16_t bits) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(bits));
#else
  __half h;
  memcpy(&h, &bits, 2);
  return __half2float(h);
#endif
}

// Four 8x8 matrices of 16-bit elements. Lanes 8i..8i+7 give the 16-byte rows of matrix i;
// register i of lane L receives elements 2(L % 4), 2(L % 4) + 1 of row L / 4 of matrix i, the
// lower index in the low half (PTX ISA, ldmatrix, fragment layout of one 8x8 matrix).
__host__ __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
#if defined(__CUDA_ARCH__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
#else
  host_emulator->ldmatrix_x4(r, address);
#endif
}

// D = A * B + C for a 16x8x16 tile, FP32 accumulators. With g = lane / 4 and t = lane % 4
// (PTX ISA, matrix fragments for mma.m16n8k16 with floating point type):
//   a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// each pair with the lower index in the low 16 bits.
template <bool kBf16>
__host__ __device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1, const float (&c)[4]) {
#if defined(__CUDA_ARCH__)
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
#else
  host_emulator->mma_16816(kBf16, d, a, b0, b1, c);
#endif
}

// The integer and packed-half operations of the in-register dequantisation. Each is one
// instruction on the device; the host definitions follow the PTX ISA's and CUDA's descriptions
// of those instructions, so that the layout test (tests/cuda/int4_gemm_tc_layout_test.cu) runs
// the kernel's dequantisation code on the host.

// Byte i of the result is byte (s >> 4i) & 7 of {x bytes 0-3, y bytes 4-7} (__byte_perm).
__host__ __device__ __forceinline__ uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t bytes = (uint64_t{y} << 32) | x;
  uint32_t r = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    r |= static_cast<uint32_t>((bytes >> (((s >> (4 * i)) & 7) * 8)) & 0xFF) << (8 * i);
  }
  return r;
#endif
}

// (a & kMask) | magic in one LOP3 (its table 0xEA = (0xF0 & 0xCC) | 0xAA): with both constants
// as immediates ptxas emits two instructions.
template <uint32_t kMask>
__host__ __device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t magic) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "n"(kMask), "r"(magic));
  return d;
#else
  return (a & kMask) | magic;
#endif
}

// a * b + c on two packed 16-bit lanes (low half: the first element), rounded once (sm_80+ for
// BF16). The host definition rounds through FP32, which is exact for the dequantisation's
// operands (small integers and the magic constants).
template <bool kBf16>
__host__ __device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  if constexpr (kBf16) {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else {
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  }
  return d;
#else
  uint32_t d = 0;
  for (uint32_t lane = 0; lane < 2; ++lane) {
    const auto half = [lane](uint32_t v) { return static_cast<uint16_t>(v >> (16 * lane)); };
    float x, y, z;
    uint16_t r;
    if constexpr (kBf16) {
      const auto widen = [](uint16_t h) {
        const uint32_t bits = uint32_t{h} << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
      };
      x = widen(half(a));
      y = widen(half(b));
      z = widen(half(c));
      const __nv_bfloat16 out = __float2bfloat16_rn(x * y + z);
      memcpy(&r, &out, 2);
    } else {
      const auto widen = [](uint16_t h) {
        __half v;
        memcpy(&v, &h, 2);
        return __half2float(v);
      };
      x = widen(half(a));
      y = widen(half(b));
      z = widen(half(c));
      const __half out = __float2half_rn(x * y + z);
      memcpy(&r, &out, 2);
    }
    d |= uint32_t{r} << (16 * lane);
  }
  return d;
#endif
}

}  // namespace qmoe::cuda::ptx

#endif  // QMOE_LIB_CUDA_TC_PTX_CUH_
