// Runs the decode kernels' own CUDA C++ (lib/cuda/int4_gemv.cu, moe_layer.cu) on the host, so
// that a machine without a GPU executes every line of them: a test includes this header, then
// the kernel sources (with `qmoe` renamed, so their symbols do not clash with the library's).
//
// The model, as the CUDA programming guide defines it for what these kernels use:
//  - a block is blockDim.x cooperative fibers on the launching thread (host_fibers.h says how
//    they are scheduled); blocks run one after another (so a `__shared__` variable, compiled
//    here as a function-local static, is the block's own, and the dynamic shared memory is one
//    buffer, poisoned before every block). A warp runs ahead of the others until it waits at
//    __syncthreads; blocks start with warp 0 and with the last warp in turn (alternating
//    from launch to launch too, so that a one-block grid runs both), so that a read of another
//    warp's shared-memory writes with no barrier between them sees stale data in one of the
//    two orders;
//  - __syncthreads() / __syncthreads_or() wait for every thread of the block that has not
//    exited; warp operations (__syncwarp, shuffles, __match_any_sync) wait for all 32 lanes of
//    the warp, each lane publishing its value before any reads (a lane that never arrives, a
//    divergent warp operation, leaves no thread able to run: the emulator reports it and
//    aborts);
//  - global memory is host memory (device pointers are host pointers), atomics are host
//    atomics, __ldg/__ldcg plain loads, the FP32 intrinsics their IEEE host equivalents (this
//    file's user compiles with -ffp-contract=off), griddepcontrol and prefetches nothing;
//  - cudaGetDevice / cudaDeviceGetAttribute answer for an emulated device whose multiprocessor
//    count a test chooses (few SMs: the persistent loops take many rounds).
#ifndef QMOE_TESTS_CUDA_CUDA_HOST_EMULATOR_H_
#define QMOE_TESTS_CUDA_CUDA_HOST_EMULATOR_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "tests/cuda/host_fibers.h"

#define QMOE_CUDA_HOST_EMULATION 1
#undef __shared__
#define __shared__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#define QMOE_DECODE_DYNAMIC_SMEM(name) unsigned char* name = ::qmoe_emu::dynamic_smem()

namespace qmoe_emu {

// A reusable barrier whose count drops when a participant exits (as __syncthreads counts only
// threads that have not exited).
using Barrier = qmoe::testing::FiberBarrier;

struct Warp {
  Barrier barrier;
  uint64_t value[32];
};

struct Block {
  Barrier barrier;
  std::vector<std::unique_ptr<Warp>> warps;
  int or_value = 0;
  int count_value = 0;
};

inline thread_local Block* tl_block = nullptr;
inline thread_local uint32_t tl_lane = 0;
inline thread_local uint32_t tl_warp = 0;

inline std::vector<unsigned char>& smem_buffer() {
  static std::vector<unsigned char> buffer;
  return buffer;
}
inline unsigned char* dynamic_smem() {
  // 16-byte aligned start inside the buffer.
  auto& b = smem_buffer();
  const uintptr_t p = reinterpret_cast<uintptr_t>(b.data());
  return b.data() + ((16 - (p & 15)) & 15);
}

// The emulated device.
struct Device {
  int sm_count = 2;
  int smem_per_sm = 228 * 1024;
  int smem_per_block_optin = 227 * 1024;
  int major = 9;
  uint64_t launches = 0;
  // What shared memory holds when a block starts (block b: smem_garbage ^ b). A test sets it to
  // make what a kernel must not read look like valid data (0: ids 0 and weights 0, say).
  uint8_t smem_garbage = 0xA5;
};
inline Device& device() {
  static Device d;
  return d;
}

inline Warp& warp() {
  return *tl_block->warps[tl_warp];
}

// Every lane publishes v, waits for the warp, reads what pick(lane) chose, waits again (so a
// value is not overwritten before every lane has read it).
template <class T, class Pick>
T warp_exchange(unsigned mask, T v, Pick pick) {
  if (mask != 0xFFFFFFFFu) {
    std::fprintf(stderr, "cuda_host_emulator: partial warp masks are not emulated\n");
    std::abort();
  }
  static_assert(sizeof(T) <= 8, "one word per lane");
  Warp& w = warp();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  w.value[tl_lane] = bits;
  w.barrier.wait();
  const uint64_t got = w.value[pick(tl_lane)];
  w.barrier.wait();
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

}  // namespace qmoe_emu

// ---- Built-in variables and functions ----------------------------------------------------------

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

inline void __syncthreads() {
  qmoe_emu::tl_block->barrier.wait();
}

inline int __syncthreads_or(int predicate) {
  qmoe_emu::Block& b = *qmoe_emu::tl_block;
  b.barrier.wait();  // the last round's readers are done
  b.or_value |= predicate != 0;
  b.barrier.wait();
  const int result = b.or_value;
  b.barrier.wait();
  if (threadIdx.x == 0) b.or_value = 0;
  b.barrier.wait();
  return result;
}

// The offload bodies' cold count (lib/offload/kernels.h through lib/cuda/offload_cta.cuh).
inline int __syncthreads_count(int predicate) {
  qmoe_emu::Block& b = *qmoe_emu::tl_block;
  b.barrier.wait();  // the last round's readers are done
  b.count_value += predicate != 0 ? 1 : 0;
  b.barrier.wait();
  const int result = b.count_value;
  b.barrier.wait();
  if (threadIdx.x == 0) b.count_value = 0;
  b.barrier.wait();
  return result;
}

inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
  if (mask != 0xFFFFFFFFu) std::abort();
  qmoe_emu::warp().barrier.wait();
}

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  return qmoe_emu::warp_exchange(mask, v, [&](uint32_t l) { return l ^ uint32_t(lane_mask); });
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src) {
  return qmoe_emu::warp_exchange(mask, v, [&](uint32_t) { return uint32_t(src) % 32; });
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta) {
  return qmoe_emu::warp_exchange(mask, v, [&](uint32_t l) { return l >= delta ? l - delta : l; });
}

inline unsigned __match_any_sync(unsigned mask, int v) {
  if (mask != 0xFFFFFFFFu) std::abort();
  qmoe_emu::Warp& w = qmoe_emu::warp();
  w.value[qmoe_emu::tl_lane] = static_cast<uint32_t>(v);
  w.barrier.wait();
  unsigned peers = 0;
  for (uint32_t l = 0; l < 32; ++l) {
    if (w.value[l] == static_cast<uint32_t>(v)) peers |= 1u << l;
  }
  w.barrier.wait();
  return peers;
}

template <class T>
T __ldg(const T* p) {
  return *p;
}
template <class T>
T __ldcg(const T* p) {
  return *p;
}

inline unsigned atomicOr(unsigned* p, unsigned v) {
  return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
inline int atomicAdd(int* p, int v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) {
    c += static_cast<int>(static_cast<int8_t>(a >> (8 * i))) *
         static_cast<int>(static_cast<int8_t>(b >> (8 * i)));
  }
  return c;
}

inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x));
}
inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}

inline float __int_as_float(int v) {
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}
inline int __float_as_int(float v) {
  int i;
  std::memcpy(&i, &v, 4);
  return i;
}
inline float __uint_as_float(unsigned v) {
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}
inline unsigned __float_as_uint(float v) {
  unsigned i;
  std::memcpy(&i, &v, 4);
  return i;
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fmaf(a, b, c);
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline int __float2int_rn(float v) {
  return static_cast<int>(std::nearbyintf(v));  // round to nearest even (the default mode)
}

inline uint32_t min(uint32_t a, uint32_t b) {
  return a < b ? a : b;
}
inline uint32_t max(uint32_t a, uint32_t b) {
  return a > b ? a : b;
}
using std::isfinite;
using std::isnan;

// ---- The runtime calls the launchers make --------------------------------------------------

inline cudaError_t qmoe_emu_get_device(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t qmoe_emu_device_get_attribute(int* value, cudaDeviceAttr attr, int) {
  const qmoe_emu::Device& d = qmoe_emu::device();
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = d.sm_count;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = d.smem_per_sm;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = d.smem_per_block_optin;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = d.major;
      return cudaSuccess;
    default:
      return cudaErrorInvalidValue;
  }
}
#define cudaGetDevice qmoe_emu_get_device
#define cudaDeviceGetAttribute qmoe_emu_device_get_attribute

// Runs fn(params) over the grid: per block, blockDim.x fibers (one block at a time).
template <class Params>
cudaError_t qmoe_host_emulator_launch(void (*fn)(Params), dim3 grid, dim3 block, size_t smem,
                                      const Params& params) {
  if (block.x == 0 || block.x % 32 != 0 || block.y != 1 || block.z != 1 || grid.y != 1 ||
      grid.z != 1 || grid.x == 0) {
    return cudaErrorInvalidConfiguration;
  }
  const uint64_t launch = qmoe_emu::device().launches++;
  auto& buffer = qmoe_emu::smem_buffer();
  const uint8_t garbage = qmoe_emu::device().smem_garbage;
  buffer.assign(smem + 16, garbage);  // shared memory starts out with garbage
  for (uint32_t b = 0; b < grid.x; ++b) {
    std::fill(buffer.begin(), buffer.end(), static_cast<unsigned char>(garbage ^ b));
    qmoe_emu::Block state;
    state.barrier.reset(block.x);
    for (uint32_t w = 0; w < block.x / 32; ++w) {
      state.warps.push_back(std::make_unique<qmoe_emu::Warp>());
      state.warps.back()->barrier.reset(32);
    }
    struct Run {
      qmoe_emu::Block* state;
      void (*fn)(Params);
      const Params* params;
      uint3 block_index;
      dim3 block_dim, grid_dim;
    } run{&state, fn, &params, make_uint3(b, 0, 0), block, grid};
    // Each resumed fiber finds its own built-in variables (they are per OS thread).
    auto switch_in = [](void* p, uint32_t t) {
      const Run& r = *static_cast<const Run*>(p);
      qmoe_emu::tl_block = r.state;
      qmoe_emu::tl_lane = t % 32;
      qmoe_emu::tl_warp = t / 32;
      threadIdx = make_uint3(t, 0, 0);
      blockIdx = r.block_index;
      blockDim = r.block_dim;
      gridDim = r.grid_dim;
    };
    auto body = [](void* p, uint32_t) {
      const Run& r = *static_cast<const Run*>(p);
      r.fn(*r.params);  // a copy per thread, as the kernel's parameters
      qmoe_emu::warp().barrier.leave();
      r.state->barrier.leave();
    };
    const bool highest_first = (launch + b) % 2 == 1;
    qmoe::testing::FiberBlock::run(block.x, highest_first, body, switch_in, &run);
  }
  return cudaSuccess;
}

#endif  // QMOE_TESTS_CUDA_CUDA_HOST_EMULATOR_H_
