#include "lib/cuda/device_expert_set.cuh"

#include <cuda_runtime_api.h>

#include <new>
#include <vector>

#include "lib/cuda/cuda_status.h"
#include "lib/error.h"
#include "lib/formats/quant_matrix.h"
#include "lib/memory_ranges.h"

namespace qmoe::cuda {
namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t v) {
  return (v + kAlign - 1) & ~(kAlign - 1);
}

// Where one projection's spans go in the allocation: offsets of codes, scales, zero points
// and bias (the last two 0 when absent).
struct Placement {
  size_t codes, scales, zero_points, bias;
};

// One copy of the upload.
struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
};

// Reserve the matrix's spans at `at`, record their copies (dst filled once the base is known).
Placement place(const qmoe_quant_matrix& w, size_t* at, std::vector<Copy>* copies,
                std::vector<size_t>* offsets) {
  MemorySpan spans[4];
  const size_t count = matrix_spans(w, spans);  // validated: never 0
  size_t off[4] = {};
  for (size_t i = 0; i < count; ++i) {
    off[i] = *at;
    *at += align_up(spans[i].bytes);
    copies->push_back({nullptr, spans[i].data, spans[i].bytes});
    offsets->push_back(off[i]);
  }
  Placement p{off[0], off[1], 0, 0};
  size_t next = 2;
  if (w.zero_points != nullptr) p.zero_points = off[next++];
  if (w.bias != nullptr) p.bias = off[next];
  return p;
}

DeviceQuantMatrix device_matrix(const qmoe_quant_matrix& w, const Placement& p,
                                unsigned char* base) {
  DeviceQuantMatrix d{};
  d.n = w.n;
  d.k = w.k;
  d.block_size = w.block_size;
  d.chunks = (w.k + kChunkCodes - 1) / kChunkCodes;
  d.codes = base + p.codes;
  d.scale_dtype = w.scale_dtype;
  d.scales = base + p.scales;
  d.scale_row_stride = w.scale_row_stride;
  d.scale_block_stride = w.scale_block_stride;
  d.scale_group_stride = w.scale_group_stride;
  d.zero_points = w.zero_points != nullptr ? base + p.zero_points : nullptr;
  d.zero_point_row_stride = w.zero_point_row_stride;
  d.zero_point_block_stride = w.zero_point_block_stride;
  d.zero_point_group_stride = w.zero_point_group_stride;
  d.bias_dtype = w.bias_dtype;
  d.bias = w.bias != nullptr ? base + p.bias : nullptr;
  return d;
}

// Every copy on `stream`: one batch where the runtime has it, else (or when asked) a loop.
cudaError_t copy_all(const std::vector<Copy>& copies, bool batched, cudaStream_t stream) {
#if CUDART_VERSION >= 12080
  if (batched && !copies.empty()) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    dsts.reserve(copies.size());
    srcs.reserve(copies.size());
    sizes.reserve(copies.size());
    for (const Copy& c : copies) {
      dsts.push_back(c.dst);
      srcs.push_back(c.src);
      sizes.push_back(c.bytes);
    }
    // The sources are the caller's host buffers, untouched by earlier work on this private
    // stream: stream order is all the copies need.
    cudaMemcpyAttributes attrs{};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
    const cudaError_t e = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                                               copies.size(), &attrs, &first, 1, stream);
    if (e != cudaErrorNotSupported) return e;
    cudaGetLastError();  // not on this platform: the loop below
  }
#else
  (void)batched;
#endif
  for (const Copy& c : copies) {
    const cudaError_t e = cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

DeviceScope::DeviceScope(int device) {
  cudaGetDevice(&previous_);
  status_ = cudaSetDevice(device);
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

qmoe_status check_device_pointer(const char* function, const char* what, const void* p,
                                 int device) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s: cudaPointerGetAttributes: %s", what,
                cudaGetErrorName(e));
  }
  const bool usable =
      (a.type == cudaMemoryTypeDevice && a.device == device) || a.type == cudaMemoryTypeManaged;
  if (!usable) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "%s is not device memory of device %d (memory type %d, device %d)", what, device,
                static_cast<int>(a.type), a.device);
  }
  return QMOE_STATUS_OK;
}

qmoe_status create_device_expert_set(const char* function, const CudaExpertUpload& upload,
                                     DeviceExpertSet** out) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return status_from_cuda(e, function, "cudaGetDeviceCount");
  }
  if (upload.device >= count) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "device %d: %d visible", upload.device,
                count);
  }
  DeviceScope scope(upload.device);
  if (scope.status() != cudaSuccess) {
    return status_from_cuda(static_cast<cudaError_t>(scope.status()), function, "cudaSetDevice");
  }
  const uint32_t slots = upload.num_resident;
  std::vector<Copy> copies;
  std::vector<size_t> offsets;
  std::vector<Placement> fc1_at, fc2_at;
  size_t at = 0;
  try {
    copies.reserve(size_t{slots} * 8 + 3);
    fc1_at.reserve(slots);
    fc2_at.reserve(slots);
    for (uint32_t s = 0; s < slots; ++s) {
      const uint32_t e = upload.resident != nullptr ? upload.resident[s] : s;
      fc1_at.push_back(place(upload.fc1[e], &at, &copies, &offsets));
      fc2_at.push_back(place(upload.fc2[e], &at, &copies, &offsets));
    }
  } catch (const std::bad_alloc&) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the copy list failed");
  }
  const size_t desc_bytes = size_t{slots} * sizeof(DeviceQuantMatrix);
  const size_t fc1_off = at;
  const size_t fc2_off = fc1_off + align_up(desc_bytes);
  const size_t map_off = fc2_off + align_up(desc_bytes);
  const size_t total = map_off + align_up(size_t{upload.num_experts} * sizeof(int32_t));

  auto* set = new (std::nothrow) DeviceExpertSet{};
  if (set == nullptr) return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the set failed");
  if (const cudaError_t e = cudaMalloc(&set->memory, total); e != cudaSuccess) {
    delete set;
    cudaGetLastError();
    return status_from_cuda(e, function, "cudaMalloc of the experts");
  }
  auto* base = static_cast<unsigned char*>(set->memory);
  for (size_t i = 0; i < copies.size(); ++i) copies[i].dst = base + offsets[i];

  // The descriptions and the map, built on the host and copied with the weights.
  std::vector<DeviceQuantMatrix> fc1, fc2;
  std::vector<int32_t> map;
  try {
    fc1.resize(slots);
    fc2.resize(slots);
    map.assign(upload.num_experts, -1);
  } catch (const std::bad_alloc&) {
    cudaFree(set->memory);
    delete set;
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the descriptions failed");
  }
  for (uint32_t s = 0; s < slots; ++s) {
    const uint32_t e = upload.resident != nullptr ? upload.resident[s] : s;
    fc1[s] = device_matrix(upload.fc1[e], fc1_at[s], base);
    fc2[s] = device_matrix(upload.fc2[e], fc2_at[s], base);
    map[e] = static_cast<int32_t>(s);
  }
  copies.push_back({base + fc1_off, fc1.data(), desc_bytes});
  copies.push_back({base + fc2_off, fc2.data(), desc_bytes});
  copies.push_back({base + map_off, map.data(), map.size() * sizeof(int32_t)});

  cudaStream_t stream = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    e = copy_all(copies, upload.batched, stream);
    const cudaError_t sync = cudaStreamSynchronize(stream);
    if (e == cudaSuccess) e = sync;
    cudaStreamDestroy(stream);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    cudaFree(set->memory);
    delete set;
    return status_from_cuda(e, function, "copying the experts");
  }
  set->device = upload.device;
  set->num_experts = upload.num_experts;
  set->hidden = upload.hidden;
  set->intermediate = upload.intermediate;
  set->num_slots = slots;
  set->interleaved = upload.interleaved;
  set->alpha = upload.alpha;
  set->beta = upload.beta;
  set->limit = upload.limit;
  set->fc1 = reinterpret_cast<DeviceQuantMatrix*>(base + fc1_off);
  set->fc2 = reinterpret_cast<DeviceQuantMatrix*>(base + fc2_off);
  set->residency = reinterpret_cast<int32_t*>(base + map_off);
  *out = set;
  return QMOE_STATUS_OK;
}

void destroy_device_expert_set(DeviceExpertSet* set) {
  DeviceScope scope(set->device);
  // Kernels of any stream may still read the weights: the device's work ends first.
  cudaDeviceSynchronize();
  cudaFree(set->memory);
  cudaGetLastError();
  delete set;
}

}  // namespace qmoe::cuda
