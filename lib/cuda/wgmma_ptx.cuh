// PTX wrappers for the sm_90a warpgroup MMA (wgmma) and what goes with it: the shared-memory
// matrix descriptor, the fence / commit / wait of the asynchronous MMA, and the warpgroup
// register reallocation of a warp-specialised kernel. As in
// tc_ptx.cuh, each is its instruction on the device and, on the host, goes to the emulator the
// tests install (tests/cuda/int4_gemm_tc_emulation_test.cu), which implements the PTX ISA's
// definitions, so that the kernel's own code runs on a machine without a GPU. Library code
// never calls the host paths.
//
// The device paths exist only where the compiler targets sm_90a (__CUDA_ARCH_FEAT_SM90_ALL):
// the wgmma kernels are built for that target alone (lib/CMakeLists.txt) and the launcher uses
// them only on a compute capability 9.0 device.
#ifndef QMOE_LIB_CUDA_WGMMA_PTX_CUH_
#define QMOE_LIB_CUDA_WGMMA_PTX_CUH_

#include <cstdint>

#include "lib/cuda/tc_ptx.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QMOE_WGMMA_DEVICE 1
#else
#define QMOE_WGMMA_DEVICE 0
#endif

namespace qmoe::cuda::ptx {

// setmaxnreg: the executing warpgroup's registers a thread become kCount (a multiple of 8 in
// 24..256), released to or taken from the CTA's pool; every warp of the warpgroup executes it.
// An increase waits until the pool holds enough (the other warpgroups' decreases). On the host,
// nothing: the emulation has no register file.
template <uint32_t kCount>
__host__ __device__ __forceinline__ void warpgroup_registers_decrease() {
  static_assert(kCount % 8 == 0 && kCount >= 24 && kCount <= 256);
#if QMOE_WGMMA_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCount));
#endif
}
template <uint32_t kCount>
__host__ __device__ __forceinline__ void warpgroup_registers_increase() {
  static_assert(kCount % 8 == 0 && kCount >= 24 && kCount <= 256);
#if QMOE_WGMMA_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kCount));
#endif
}

// The descriptor of a K-major operand tile in shared memory with the 128-byte swizzle (PTX
// ISA, matrix descriptor format for wgmma): rows of 64 16-bit elements (128 bytes), 8-row
// atoms of 1024 bytes, the 16-byte unit u of row r stored at unit u ^ (r % 8) of that row,
// the tile starting on a 1024-byte boundary. `address` is the shared address of the tile plus
// 32 bytes per k16 slice (the swizzle is applied to the address the hardware forms, so a
// slice's start advances by its unswizzled offset). Fields: bits 0-13 the start address / 16,
// 16-29 the leading-dimension byte offset / 16 (unused by a swizzled K-major tile whose k16
// slice lies within one 128-byte row; 1), 32-45 the stride byte offset / 16 (1024: from one
// 8-row atom to the next), 49-51 the base offset (0: atoms start 1024-aligned), 62-63 the
// swizzle mode (1: 128 bytes).
__host__ __device__ __forceinline__ constexpr uint64_t wgmma_descriptor_sw128(uint32_t address) {
  return uint64_t{(address & 0x3FFFFu) >> 4} | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// Before the first wgmma of a warpgroup and between register accesses by other instructions
// (the accumulators read by the fold, the A fragments written by the dequantisation) and the
// wgmma that uses those registers.
__host__ __device__ __forceinline__ void wgmma_fence() {
#if QMOE_WGMMA_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#elif !defined(__CUDA_ARCH__)
  host_emulator->wgmma_fence();
#endif
}

// Closes the group of the wgmmas this warpgroup issued since the last commit.
__host__ __device__ __forceinline__ void wgmma_commit() {
#if QMOE_WGMMA_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#elif !defined(__CUDA_ARCH__)
  host_emulator->wgmma_commit();
#endif
}

// Waits until at most kPending of this warpgroup's groups are in flight; the accumulators of
// the others may be read after wgmma_hold (below) and their operands reused.
template <int kPending>
__host__ __device__ __forceinline__ void wgmma_wait() {
#if QMOE_WGMMA_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#elif !defined(__CUDA_ARCH__)
  host_emulator->wgmma_wait(kPending);
#endif
}

// Makes the compiler treat every element of `d` as written here, so that no read of an
// accumulator moves above the wgmma_wait before it and no write below the wgmma_fence after it
// (the asm statements stay in order; plain arithmetic would not).
template <int kCount>
__host__ __device__ __forceinline__ void wgmma_hold(float (&d)[kCount]) {
#if QMOE_WGMMA_DEVICE
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
#endif
}

// The first 64 accumulators as output operands %0..%63 (both shapes start with them).
#define QMOE_WGMMA_D0_63                                                                          \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// The instruction for one operand type ("bf16" or "f16") and N (128 or 256): N / 2
// accumulators, 4 A registers, the descriptor and the accumulate predicate.
#define QMOE_WGMMA_M64N128K16_RS(TYPE)                                         \
  asm volatile(                                                                \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                             \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE             \
      " {"                                                                     \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, "           \
      "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, " \
      "%28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
      "%56, %57, %58, %59, %60, %61, %62, %63"                                 \
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"                         \
      : QMOE_WGMMA_D0_63                                                       \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate ? 1u : 0u));

#define QMOE_WGMMA_M64N256K16_RS(TYPE)                                                             \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE                                 \
      " {"                                                                                         \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, "                               \
      "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, "                     \
      "%28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "                     \
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "                     \
      "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "                     \
      "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, "                     \
      "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, "                     \
      "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "         \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, "       \
      "%126, %127"                                                                                 \
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"                                        \
      : QMOE_WGMMA_D0_63, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]),         \
        "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), \
        "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), \
        "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), \
        "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), \
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),           \
        "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]),        \
        "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]),        \
        "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),        \
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),        \
        "+f"(d[127])                                                                               \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate ? 1u : 0u));

// D (+)= A * B for a 64 x N x 16 tile (N = 128 or 256), asynchronously: D = A * B when
// `accumulate` is false. A (64 x 16, row-major) comes from the warpgroup's registers: warp w
// holds rows 16w..16w+15 in the mma.m16n8k16 A layout (g = lane / 4, t = lane % 4):
//   a[0] = A[16w+g][2t, 2t+1]      a[1] = A[16w+g+8][2t, 2t+1]
//   a[2] = A[16w+g][2t+8, 2t+9]    a[3] = A[16w+g+8][2t+8, 2t+9]
// B (16 x N) is the K-major tile of `desc`: B[k][n] at row n, element k of the slice.
// D (64 x N, FP32): thread (w, g, t) holds d[4i + e] = D[16w + g + 8 (e / 2)][8i + 2t + e % 2]
// for i = 0..N/8-1. The registers of a and d belong to the MMA until its group is waited for.
template <bool kBf16, uint32_t kN>
__host__ __device__ __forceinline__ void wgmma_m64k16(float (&d)[kN / 2], const uint32_t (&a)[4],
                                                      uint64_t desc, bool accumulate) {
  static_assert(kN == 128 || kN == 256);
#if QMOE_WGMMA_DEVICE
  if constexpr (kN == 128 && kBf16) {
    QMOE_WGMMA_M64N128K16_RS("bf16");
  } else if constexpr (kN == 128) {
    QMOE_WGMMA_M64N128K16_RS("f16");
  } else if constexpr (kBf16) {
    QMOE_WGMMA_M64N256K16_RS("bf16");
  } else {
    QMOE_WGMMA_M64N256K16_RS("f16");
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched: the launcher uses the wgmma kernels on sm_90a code only
#else
  host_emulator->wgmma_m64k16(kBf16, kN, d, a, desc, accumulate);
#endif
}

}  // namespace qmoe::cuda::ptx

#undef QMOE_WGMMA_M64N128K16_RS
#undef QMOE_WGMMA_M64N256K16_RS
#undef QMOE_WGMMA_D0_63

#endif  // QMOE_LIB_CUDA_WGMMA_PTX_CUH_
