// PTX wrappers for Hopper's tensor memory accelerator (TMA) and the shared-memory barriers
// (mbarrier) its copies complete on: a 2-D tiled tensor copy global -> shared, and the barrier's
// init, arrivals (plain, with expected bytes, and on the completion of a thread's cp.async
// copies) and phase wait. As in tc_ptx.cuh, each is its
// instruction on the device and, on the host, goes to the emulator the tests install
// (tests/cuda/int4_gemm_tc_emulation_test.cu), which implements the PTX ISA's definitions, so
// that the kernel's own code runs on a machine without a GPU. Library code never calls the host
// paths.
//
// The mbarrier protocol these wrappers serve (PTX ISA, mbarrier): a barrier counts pending
// arrivals and pending transaction bytes; a phase completes when both reach zero, and the
// barrier then starts the next phase with the arrival count it was initialised with. Phases
// alternate in parity: try_wait_parity(bar, p) is true once the phase of parity p has
// completed. The TMA copy's bytes count against the barrier's transaction bytes as they land,
// and the phase's completion makes them visible to every thread that observes it.
#ifndef QMOE_LIB_CUDA_TMA_PTX_CUH_
#define QMOE_LIB_CUDA_TMA_PTX_CUH_

#include <cstdint>

#include "lib/cuda/tc_ptx.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QMOE_TMA_DEVICE 1
#else
#define QMOE_TMA_DEVICE 0
#endif

namespace qmoe::cuda::ptx {

// Initialises the barrier at shared address `bar` (8 bytes, 8-aligned) for `count` arrivals per
// phase, then makes the initialisation visible to the async proxy (the TMA unit completes
// transactions on it). Only one thread initialises; the others may use the barrier after a CTA
// barrier that follows.
__host__ __device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
#if QMOE_TMA_DEVICE
  asm volatile(
      "mbarrier.init.shared::cta.b64 [%0], %1;\n"
      "fence.mbarrier_init.release.cluster;\n" ::"r"(bar),
      "r"(count)
      : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#else
  host_emulator->mbarrier_init(bar, count);
#endif
}

// One arrival on the barrier that also adds `bytes` to the transaction bytes its current phase
// waits for (the copies that will complete on it).
__host__ __device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if QMOE_TMA_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#else
  host_emulator->mbarrier_arrive_expect_tx(bar, bytes);
#endif
}

// One arrival on the barrier, with release semantics at CTA scope: this thread's earlier shared
// memory accesses (its reads of a stage, its writes of converted entries, the cp.async copies
// its wait_group has completed) happen before the phase's completion is observed.
__host__ __device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
#if QMOE_TMA_DEVICE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#else
  host_emulator->mbarrier_arrive(bar);
#endif
}

// One arrival on the barrier, made by the hardware once every cp.async this thread has issued so
// far has landed (cp.async.mbarrier.arrive.noinc: the arrival is one of the count the barrier
// was initialised with, not an extra one). A thread that observes the phase then sees those
// copies' bytes; the calling thread goes on at once.
__host__ __device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint32_t bar) {
#if QMOE_TMA_DEVICE
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#else
  host_emulator->cp_async_mbarrier_arrive_noinc(bar);
#endif
}

// Whether the barrier's phase of parity `parity` has completed (a bounded wait in hardware).
__host__ __device__ __forceinline__ bool mbarrier_try_wait_parity(uint32_t bar, uint32_t parity) {
#if QMOE_TMA_DEVICE
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
#elif defined(__CUDA_ARCH__)
  __trap();
  return false;
#else
  return host_emulator->mbarrier_try_wait_parity(bar, parity);
#endif
}

// Waits for the barrier's phase of parity `parity`: afterwards the copies that completed on it
// are visible to this thread (acquire).
__host__ __device__ __forceinline__ void mbarrier_wait_parity(uint32_t bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

// The box at coordinates (c0, c1) (innermost first, in elements) of the 2-D tensor that
// `tensor_map` describes (a CUtensorMap kernel parameter, __grid_constant__) into shared memory
// at `dst`, laid out and swizzled as the map says, elements outside the tensor zero; its bytes
// complete on the barrier `bar`. Issued by one thread.
__host__ __device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tensor_map,
                                                     int32_t c0, int32_t c1, uint32_t bar) {
#if QMOE_TMA_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#else
  host_emulator->tma_load_2d(dst, tensor_map, c0, c1, bar);
#endif
}

}  // namespace qmoe::cuda::ptx

#endif  // QMOE_LIB_CUDA_TMA_PTX_CUH_
