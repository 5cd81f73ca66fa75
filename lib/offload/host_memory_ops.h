// The offload Cta's memory operations on host threads (lib/offload/kernels.h lists them):
// system- and device-scope acquire loads and release stores as __atomic acquire and release,
// the system fence a sequentially consistent fence, relaxed loads and stores as __atomic
// relaxed ones, a steady clock. HostCta (host_device.h), which the offload protocol tests run,
// and the CUDA host emulation's DeviceCta (lib/cuda/offload_cta.cuh) share them.
#ifndef QMOE_LIB_OFFLOAD_HOST_MEMORY_OPS_H_
#define QMOE_LIB_OFFLOAD_HOST_MEMORY_OPS_H_

#include <chrono>
#include <cstdint>
#include <cstring>

namespace qmoe::offload {

struct HostMemoryOps {
  static uint64_t load_acquire_system(const uint64_t* p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
  }
  static void store_release_system(uint64_t* p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
  }
  static void store_relaxed_system(uint32_t* p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
  }
  static uint64_t load_acquire_device(const uint64_t* p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
  }
  static void store_release_device(uint64_t* p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
  }
  static void fence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
  static uint32_t load_relaxed(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
  static uint32_t float_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
  }
  static uint64_t now_ns() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
};

}  // namespace qmoe::offload

#endif  // QMOE_LIB_OFFLOAD_HOST_MEMORY_OPS_H_
