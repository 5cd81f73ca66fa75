// PTX wrappers for a thread block cluster (sm_90): its barrier and the read of another CTA's
// shared memory (distributed shared memory). As in tc_ptx.cuh, each is its instruction on the
// device and, on the host, goes to the emulator the tests install, which runs the CTAs of a
// cluster at once with a shared memory each (tests/cuda/int4_gemm_tc_emulation_test.cu). Library
// code never calls the host paths.
//
// What a cluster guarantees (CUDA programming guide, thread block clusters; PTX ISA,
// barrier.cluster and the shared::cluster state space): its CTAs run at the same time; a CTA's
// shared memory may be read by the others while the CTA has not exited, so a CTA whose memory is
// read must wait, in a cluster barrier, until the readers are done; barrier.cluster counts every
// thread of the cluster, and exited threads do not hold it up.
#ifndef QMOE_LIB_CUDA_CLUSTER_PTX_CUH_
#define QMOE_LIB_CUDA_CLUSTER_PTX_CUH_

#include <cstdint>

#include "lib/cuda/tc_ptx.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QMOE_CLUSTER_DEVICE 1
#else
#define QMOE_CLUSTER_DEVICE 0
#endif

namespace qmoe::cuda::ptx {

// Every thread of the cluster that has not exited arrives, with release, and waits, with acquire:
// the shared-memory writes before it in any CTA of the cluster are visible after it to every
// thread of the cluster.
__host__ __device__ __forceinline__ void cluster_barrier() {
#if QMOE_CLUSTER_DEVICE
  asm volatile(
      "barrier.cluster.arrive.release;\n"
      "barrier.cluster.wait.acquire;\n" ::
          : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#else
  host_emulator->cluster_barrier();
#endif
}

// The two floats at shared address `address` (8-byte aligned) of the cluster's CTA `rank`
// (this CTA's own when rank is its own).
__host__ __device__ __forceinline__ void cluster_load_f32x2(uint32_t address, uint32_t rank,
                                                            float (&v)[2]) {
#if QMOE_CLUSTER_DEVICE
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n"
               : "=f"(v[0]), "=f"(v[1])
               : "r"(remote)
               : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#else
  host_emulator->cluster_load_f32x2(address, rank, v);
#endif
}

}  // namespace qmoe::cuda::ptx

#endif  // QMOE_LIB_CUDA_CLUSTER_PTX_CUH_
