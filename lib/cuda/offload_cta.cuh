// The Cta of the offload bodies (lib/offload/kernels.h) inside CUDA kernels: the standalone
// offload kernels (offload_kernels.cu) and the MoE layer kernels that carry the same bodies
// (moe_layer.cu). What each operation compiles to:
//   load_acquire_system    ld.acquire.sys.b64     (libcu++ atomic_ref, thread_scope_system)
//   store_release_system   st.release.sys.b64
//   store_relaxed_system   st.relaxed.sys.b32
//   fence_system           fence.sc.sys           (__threadfence_system)
//   load_relaxed           ld.relaxed.gpu.b32     (the sticky error, device memory)
//   load_acquire_device    ld.acquire.gpu.b64     (answered_seq, device memory)
//   store_release_device   st.release.gpu.b64
//   atomic_or              atom.or (device scope; on the sticky error word)
//   load_result            ld.global.cv           (host-written payload: never a cached line)
//   now_ns                 %globaltimer           (ns; its resolution, ~1 us, is far below any
//                                                  sensible timeout)
// tests/cmake/check_offload_ptx.cmake checks the PTX of both files for these instructions and
// their order.
//
// tests/cuda/cuda_host_emulator.h compiles moe_layer.cu for host threads. There the memory
// operations are lib/offload/host_memory_ops.h's, as the offload protocol tests' HostCta has
// them (__atomic builtins, a steady clock), and the barriers are the emulator's.
#ifndef QMOE_LIB_CUDA_OFFLOAD_CTA_CUH_
#define QMOE_LIB_CUDA_OFFLOAD_CTA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#if defined(QMOE_CUDA_HOST_EMULATION)
#include "lib/offload/host_memory_ops.h"
#else
#include <cuda/atomic>
#endif

#include "qmoe/qmoe.h"

namespace qmoe::cuda {

#if !defined(QMOE_CUDA_HOST_EMULATION)
namespace offload_cta_detail {
using SystemU64 = ::cuda::atomic_ref<unsigned long long, ::cuda::thread_scope_system>;
using SystemU32 = ::cuda::atomic_ref<unsigned int, ::cuda::thread_scope_system>;
using DeviceU32 = ::cuda::atomic_ref<unsigned int, ::cuda::thread_scope_device>;
using DeviceU64 = ::cuda::atomic_ref<unsigned long long, ::cuda::thread_scope_device>;
static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "64-bit sequence words");
}  // namespace offload_cta_detail

struct DeviceMemoryOps {
  __device__ static uint64_t load_acquire_system(const uint64_t* p) {
    offload_cta_detail::SystemU64 word(
        *reinterpret_cast<unsigned long long*>(const_cast<uint64_t*>(p)));
    return word.load(::cuda::memory_order_acquire);
  }
  __device__ static void store_release_system(uint64_t* p, uint64_t v) {
    offload_cta_detail::SystemU64 word(*reinterpret_cast<unsigned long long*>(p));
    word.store(v, ::cuda::memory_order_release);
  }
  __device__ static void store_relaxed_system(uint32_t* p, uint32_t v) {
    offload_cta_detail::SystemU32 word(*reinterpret_cast<unsigned int*>(p));
    word.store(v, ::cuda::memory_order_relaxed);
  }
  __device__ static uint64_t load_acquire_device(const uint64_t* p) {
    offload_cta_detail::DeviceU64 word(
        *reinterpret_cast<unsigned long long*>(const_cast<uint64_t*>(p)));
    return word.load(::cuda::memory_order_acquire);
  }
  __device__ static void store_release_device(uint64_t* p, uint64_t v) {
    offload_cta_detail::DeviceU64 word(*reinterpret_cast<unsigned long long*>(p));
    word.store(v, ::cuda::memory_order_release);
  }
  __device__ static void fence_system() { __threadfence_system(); }
  __device__ static uint32_t load_relaxed(const uint32_t* p) {
    offload_cta_detail::DeviceU32 word(*reinterpret_cast<unsigned int*>(const_cast<uint32_t*>(p)));
    return word.load(::cuda::memory_order_relaxed);
  }
  __device__ static uint32_t float_bits(float f) { return __float_as_uint(f); }
  __device__ static uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  // Each poll is a PCIe round trip already; no back-off.
  __device__ static void relax(uint32_t) {}
};
#else
struct DeviceMemoryOps : offload::HostMemoryOps {
  static void relax(uint32_t) {}
};
#endif

struct DeviceCta : DeviceMemoryOps {
  __device__ uint32_t thread() const { return threadIdx.x; }
  __device__ uint32_t threads() const { return blockDim.x; }
  __device__ uint32_t block() const { return blockIdx.x; }
  __device__ uint32_t blocks() const { return gridDim.x; }

  __device__ void sync() const { __syncthreads(); }
  __device__ int sync_count(int predicate) const { return __syncthreads_count(predicate); }
  __device__ int sync_or(int predicate) const { return __syncthreads_or(predicate); }

  __device__ static void atomic_or(uint32_t* p, uint32_t v) {
    atomicOr(reinterpret_cast<unsigned int*>(p), v);
  }
  __device__ static void shared_or(uint32_t* p, uint32_t v) {
    atomicOr(reinterpret_cast<unsigned int*>(p), v);
  }

  __device__ static float widen(uint32_t dtype, uint16_t bits) {
    return dtype == QMOE_DTYPE_F16 ? __half2float(__ushort_as_half(bits))
                                   : __bfloat162float(__ushort_as_bfloat16(bits));
  }
  __device__ static float load_element(uint32_t dtype, const void* p, uint64_t i) {
    if (dtype == QMOE_DTYPE_F32) return static_cast<const float*>(p)[i];
    return widen(dtype, static_cast<const uint16_t*>(p)[i]);
  }
  __device__ static float load_result(uint32_t dtype, const void* p, uint64_t i) {
#if !defined(QMOE_CUDA_HOST_EMULATION)
    if (dtype == QMOE_DTYPE_F32) return __ldcv(static_cast<const float*>(p) + i);
    return widen(dtype, __ldcv(static_cast<const unsigned short*>(p) + i));
#else
    return load_element(dtype, p, i);
#endif
  }
  __device__ static void store_element(uint32_t dtype, void* p, uint64_t i, float v) {
    if (dtype == QMOE_DTYPE_F32) {
      static_cast<float*>(p)[i] = v;
    } else if (dtype == QMOE_DTYPE_F16) {
      static_cast<uint16_t*>(p)[i] = __half_as_ushort(__float2half_rn(v));
    } else {
      static_cast<uint16_t*>(p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
  }
};

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_OFFLOAD_CTA_CUH_
