// What the decode kernels (int4_gemv.cu, moe_layer.cu) share about their place in a stream:
// programmatic dependent launch (sm_90 and up), L2 prefetch of the weights a block will read,
// and the host-side launch with the programmatic-serialization attribute.
//
// The contract every kernel launched through launch_decode_kernel keeps (its own file says
// where): before wait_for_preceding_grid() it reads only what the preceding grid cannot be
// writing (documented per kernel) and may prefetch anything into the L2 (a hint: the L2 is the
// point of coherence, so a line prefetched before the preceding grid writes it is updated, never
// stale); it writes nothing to global memory before the wait; and every block executes the wait
// before it exits, so the grid's completion implies that of everything before it in the stream.
#ifndef QMOE_LIB_CUDA_GRID_DEPENDENCY_CUH_
#define QMOE_LIB_CUDA_GRID_DEPENDENCY_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "lib/cuda/int4_tile.cuh"

// The kernel's dynamic shared memory. tests/cuda/cuda_host_emulator.h, which runs these kernels
// on host threads, defines it (and QMOE_CUDA_HOST_EMULATION) first.
#ifndef QMOE_DECODE_DYNAMIC_SMEM
#define QMOE_DECODE_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace qmoe::cuda {

// ---- Programmatic dependent launch (nothing below sm_90) -------------------------------------

// Waits until the preceding grid has completed and its memory is visible (a no-op when the grid
// was launched without the attribute).
__device__ __forceinline__ void wait_for_preceding_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next grid in the stream launch once every block of this one has called it (or
// exited); the next grid still waits for this one's completion before it reads our output.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---- L2 prefetch ---------------------------------------------------------------------------

// Prefetches the bytes [p, p + bytes) into the L2. sm_90: one bulk prefetch, issued by lane 0
// (the range widened to 16-byte granules, which never leaves the pages of its first and last
// byte); below: lane-strided line prefetches. Every lane of the warp calls it with the same
// arguments.
__device__ __forceinline__ void prefetch_l2(const void* p, size_t bytes, uint32_t lane) {
  if (bytes == 0) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (lane == 0) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{15};
    const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes + 15) & ~uintptr_t{15};
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(begin),
                 "r"(static_cast<uint32_t>(end - begin))
                 : "memory");
  }
#elif defined(__CUDA_ARCH__)
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{127};
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  for (uintptr_t a = begin + 128 * uintptr_t{lane}; a < end; a += 128 * 32) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
  }
#else
  (void)p;
  (void)lane;
#endif
}

// A line prefetch of one address into the L2 (nothing on the host).
__device__ __forceinline__ void prefetch_l2_line(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// The element range [first, first + count * stride) of a plane, by contiguous runs when the
// stride is 1, else element by element (lines, lane-strided; at most 64 elements).
__device__ __forceinline__ void prefetch_plane_run(const unsigned char* base, size_t first,
                                                   uint32_t count, size_t stride,
                                                   uint32_t elem_bytes, uint32_t lane) {
  if (stride == 1) {
    prefetch_l2(base + first * elem_bytes, size_t{count} * elem_bytes, lane);
    return;
  }
  for (uint32_t b = lane; b < count && b < 64; b += 32) {
    prefetch_l2_line(base + (first + b * stride) * elem_bytes);
  }
}

// Prefetches the scales and zero points of 8-row group g of w (scale elements of scale_bytes
// each: the format's, F::scale_bytes; the grouped order as one run; rows whose blocks are
// adjacent, row by row; other orders element by element), touching only elements of rows below
// N. All lanes call it; w must be a valid description.
__device__ __forceinline__ void prefetch_group_planes(const DeviceQuantMatrix& w, uint32_t g,
                                                      uint32_t lane, uint32_t scale_bytes) {
  if (g * kGroupRows >= w.n) return;
  const uint32_t blocks = w.k / w.block_size;
  const uint32_t rows = min(kGroupRows, w.n - g * kGroupRows);
  const auto plane = [&](const unsigned char* base, uint32_t es, size_t row_stride,
                         size_t block_stride, size_t group_stride) {
    if (group_stride != 0 && row_stride == 1 && block_stride == kGroupRows) {
      // Element (r, b) at 8 b + r: the run ends at the last block's last real row (a last
      // group of fewer than 8 rows need not be padded).
      const size_t run = size_t{blocks - 1} * kGroupRows + rows;
      prefetch_l2(base + size_t{g} * group_stride * es, run * es, lane);
      return;
    }
    for (uint32_t r = 0; r < rows; ++r) {
      const size_t first = plane_row_offset(g * kGroupRows + r, row_stride, group_stride);
      prefetch_plane_run(base, first, blocks, block_stride, es, lane);
    }
  };
  plane(static_cast<const unsigned char*>(w.scales), scale_bytes, w.scale_row_stride,
        w.scale_block_stride, w.scale_group_stride);
  if (w.zero_points != nullptr) {
    plane(w.zero_points, 1, w.zero_point_row_stride, w.zero_point_block_stride,
          w.zero_point_group_stride);
  }
}

// Prefetches what a warp will read of 8-row group g of w: its code chunks, and its rows' scales
// and zero points (prefetch_group_planes). All lanes call it; w must be a valid description.
__device__ __forceinline__ void prefetch_group(const DeviceQuantMatrix& w, uint32_t g,
                                               uint32_t lane, uint32_t scale_bytes) {
  if (g * kGroupRows >= w.n) return;
  const size_t group_code_bytes = size_t{w.chunks} * code_chunk_bytes(w.format);
  prefetch_l2(w.codes + size_t{g} * group_code_bytes, group_code_bytes, lane);
  prefetch_group_planes(w, g, lane, scale_bytes);
}

// ---- Host side ---------------------------------------------------------------------------------

// Programmatic dependent launch unless QMOE_CUDA_PDL=0 (read once; for A/B measurements).
inline bool pdl_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("QMOE_CUDA_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

// Whether a device of compute capability `major` takes the programmatic-serialization launch:
// sm_90 and up, unless QMOE_CUDA_PDL=0. Every decode launcher decides by this rule.
inline bool pdl_for_compute_capability(int major) {
  return major >= 9 && pdl_enabled();
}

// The same for the current device, into *pdl; the runtime's error when it cannot be asked.
inline cudaError_t pdl_on_current_device(bool* pdl) {
  int device = 0, major = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  *pdl = e == cudaSuccess && pdl_for_compute_capability(major);
  return e;
}

#ifdef QMOE_CUDA_HOST_EMULATION
template <class Params>
cudaError_t launch_decode_kernel(void (*fn)(Params), dim3 grid, dim3 block, size_t smem, bool,
                                 const Params& params, cudaStream_t) {
  return qmoe_host_emulator_launch(fn, grid, block, smem, params);
}
#else
// Launches kernel(args...) with `config` and its own attributes (at most two), plus programmatic
// stream serialization when `pdl`. A runtime or stream that refuses that attribute gets the
// launch without it, unless a capture is in progress (its state is the caller's). Returns the
// launch's error.
template <class... KernelParams, class... Args>
cudaError_t launch_with_optional_pdl(cudaLaunchConfig_t config, bool pdl,
                                     void (*kernel)(KernelParams...), const Args&... args) {
  constexpr unsigned kMostOwn = 2;
  if (config.numAttrs > kMostOwn) return cudaErrorInvalidValue;
  cudaLaunchAttribute attributes[kMostOwn + 1]{};
  const unsigned own = config.numAttrs;
  for (unsigned i = 0; i < own; ++i) attributes[i] = config.attrs[i];
  unsigned count = own;
  if (pdl) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = count != 0 ? attributes : nullptr;
  config.numAttrs = count;
  cudaError_t e = cudaLaunchKernelEx(&config, kernel, args...);
  if (e != cudaSuccess && pdl) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(config.stream, &capturing) == cudaSuccess &&
        capturing == cudaStreamCaptureStatusNone) {
      cudaGetLastError();
      config.attrs = own != 0 ? attributes : nullptr;
      config.numAttrs = own;
      e = cudaLaunchKernelEx(&config, kernel, args...);
    }
  }
  return e != cudaSuccess ? e : cudaGetLastError();
}

// Launches fn<<<grid, block, smem, stream>>>(params), with programmatic stream serialization
// when `pdl`, as launch_with_optional_pdl does. Returns the launch's error.
//
// Dynamic shared memory. A kernel's default limit is 48 KiB less its static shared memory, not
// 48 KiB: a launch between the two fails with cudaErrorInvalidValue. So the limit is read, and
// when this launch needs more it is raised to the most the device allows beside the static
// memory. Always to that one value, so that host threads launching the same kernel with
// different sizes never lower it under one another.
template <class Params>
cudaError_t launch_decode_kernel(void (*fn)(Params), dim3 grid, dim3 block, size_t smem, bool pdl,
                                 const Params& params, cudaStream_t stream) {
  const void* kernel = reinterpret_cast<const void*>(fn);
  cudaFuncAttributes attributes{};
  cudaError_t e = cudaFuncGetAttributes(&attributes, kernel);
  if (e != cudaSuccess) return e;
  if (smem > static_cast<size_t>(attributes.maxDynamicSharedSizeBytes)) {
    int device = 0, optin = 0;
    e = cudaGetDevice(&device);
    if (e == cudaSuccess) {
      e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    }
    if (e == cudaSuccess) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               optin - static_cast<int>(attributes.sharedSizeBytes));
    }
    if (e != cudaSuccess) return e;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  return launch_with_optional_pdl(config, pdl, fn, params);
}
#endif  // QMOE_CUDA_HOST_EMULATION

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_GRID_DEPENDENCY_CUH_
