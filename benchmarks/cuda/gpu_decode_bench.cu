// qmoe_cuda_bench: the CUDA decode kernels against the device's HBM read roof, measured in the
// same process (Google Benchmark, CUDA-event manual time).
//
//   gpu/read_roof                      a streaming read of 4 GiB (uint4 loads, grid-stride):
//                                      the roof every other row is a fraction of
//   gpu/int4_gemv/<shape>/<level>/m:M  one GEMV launch per weight copy; copies rotate over
//                                      more than 4x the L2 so each call reads from HBM.
//                                      shapes: qwen3_fc1 [1536, 2048], qwen3_fc2 [2048, 768],
//                                      gptoss [5760, 2880]; block 32, FP16 grouped scales
//   gpu/mxfp4_gemv/gptoss/<level>/m:M  the same GEMV on MXFP4 weights (gpt-oss-20b's format:
//                                      E8M0 bytes per 32, grouped)
//   gpu/nvfp4_gemv/<qwen3 shape>/...   and on NVFP4 weights (E4M3 bytes per 16, grouped, a
//                                      global scale) at Qwen3-30B-A3B's expert shapes
//   gpu/int3_gemv/<shape>/<level>/m:M  and on INT3 weights (96-byte tiles, FP16 grouped scales
//                                      per 32, no zero points) at the int4_gemv rows' shapes
//   gpu/moe_layer/qwen3/<level>/m:M    one layer (E 128, H 2048, I 768, top-8, all resident:
//                                      340 MB), each call routed to the next experts; no
//                                      two tokens of a call share an expert
//   .../m:M/shared_experts             (M = 2..512) every token of a call to the same 8 experts
//   .../m:M/shared_experts/hinted      the same, with expected_tokens_per_expert = M
//   .../m:M/random_routing             (M = 2..512) each token to 8 experts drawn uniformly
//   gpu/moe_layer/qwen3_int3/<level>/m:M  the layer (M = 1, 4; no two tokens share an expert)
//                                      with INT3 experts (FP16 scales per 32, grouped: 264 MB);
//                                      /general_walk as below, for INT3's lean walk
//   gpu/moe_layer/gptoss20b/<level>/m:M  gpt-oss-20b's layer (E 32, H 2880, I 2880, top-4,
//                                      MXFP4: 426 MB; its clamped SwiGLU), M = 1, 4, 8 with no
//                                      two tokens on one expert; .../m:M/random_routing at 8, 64
//   gpu/moe_stack48/qwen3/<level>/m:1  48 such layers (16 GB of INT4) captured in ONE CUDA
//                                      graph, x of layer l+1 = y of layer l; each replay routes
//                                      every layer to 8 other experts. /early_routing: with
//                                      inputs_ready_early (each FC1 routes and prefetches
//                                      while the previous layer's FC2 runs)
//   .../concatenated                   the layer (M = 1, 4) and the stack (routing not early)
//                                      with FC1's gate and up rows concatenated (the other
//                                      rows interleave them)
//   .../expert_counts                  the stack (fast, routing not early) with every layer
//                                      writing its selections per expert (expert_counts) into
//                                      a [48, E] buffer, copied to pinned host memory after
//                                      each replay (what a runtime's expert cache reads)
//   .../logits                         the same stack routed from BF16 router logits (each
//                                      block of both kernels ranks them), whose top 8 are the
//                                      ids of the rows above; its counts checked the same way
//   .../general_walk                   the layer and the stack (M = 1, routing not early) on
//                                      the kernels that also hold the general INT4 walk, on
//                                      the same bytes: the others run the lean walk's
//                                      (MoeLayerParams::lean_walk), as a device expert set
//                                      of these experts does
//   gpu/moe_stack48/qwen3/read_only/<structure>  the stack's replay with every layer's kernels
//                                      replaced by reads of the same bytes (each layer's 8
//                                      routed experts' FC1, then FC2, codes and scales; ids from
//                                      device memory) and no arithmetic: what the structure
//                                      alone leaves of the roof. two_kernels: FC1's bytes,
//                                      then FC2's, each a kernel that starts when the one
//                                      before it ends (stream order); /pdl: launched with
//                                      programmatic serialization, each waiting for the one
//                                      before it (griddepcontrol) before it reads, as the
//                                      layer's kernels do; /pdl_prefetch: and each first
//                                      prefetching its bytes into the L2 before its wait, as
//                                      FC2 (and FC1 with early routing) do; /flags: each
//                                      waiting instead for a counter the blocks of the one
//                                      before it add to when done (release / acquire at GPU
//                                      scope), not for its grid. one_kernel/pdl: one
//                                      kernel a layer reads both. one_launch: one kernel reads
//                                      all 48 layers' bytes, with no dependency
// Counters: bytes_per_second (weights the calls must read: codes + scales), frac_of_roof
// (that over gpu/read_roof's rate), us_per_call (per launch, layer or replay).
#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/cuda/decode_formats.cuh"
#include "lib/cuda/device_quant_matrix.cuh"
#include "lib/cuda/grid_dependency.cuh"
#include "lib/cuda/int4_gemv.cuh"
#include "lib/cuda/int4_tile.cuh"
#include "lib/cuda/moe_layer.cuh"

namespace qmoe::cuda {
namespace {

double g_roof_bytes_per_second = 0.0;

#define BENCH_CUDA(expr, state)                                                                 \
  do {                                                                                          \
    const cudaError_t bench_e = (expr);                                                         \
    if (bench_e != cudaSuccess) {                                                               \
      (state).SkipWithError((std::string(#expr) + ": " + cudaGetErrorString(bench_e)).c_str()); \
      return;                                                                                   \
    }                                                                                           \
  } while (0)

// ---- Device memory -------------------------------------------------------------------------

struct DeviceMemory {
  void* p = nullptr;
  explicit DeviceMemory(size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      p = nullptr;
      cudaGetLastError();
    }
  }
  ~DeviceMemory() {
    if (p != nullptr) cudaFree(p);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Random codes: a hash of the word index.
__global__ void fill_random_words(uint32_t* p, size_t words, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed ^ static_cast<uint32_t>(i >> 32);
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    p[i] = x;
  }
}

// FP16 scales between 2^-9 and 2^-6 with either sign (0x2000..0x23FF | sign).
__global__ void fill_scales_f16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t x = (static_cast<uint32_t>(i) * 2654435761u) ^ seed;
    p[i] = static_cast<uint16_t>(0x1C00 | (x & 0x0FFF) | ((x >> 16) & 0x8000));
  }
}

__global__ void fill_u32_value(uint32_t* p, size_t n, uint32_t v) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    p[i] = v;
  }
}

__global__ void fill_f16_value(uint16_t* p, size_t n, uint16_t v) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    p[i] = v;
  }
}

// Streaming read: every thread XORs its uint4s; one word per block keeps the loads alive.
__global__ void read_stream(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

int sm_count() {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms > 0 ? sms : 1;
}

// Seconds of the best of `repeats` streaming reads of `bytes`.
double time_read(const DeviceMemory& buffer, size_t bytes, uint32_t* sink, int repeats) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const unsigned blocks = static_cast<unsigned>(sm_count()) * 8;
  float best = 1e30f;
  for (int r = 0; r < repeats; ++r) {
    cudaEventRecord(a);
    read_stream<<<blocks, 512>>>(buffer.as<const uint4>(), bytes / 16, sink);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best * 1e-3;
}

constexpr size_t kRoofBytes = size_t{4} << 30;

void BM_ReadRoof(benchmark::State& state) {
  DeviceMemory buffer(kRoofBytes), sink(1 << 16);
  if (buffer.p == nullptr || sink.p == nullptr) {
    state.SkipWithError("cannot allocate 4 GiB for the read roof");
    return;
  }
  BENCH_CUDA(cudaMemset(buffer.p, 1, kRoofBytes), state);
  for (auto _ : state) {
    state.SetIterationTime(time_read(buffer, kRoofBytes, sink.as<uint32_t>(), 1));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kRoofBytes));
}

// ---- Weights ---------------------------------------------------------------------------------

// Scale bytes of the E2M1 formats, never NaN: E8M0 2^-8 .. 2^-1 (0x77..0x7E); E4M3 positive
// and negative normals 2^-3 .. 1.875 (0x20..0x3F | sign).
__global__ void fill_scale_bytes(uint8_t* p, size_t n, uint32_t seed, bool e8m0) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t x = (static_cast<uint32_t>(i) * 2654435761u) ^ seed;
    p[i] = static_cast<uint8_t>(e8m0 ? 0x77 + x % 8 : 0x20 | (x & 0x1F) | ((x >> 16) & 0x80));
  }
}

// One [n, k] matrix's bytes: canonical codes (INT3: 96-byte tiles, every bit pattern a valid
// code; the others 128-byte tiles), then the format's scales in the grouped order (INT4 and
// INT3: FP16 per 32; MXFP4: E8M0 per 32; NVFP4: E4M3 per 16, global scale 1/64).
struct MatrixLayout {
  uint32_t n, k;
  qmoe_weight_format format;
  uint32_t block;
  size_t codes_bytes, scale_bytes;
  size_t bytes() const { return codes_bytes + scale_bytes; }
  MatrixLayout(uint32_t rows, uint32_t cols, qmoe_weight_format f = QMOE_WEIGHT_FORMAT_INT4)
      : n(rows), k(cols), format(f), block(f == QMOE_WEIGHT_FORMAT_NVFP4 ? 16 : 32) {
    codes_bytes = size_t{(n + 7) / 8} * ((k + 31) / 32) * code_chunk_bytes(f);
    scale_bytes = size_t{(n + 7) / 8} * 8 * (k / block) * scale_element_bytes(scale_dtype());
  }
  qmoe_dtype scale_dtype() const {
    return format == QMOE_WEIGHT_FORMAT_MXFP4   ? QMOE_DTYPE_E8M0
           : format == QMOE_WEIGHT_FORMAT_NVFP4 ? QMOE_DTYPE_F8_E4M3
                                                : QMOE_DTYPE_F16;
  }
  DeviceQuantMatrix describe(unsigned char* base) const {
    DeviceQuantMatrix w{};
    w.n = n;
    w.k = k;
    w.block_size = block;
    w.chunks = (k + 31) / 32;
    w.codes = base;
    w.format = format;
    w.global_scale = format == QMOE_WEIGHT_FORMAT_NVFP4 ? 0.015625f : 1.0f;
    w.scale_dtype = scale_dtype();
    w.scales = base + codes_bytes;
    w.scale_row_stride = 1;
    w.scale_block_stride = 8;
    w.scale_group_stride = size_t{8} * (k / block);
    w.bias_dtype = QMOE_DTYPE_F32;
    return w;
  }
};

void fill_matrix(const MatrixLayout& l, unsigned char* base, uint32_t seed) {
  fill_random_words<<<1024, 256>>>(reinterpret_cast<uint32_t*>(base), l.codes_bytes / 4, seed);
  if (l.format == QMOE_WEIGHT_FORMAT_INT4 || l.format == QMOE_WEIGHT_FORMAT_INT3) {
    fill_scales_f16<<<256, 256>>>(reinterpret_cast<uint16_t*>(base + l.codes_bytes),
                                  l.scale_bytes / 2, seed * 7 + 1);
  } else {
    fill_scale_bytes<<<256, 256>>>(base + l.codes_bytes, l.scale_bytes, seed * 7 + 1,
                                   l.format == QMOE_WEIGHT_FORMAT_MXFP4);
  }
}

size_t l2_bytes() {
  int device = 0, l2 = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
  return l2 > 0 ? static_cast<size_t>(l2) : size_t{64} << 20;
}

// Counters of an iteration that reads bytes_per_iteration of weights in calls_per_iteration
// calls: bytes/s, that over the roof, and microseconds per call.
void report(benchmark::State& state, double bytes_per_iteration, double calls_per_iteration) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes_per_iteration));
  state.counters["frac_of_roof"] =
      benchmark::Counter(bytes_per_iteration / std::max(g_roof_bytes_per_second, 1.0),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["us_per_call"] =
      benchmark::Counter(calls_per_iteration * 1e-6, benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}

// Times each iteration by CUDA events on `stream` around what `timed()` enqueues (it returns
// the first failed call's error, which ends the run); `untimed()` enqueues what each iteration
// needs ahead of the first event.
template <class Untimed, class Timed>
void time_iterations(benchmark::State& state, cudaStream_t stream, const Untimed& untimed,
                     const Timed& timed) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (auto _ : state) {
    untimed();
    cudaEventRecord(a, stream);
    const cudaError_t e = timed();
    if (e != cudaSuccess) {
      state.SkipWithError(cudaGetErrorString(e));
      break;
    }
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  BENCH_CUDA(cudaStreamSynchronize(stream), state);
  BENCH_CUDA(cudaGetLastError(), state);
}

const auto kNothing = []() {};

// ---- GEMV ------------------------------------------------------------------------------------

void BM_Gemv(benchmark::State& state, qmoe_weight_format format, uint32_t n, uint32_t k,
             qmoe_accuracy accuracy, uint32_t m) {
  const MatrixLayout l(n, k, format);
  const size_t stride = (l.bytes() + 255) / 256 * 256;
  const size_t copies = std::max<size_t>(8, 4 * l2_bytes() / l.bytes() + 1);
  DeviceMemory weights(copies * stride), x(size_t{8} * k * 4), y(size_t{8} * n * 4);
  if (weights.p == nullptr || x.p == nullptr || y.p == nullptr) {
    state.SkipWithError("device allocation failed");
    return;
  }
  std::vector<DeviceQuantMatrix> w(copies);
  for (size_t c = 0; c < copies; ++c) {
    unsigned char* base = weights.as<unsigned char>() + c * stride;
    fill_matrix(l, base, static_cast<uint32_t>(c + 1));
    w[c] = l.describe(base);
  }
  fill_u32_value<<<64, 256>>>(x.as<uint32_t>(), size_t{8} * k, 0x3F800000u);  // x = 1.0f
  BENCH_CUDA(cudaDeviceSynchronize(), state);
  time_iterations(state, nullptr, kNothing, [&]() {
    cudaError_t e = cudaSuccess;
    for (size_t c = 0; c < copies && e == cudaSuccess; ++c) {
      e = launch_int4_gemv(w[c], accuracy, m, QMOE_DTYPE_F32, x.p, k, QMOE_DTYPE_F32, y.p, n, 0, n,
                           nullptr);
    }
    return e;
  });
  report(state, double(copies) * l.bytes(), double(copies));
}

// ---- MoE layer and the 48-layer stack --------------------------------------------------------

// A layer's shape, SwiGLU and weight format: the models the layer rows stand for.
struct MoeShape {
  uint32_t experts, top_k, hidden, inter;
  qmoe_weight_format format;
  float alpha, beta, limit;  // SwiGLU

  // The projections: FC1 [2I, H], FC2 [H, I].
  MatrixLayout fc1() const { return MatrixLayout(2 * inter, hidden, format); }
  MatrixLayout fc2() const { return MatrixLayout(hidden, inter, format); }
  // All experts of a layer in one allocation: per expert FC1 then FC2 (codes + scales).
  size_t fc2_offset() const { return (fc1().bytes() + 255) / 256 * 256; }
  size_t expert_stride() const { return (fc2_offset() + fc2().bytes() + 255) / 256 * 256; }
  size_t expert_weight_bytes() const { return fc1().bytes() + fc2().bytes(); }
  size_t workspace_bytes(uint32_t m) const {
    return moe_layer_workspace_size(m, top_k, experts, hidden, inter);
  }
};

// Qwen3-30B-A3B (INT4 and INT3 experts: FP16 scales per 32), gpt-oss-20b (MXFP4, its clamped
// SwiGLU: alpha 1.702, up + 1, limit 7).
constexpr MoeShape kQwen3{128, 8, 2048, 768, QMOE_WEIGHT_FORMAT_INT4, 1.0f, 0.0f, INFINITY};
constexpr MoeShape kQwen3Int3{128, 8, 2048, 768, QMOE_WEIGHT_FORMAT_INT3, 1.0f, 0.0f, INFINITY};
constexpr MoeShape kGptOss20b{32, 4, 2880, 2880, QMOE_WEIGHT_FORMAT_MXFP4, 1.702f, 1.0f, 7.0f};

// Descriptions of one layer's experts in device memory (slot e holds expert e).
bool describe_layer(const MoeShape& shape, unsigned char* base, DeviceMemory& d1, DeviceMemory& d2,
                    uint32_t seed) {
  const MatrixLayout fc1 = shape.fc1(), fc2 = shape.fc2();
  std::vector<DeviceQuantMatrix> h1(shape.experts), h2(shape.experts);
  for (uint32_t e = 0; e < shape.experts; ++e) {
    unsigned char* p = base + e * shape.expert_stride();
    fill_matrix(fc1, p, seed + 2 * e);
    fill_matrix(fc2, p + shape.fc2_offset(), seed + 2 * e + 1);
    h1[e] = fc1.describe(p);
    h2[e] = fc2.describe(p + shape.fc2_offset());
  }
  return cudaMemcpy(d1.p, h1.data(), sizeof(h1[0]) * shape.experts, cudaMemcpyHostToDevice) ==
             cudaSuccess &&
         cudaMemcpy(d2.p, h2.data(), sizeof(h2[0]) * shape.experts, cudaMemcpyHostToDevice) ==
             cudaSuccess;
}

constexpr qmoe_swiglu_fusion kInterleaved = QMOE_SWIGLU_INTERLEAVED;

// How a call's M tokens pick their experts (the rows' suffixes):
//   kDisjoint (no suffix): set s routes token t to experts (k (s + t * 3) + j) % E: at M <= 8
//     no two tokens share an expert (k = 8 of E = 128, and k = 4 of 32), so a call reads k M
//     experts;
//   kShared ("/shared_experts"): every token of set s to experts k s + j: the fewest bytes, and
//     the most tokens per expert;
//   kRandom ("/random_routing"): each token to k distinct experts drawn uniformly (a fixed
//     seed), as a router with no preference spreads them: some tokens share experts.
// Weights are 1/k.
enum class Routing { kDisjoint, kShared, kRandom };

std::vector<int32_t> routing_ids(const MoeShape& shape, uint32_t sets, uint32_t m,
                                 Routing routing = Routing::kDisjoint) {
  const uint32_t kTopK = shape.top_k, kExperts = shape.experts;
  std::vector<int32_t> ids(size_t{sets} * m * kTopK);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  const auto next = [&state]() {  // xorshift64*
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return static_cast<uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
  };
  for (uint32_t s = 0; s < sets; ++s) {
    for (uint32_t t = 0; t < m; ++t) {
      int32_t* row = ids.data() + (size_t{s} * m + t) * kTopK;
      for (uint32_t j = 0; j < kTopK; ++j) {
        switch (routing) {
          case Routing::kDisjoint:
            row[j] = static_cast<int32_t>((kTopK * (s + t * 3) + j) % kExperts);
            break;
          case Routing::kShared:
            row[j] = static_cast<int32_t>((kTopK * s + j) % kExperts);
            break;
          case Routing::kRandom: {
            int32_t e = 0;
            do {
              e = static_cast<int32_t>(next() % kExperts);
            } while (std::find(row, row + j, e) != row + j);
            row[j] = e;
            break;
          }
        }
      }
    }
  }
  return ids;
}

// lean: the kernels of the lean INT4 or INT3 walk, as a device expert set of these experts picks
// (int4_lean_layout holds for them); false runs the kernels that also hold the general walk, on
// the same bytes (the "/general_walk" rows: what the lean policy gains, in one process). The
// E2M1 formats have no lean walk: they run their own kernels, as a device set of them does.
MoeLayerParams layer_params(const MoeShape& shape, qmoe_accuracy accuracy, uint32_t m,
                            const DeviceMemory& d1, const DeviceMemory& d2, bool lean,
                            qmoe_swiglu_fusion fusion) {
  MoeLayerParams p{};
  p.num_experts = shape.experts;
  p.hidden = shape.hidden;
  p.intermediate = shape.inter;
  p.top_k = shape.top_k;
  p.m_capacity = m;
  p.num_slots = shape.experts;
  p.accuracy = accuracy;
  p.dtype = QMOE_DTYPE_BF16;
  p.fusion = fusion;
  p.alpha = shape.alpha;
  p.beta = shape.beta;
  p.limit = shape.limit;
  p.format = shape.format;
  p.lean_walk = lean && has_lean_decode(shape.format) &&
                int4_lean_layout(shape.fc1().describe(nullptr)) &&
                int4_lean_layout(shape.fc2().describe(nullptr));
  p.fc1 = d1.as<const DeviceQuantMatrix>();
  p.fc2 = d2.as<const DeviceQuantMatrix>();
  p.ldx = shape.hidden;
  p.ldy = shape.hidden;
  p.workspace_bytes = shape.workspace_bytes(m);
  return p;
}

// Distinct experts of routing set s (the bytes a call must read).
size_t distinct_experts(const std::vector<int32_t>& ids, uint32_t m, uint32_t k, uint32_t s) {
  std::vector<int32_t> e(ids.begin() + size_t{s} * m * k, ids.begin() + size_t{s + 1} * m * k);
  std::sort(e.begin(), e.end());
  return static_cast<size_t>(std::unique(e.begin(), e.end()) - e.begin());
}

// tokens_hint: MoeLayerParams::expected_tokens_per_expert (0: none).
void BM_MoeLayer(benchmark::State& state, MoeShape shape, qmoe_accuracy accuracy, uint32_t m,
                 bool lean, qmoe_swiglu_fusion fusion, Routing routing, float tokens_hint) {
  constexpr uint32_t kSets = 16;
  const uint32_t kExperts = shape.experts, kTopK = shape.top_k, kHidden = shape.hidden;
  DeviceMemory weights(kExperts * shape.expert_stride()), d1(kExperts * sizeof(DeviceQuantMatrix)),
      d2(kExperts * sizeof(DeviceQuantMatrix)), ids(size_t{kSets} * m * kTopK * 4),
      wts(size_t{m} * kTopK * 4), residency(kExperts * 4), count(4), x(size_t{m} * kHidden * 2),
      y(size_t{m} * kHidden * 2), ws(shape.workspace_bytes(m));
  if (weights.p == nullptr || ws.p == nullptr || ids.p == nullptr) {
    state.SkipWithError("device allocation failed");
    return;
  }
  if (!describe_layer(shape, weights.as<unsigned char>(), d1, d2, 17)) {
    state.SkipWithError("copy of the descriptions failed");
    return;
  }
  const std::vector<int32_t> h_ids = routing_ids(shape, kSets, m, routing);
  const std::vector<float> h_w(size_t{m} * kTopK, 1.0f / kTopK);
  std::vector<int32_t> h_res(kExperts);
  for (uint32_t e = 0; e < kExperts; ++e) h_res[e] = static_cast<int32_t>(e);
  BENCH_CUDA(cudaMemcpy(ids.p, h_ids.data(), h_ids.size() * 4, cudaMemcpyHostToDevice), state);
  BENCH_CUDA(cudaMemcpy(wts.p, h_w.data(), h_w.size() * 4, cudaMemcpyHostToDevice), state);
  BENCH_CUDA(cudaMemcpy(residency.p, h_res.data(), h_res.size() * 4, cudaMemcpyHostToDevice),
             state);
  BENCH_CUDA(cudaMemcpy(count.p, &m, 4, cudaMemcpyHostToDevice), state);
  fill_f16_value<<<64, 256>>>(x.as<uint16_t>(), size_t{m} * kHidden, 0x3F80);  // BF16 1.0
  BENCH_CUDA(cudaDeviceSynchronize(), state);
  MoeLayerParams p = layer_params(shape, accuracy, m, d1, d2, lean, fusion);
  p.expected_tokens_per_expert = tokens_hint;
  p.m = count.as<const uint32_t>();
  p.x = x.p;
  p.y = y.p;
  p.weights = wts.as<const float>();
  p.residency = residency.as<const int32_t>();
  p.workspace = ws.p;
  double bytes = 0;
  for (uint32_t s = 0; s < kSets; ++s) {
    bytes += double(distinct_experts(h_ids, m, kTopK, s)) * shape.expert_weight_bytes();
  }
  time_iterations(state, nullptr, kNothing, [&]() {
    cudaError_t e = cudaSuccess;
    for (uint32_t s = 0; s < kSets && e == cudaSuccess; ++s) {
      p.ids = ids.as<const int32_t>() + size_t{s} * m * kTopK;
      e = launch_moe_layer(p, nullptr);
    }
    return e;
  });
  report(state, bytes, kSets);
}

// Times each iteration as one replay of `exec` on `stream` (CUDA events around it): `before()`
// enqueues the replay's routing ahead of the first event, `after()` what the replay's time
// includes behind the launch. One untimed replay first.
template <class Before, class After>
void time_replays(benchmark::State& state, cudaGraphExec_t exec, cudaStream_t stream,
                  const Before& before, const After& after) {
  before();
  BENCH_CUDA(cudaGraphLaunch(exec, stream), state);  // warm-up
  BENCH_CUDA(cudaStreamSynchronize(stream), state);
  time_iterations(state, stream, before, [&]() {
    const cudaError_t e = cudaGraphLaunch(exec, stream);
    after();
    return e;
  });
}

// The 48-layer stacks' graph: what `launch_layers(stream)` enqueues (it returns the first failed
// launch's error), captured on a stream of its own and replayed there.
struct StackGraph {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  template <class LaunchLayers>
  cudaError_t capture(const LaunchLayers& launch_layers) {
    cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
    if (e != cudaSuccess) return e;
    const cudaError_t launched = launch_layers(stream);
    e = cudaStreamEndCapture(stream, &graph);
    if (launched != cudaSuccess) return launched;
    return e == cudaSuccess ? cudaGraphInstantiate(&exec, graph, 0) : e;
  }
  ~StackGraph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

// A replay's routing, enqueued on `stream`: layer l's row of `layer_rows` (row_bytes each) from
// row (replay + l) % sets of `set_rows`.
void copy_replay_routing(void* layer_rows, const void* set_rows, size_t row_bytes, uint32_t layers,
                         uint32_t sets, uint32_t replay, cudaStream_t stream) {
  for (uint32_t l = 0; l < layers; ++l) {
    cudaMemcpyAsync(static_cast<unsigned char*>(layer_rows) + l * row_bytes,
                    static_cast<const unsigned char*>(set_rows) + (replay + l) % sets * row_bytes,
                    row_bytes, cudaMemcpyDeviceToDevice, stream);
  }
}

void BM_MoeStack48(benchmark::State& state, qmoe_accuracy accuracy, bool early, bool lean,
                   qmoe_swiglu_fusion fusion, bool counts, bool logits) {
  constexpr uint32_t kLayers = 48, m = 1, kSets = 16;
  const MoeShape& shape = kQwen3;
  const uint32_t kExperts = shape.experts, kTopK = shape.top_k, kHidden = shape.hidden;
  const size_t layer_bytes = size_t{kExperts} * shape.expert_stride();
  DeviceMemory weights(kLayers * layer_bytes);
  if (weights.p == nullptr) {
    state.SkipWithError("cannot allocate 48 layers x 128 experts of INT4 (about 16 GB)");
    return;
  }
  std::vector<std::unique_ptr<DeviceMemory>> descs;
  for (uint32_t l = 0; l < 2 * kLayers; ++l) {
    descs.push_back(std::make_unique<DeviceMemory>(kExperts * sizeof(DeviceQuantMatrix)));
  }
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (!describe_layer(shape, weights.as<unsigned char>() + l * layer_bytes, *descs[2 * l],
                        *descs[2 * l + 1], 1000 * l + 3)) {
      state.SkipWithError("copy of the descriptions failed");
      return;
    }
  }
  // Per layer its routing buffer; replay r copies set (r + l) % kSets into it first.
  const std::vector<int32_t> h_ids = routing_ids(shape, kSets, m);
  DeviceMemory all_ids(h_ids.size() * 4), ids(size_t{kLayers} * kTopK * 4), wts(kTopK * 4),
      residency(kExperts * 4), count(4), acts(size_t{kLayers + 1} * kHidden * 2),
      ws(shape.workspace_bytes(m)), d_counts(size_t{kLayers} * kExperts * 4);
  const std::vector<float> h_w(kTopK, 1.0f / kTopK);
  // /logits: per set, router logits in the layers' dtype (BF16) whose top k are that set's ids
  // (4, 3.75, ... in slot order; every other expert at -1 or below), so the layers read the same
  // experts as from the ids.
  std::vector<uint16_t> h_logits(size_t{kSets} * kExperts);
  const auto bf16 = [](float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); };
  for (uint32_t set = 0; set < kSets; ++set) {
    uint16_t* row = h_logits.data() + size_t{set} * kExperts;
    for (uint32_t e = 0; e < kExperts; ++e) row[e] = bf16(-1.0f - 0.125f * float(e % 7));
    for (uint32_t j = 0; j < kTopK; ++j)
      row[h_ids[size_t{set} * kTopK + j]] = bf16(4.0f - 0.25f * j);
  }
  DeviceMemory all_logits(h_logits.size() * 2), layer_logits(size_t{kLayers} * kExperts * 2);
  BENCH_CUDA(cudaMemcpy(all_logits.p, h_logits.data(), h_logits.size() * 2, cudaMemcpyHostToDevice),
             state);
  uint32_t* h_counts = nullptr;  // pinned: the copy after each replay is asynchronous
  if (counts) BENCH_CUDA(cudaMallocHost(&h_counts, size_t{kLayers} * kExperts * 4), state);
  struct PinnedFree {
    uint32_t* p;
    ~PinnedFree() {
      if (p != nullptr) cudaFreeHost(p);
    }
  } h_counts_guard{h_counts};
  std::vector<int32_t> h_res(kExperts);
  for (uint32_t e = 0; e < kExperts; ++e) h_res[e] = static_cast<int32_t>(e);
  BENCH_CUDA(cudaMemcpy(all_ids.p, h_ids.data(), h_ids.size() * 4, cudaMemcpyHostToDevice), state);
  BENCH_CUDA(cudaMemcpy(wts.p, h_w.data(), h_w.size() * 4, cudaMemcpyHostToDevice), state);
  BENCH_CUDA(cudaMemcpy(residency.p, h_res.data(), h_res.size() * 4, cudaMemcpyHostToDevice),
             state);
  BENCH_CUDA(cudaMemcpy(count.p, &m, 4, cudaMemcpyHostToDevice), state);
  fill_f16_value<<<64, 256>>>(acts.as<uint16_t>(), size_t{kLayers + 1} * kHidden, 0x3F80);
  BENCH_CUDA(cudaDeviceSynchronize(), state);

  const auto launch_layers = [&](cudaStream_t stream) {
    cudaError_t launched = cudaSuccess;
    for (uint32_t l = 0; l < kLayers && launched == cudaSuccess; ++l) {
      MoeLayerParams p =
          layer_params(shape, accuracy, m, *descs[2 * l], *descs[2 * l + 1], lean, fusion);
      p.m = count.as<const uint32_t>();
      p.x = acts.as<uint16_t>() + size_t{l} * kHidden;
      p.y = acts.as<uint16_t>() + size_t{l + 1} * kHidden;
      if (logits) {
        p.logits = layer_logits.as<const uint16_t>() + size_t{l} * kExperts;
        p.renormalize = true;
      } else {
        p.ids = ids.as<const int32_t>() + size_t{l} * kTopK;
        p.weights = wts.as<const float>();
      }
      p.residency = residency.as<const int32_t>();
      p.workspace = ws.p;
      p.inputs_ready_early = early;  // the routing is written before the graph launch
      if (counts) p.expert_counts = d_counts.as<uint32_t>() + size_t{l} * kExperts;
      launched = launch_moe_layer(p, stream);
    }
    return launched;
  };
  StackGraph g;
  BENCH_CUDA(g.capture(launch_layers), state);
  const double bytes = double(kLayers) * kTopK * shape.expert_weight_bytes();
  uint32_t replay = 0;
  const auto set_routing = [&]() {
    if (logits) {
      copy_replay_routing(layer_logits.p, all_logits.p, kExperts * 2, kLayers, kSets, replay,
                          g.stream);
    } else {
      copy_replay_routing(ids.p, all_ids.p, kTopK * 4, kLayers, kSets, replay, g.stream);
    }
    ++replay;
  };
  time_replays(state, g.exec, g.stream, set_routing, [&]() {
    if (counts) {
      cudaMemcpyAsync(h_counts, d_counts.p, size_t{kLayers} * kExperts * 4, cudaMemcpyDeviceToHost,
                      g.stream);
    }
  });
  if (state.error_occurred()) return;
  uint32_t error = 0;
  BENCH_CUDA(cudaMemcpy(&error, ws.p, 4, cudaMemcpyDeviceToHost), state);
  if (error != 0) state.SkipWithError("the layer reported an input error");
  if (counts) {  // the last replay's routing: one selection per slot (every weight is 1 / k)
    std::vector<uint32_t> want(size_t{kLayers} * kExperts, 0);
    for (uint32_t l = 0; l < kLayers; ++l) {
      const int32_t* set_ids = h_ids.data() + size_t{(replay - 1 + l) % kSets} * kTopK;
      for (uint32_t j = 0; j < kTopK; ++j) ++want[size_t{l} * kExperts + set_ids[j]];
    }
    if (std::memcmp(want.data(), h_counts, want.size() * 4) != 0) {
      state.SkipWithError("expert_counts differ from the routing");
    }
  }
  report(state, bytes, kLayers);
  state.counters["us_per_token"] = benchmark::Counter(
      1e-6, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// ---- The stack's structure, read only -----------------------------------------------------

// What one read kernel reads: for each of `layers` consecutive layers, each of its K routed
// experts' spans (offsets and sizes within an expert, multiples of 16 bytes).
struct RoutedRead {
  const unsigned char* experts;  // layer 0's expert 0; expert e of layer l at l * layer_bytes +
  size_t expert_stride;          // e * expert_stride
  size_t layer_bytes;
  const int32_t* ids;  // [layers][K]
  uint32_t layers;
  uint32_t spans;
  size_t span_offset[2], span_bytes[2];
  bool prefetch;  // every byte into the L2 before the wait
  // Flags instead of the grid dependency (both null: griddepcontrol.wait). Each block adds 1
  // to *done_out (release, GPU scope) when its reads are done; the blocks wait (acquire) until
  // *done_in reaches *epoch times the preceding kernel's blocks (the benchmark writes the
  // replay's number to *epoch before each replay; the counters only grow).
  const uint32_t* done_in;
  uint32_t* done_out;
  const uint32_t* epoch;
  uint32_t blocks_in;
  uint32_t* sink;
};

__device__ __forceinline__ uint32_t load_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Each thread loads one 16-byte word of all K experts' span at a time (K loads in flight), over
// the span's words grid-strided; one word a block keeps the loads alive. Reads nothing the
// preceding grid writes, but waits for it first: the dependency the layer's kernels have.
template <uint32_t K>
__global__ void read_routed(const __grid_constant__ RoutedRead r) {
  const size_t threads = size_t{gridDim.x} * blockDim.x;
  const size_t tid = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const auto span = [&r](uint32_t l, uint32_t j, uint32_t s) {
    return r.experts + l * r.layer_bytes + size_t(r.ids[l * K + j]) * r.expert_stride +
           r.span_offset[s];
  };
  if (r.prefetch) {  // 64 KiB pieces, one a warp at a time
    constexpr size_t kPiece = size_t{64} << 10;
    const size_t warps = threads / 32, warp = tid / 32;
    for (uint32_t l = 0; l < r.layers; ++l) {
      for (uint32_t s = 0; s < r.spans; ++s) {
        const size_t pieces = (r.span_bytes[s] + kPiece - 1) / kPiece;
        for (size_t q = warp; q < K * pieces; q += warps) {
          const size_t at = (q % pieces) * kPiece;
          const size_t left = r.span_bytes[s] - at;
          prefetch_l2(span(l, static_cast<uint32_t>(q / pieces), s) + at,
                      left < kPiece ? left : kPiece, threadIdx.x % 32);
        }
      }
    }
  }
  if (r.done_in != nullptr) {
    allow_dependent_launch();
    if (threadIdx.x == 0) {
      const uint32_t target = *r.epoch * r.blocks_in;
      while (static_cast<int32_t>(load_acquire_gpu(r.done_in) - target) < 0) __nanosleep(32);
    }
    __syncthreads();
  } else {
    wait_for_preceding_grid();
    allow_dependent_launch();
  }
  uint32_t acc = 0;
  for (uint32_t l = 0; l < r.layers; ++l) {
    for (uint32_t s = 0; s < r.spans; ++s) {
      const uint4* base[K];
#pragma unroll
      for (uint32_t j = 0; j < K; ++j) base[j] = reinterpret_cast<const uint4*>(span(l, j, s));
      for (size_t i = tid; i < r.span_bytes[s] / 16; i += threads) {
        uint4 v[K];
#pragma unroll
        for (uint32_t j = 0; j < K; ++j) v[j] = __ldcs(base[j] + i);
#pragma unroll
        for (uint32_t j = 0; j < K; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
      }
    }
  }
  if (acc == 0x12345678u) r.sink[blockIdx.x] = acc;
  if (r.done_out != nullptr) {
    __syncthreads();  // every thread's reads are done
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(r.done_out) : "memory");
    }
  }
}

enum class StackStructure {
  kTwoKernels,
  kTwoKernelsPdl,
  kTwoKernelsPdlPrefetch,
  kTwoKernelsFlags,
  kOneKernelPdl,
  kOneLaunch
};

// The 48-layer stack's weights and routing as BM_MoeStack48 (the same bytes a replay reads, the
// routing copied into device memory before each replay), read by read_routed in `structure`.
void BM_StackReadOnly(benchmark::State& state, StackStructure structure) {
  constexpr uint32_t kLayers = 48, kSets = 16;
  constexpr uint32_t kTopK = 8;
  const MoeShape& shape = kQwen3;
  static_assert(kQwen3.top_k == kTopK, "read_routed's K");
  const size_t layer_bytes = size_t{shape.experts} * shape.expert_stride();
  DeviceMemory weights(kLayers * layer_bytes), sink(size_t{4} << 16);
  if (weights.p == nullptr || sink.p == nullptr) {
    state.SkipWithError("cannot allocate 48 layers x 128 experts of INT4 (about 16 GB)");
    return;
  }
  BENCH_CUDA(cudaMemset(weights.p, 1, kLayers * layer_bytes), state);
  const std::vector<int32_t> h_ids = routing_ids(shape, kSets, 1);
  DeviceMemory all_ids(h_ids.size() * 4), ids(size_t{kLayers} * kTopK * 4),
      done(size_t{2} * kLayers * 4), epoch(4);
  BENCH_CUDA(cudaMemcpy(all_ids.p, h_ids.data(), h_ids.size() * 4, cudaMemcpyHostToDevice), state);
  BENCH_CUDA(cudaMemset(done.p, 0, size_t{2} * kLayers * 4), state);

  RoutedRead r{};
  r.experts = weights.as<const unsigned char>();
  r.expert_stride = shape.expert_stride();
  r.layer_bytes = layer_bytes;
  r.sink = sink.as<uint32_t>();
  const size_t fc1 = shape.fc1().bytes(), fc2 = shape.fc2().bytes();
  // Threads: one a 16-byte word of the longest span (FC1's), in blocks of 256.
  const dim3 block(256), grid(static_cast<unsigned>((fc1 / 16 + 255) / 256));
  const bool pdl = structure != StackStructure::kTwoKernels;
  const bool flags = structure == StackStructure::kTwoKernelsFlags;
  uint32_t kernels = 0;
  cudaError_t launched = cudaSuccess;
  const auto launch = [&](uint32_t first_layer, uint32_t layers, bool with_fc1, bool with_fc2,
                          cudaStream_t stream) {
    RoutedRead a = r;
    if (flags) {
      a.done_in = kernels == 0 ? nullptr : done.as<const uint32_t>() + kernels - 1;
      a.done_out = done.as<uint32_t>() + kernels;
      a.epoch = epoch.as<const uint32_t>();
      a.blocks_in = grid.x;
    }
    ++kernels;
    a.experts += first_layer * layer_bytes;
    a.ids = ids.as<const int32_t>() + size_t{first_layer} * kTopK;
    a.layers = layers;
    a.spans = 0;
    if (with_fc1) {
      a.span_offset[a.spans] = 0;
      a.span_bytes[a.spans++] = fc1;
    }
    if (with_fc2) {
      a.span_offset[a.spans] = shape.fc2_offset();
      a.span_bytes[a.spans++] = fc2;
    }
    a.prefetch = structure == StackStructure::kTwoKernelsPdlPrefetch;
    if (launched == cudaSuccess) {
      launched = launch_decode_kernel(read_routed<kTopK>, grid, block, 0, pdl, a, stream);
    }
  };
  const auto launch_layers = [&](cudaStream_t stream) {
    if (structure == StackStructure::kOneLaunch) {
      launch(0, kLayers, true, true, stream);
    } else {
      for (uint32_t l = 0; l < kLayers; ++l) {
        if (structure == StackStructure::kOneKernelPdl) {
          launch(l, 1, true, true, stream);
        } else {
          launch(l, 1, true, false, stream);
          launch(l, 1, false, true, stream);
        }
      }
    }
    return launched;
  };
  StackGraph g;
  BENCH_CUDA(g.capture(launch_layers), state);
  uint32_t replay = 0;
  const auto set_routing = [&]() {
    copy_replay_routing(ids.p, all_ids.p, kTopK * 4, kLayers, kSets, replay, g.stream);
    ++replay;
    if (flags) {  // the counters' target for this replay; pageable: copied now
      cudaMemcpyAsync(epoch.p, &replay, 4, cudaMemcpyHostToDevice, g.stream);
    }
  };
  time_replays(state, g.exec, g.stream, set_routing, kNothing);
  report(state, double(kLayers) * kTopK * shape.expert_weight_bytes(), kLayers);
}

const char* level(qmoe_accuracy a) {
  return a == QMOE_ACCURACY_FAST ? "fast" : "exact";
}

void register_all() {
  benchmark::RegisterBenchmark("gpu/read_roof", BM_ReadRoof)->UseManualTime()->Iterations(5);
  struct Shape {
    const char* name;
    uint32_t n, k;
  };
  const Shape int_shapes[] = {Shape{"qwen3_fc1", 1536, 2048}, Shape{"qwen3_fc2", 2048, 768},
                              Shape{"gptoss", 5760, 2880}};
  for (const Shape s : int_shapes) {
    for (qmoe_accuracy a : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
      for (uint32_t m : {1u, 4u, 8u}) {
        const std::string name =
            std::string("gpu/int4_gemv/") + s.name + "/" + level(a) + "/m:" + std::to_string(m);
        benchmark::RegisterBenchmark(name.c_str(), BM_Gemv, QMOE_WEIGHT_FORMAT_INT4, s.n, s.k, a, m)
            ->UseManualTime()
            ->MinTime(0.2);
      }
    }
  }
  // INT3 at the same shapes (FP16 scales per 32, grouped, as the INT4 rows).
  for (const Shape s : int_shapes) {
    for (qmoe_accuracy a : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
      for (uint32_t m : {1u, 4u, 8u}) {
        const std::string name =
            std::string("gpu/int3_gemv/") + s.name + "/" + level(a) + "/m:" + std::to_string(m);
        benchmark::RegisterBenchmark(name.c_str(), BM_Gemv, QMOE_WEIGHT_FORMAT_INT3, s.n, s.k, a, m)
            ->UseManualTime()
            ->MinTime(0.2);
      }
    }
  }
  // The E2M1 formats at their models' shapes: gpt-oss-20b (MXFP4), Qwen3-30B-A3B (NVFP4).
  struct Fp4Shape {
    const char* name;
    qmoe_weight_format format;
    uint32_t n, k;
  };
  for (const Fp4Shape s : {Fp4Shape{"mxfp4_gemv/gptoss", QMOE_WEIGHT_FORMAT_MXFP4, 5760, 2880},
                           Fp4Shape{"nvfp4_gemv/qwen3_fc1", QMOE_WEIGHT_FORMAT_NVFP4, 1536, 2048},
                           Fp4Shape{"nvfp4_gemv/qwen3_fc2", QMOE_WEIGHT_FORMAT_NVFP4, 2048, 768}}) {
    for (qmoe_accuracy a : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
      for (uint32_t m : {1u, 4u, 8u}) {
        const std::string name =
            std::string("gpu/") + s.name + "/" + level(a) + "/m:" + std::to_string(m);
        benchmark::RegisterBenchmark(name.c_str(), BM_Gemv, s.format, s.n, s.k, a, m)
            ->UseManualTime()
            ->MinTime(0.2);
      }
    }
  }
  const auto layer_row = [](const std::string& name, const MoeShape& shape, qmoe_accuracy a,
                            uint32_t m, bool lean, qmoe_swiglu_fusion fusion, Routing routing,
                            float tokens_hint) {
    benchmark::RegisterBenchmark(name.c_str(), BM_MoeLayer, shape, a, m, lean, fusion, routing,
                                 tokens_hint)
        ->UseManualTime()
        ->MinTime(0.2);
  };
  for (qmoe_accuracy a : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
    for (uint32_t m : {1u, 2u, 4u, 8u, 16u, 64u, 512u}) {
      const std::string name =
          std::string("gpu/moe_layer/qwen3/") + level(a) + "/m:" + std::to_string(m);
      if (m > 1) {
        layer_row(name + "/shared_experts", kQwen3, a, m, true, kInterleaved, Routing::kShared,
                  0.0f);
        // The same calls with the caller's hint that every routed expert holds all M tokens.
        layer_row(name + "/shared_experts/hinted", kQwen3, a, m, true, kInterleaved,
                  Routing::kShared, float(m));
        layer_row(name + "/random_routing", kQwen3, a, m, true, kInterleaved, Routing::kRandom,
                  0.0f);
      }
      if (m > 8) continue;  // past decode sizes: the routings above only
      layer_row(name, kQwen3, a, m, true, kInterleaved, Routing::kDisjoint, 0.0f);
      layer_row(name + "/general_walk", kQwen3, a, m, false, kInterleaved, Routing::kDisjoint,
                0.0f);
      if (m == 1 || m == 4) {
        layer_row(name + "/concatenated", kQwen3, a, m, true, QMOE_SWIGLU_CONCATENATED,
                  Routing::kDisjoint, 0.0f);
      }
    }
  }
  // The layer with INT3 experts at decode sizes (each call to the next experts).
  for (qmoe_accuracy a : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
    for (uint32_t m : {1u, 4u}) {
      const std::string name =
          std::string("gpu/moe_layer/qwen3_int3/") + level(a) + "/m:" + std::to_string(m);
      layer_row(name, kQwen3Int3, a, m, true, kInterleaved, Routing::kDisjoint, 0.0f);
      layer_row(name + "/general_walk", kQwen3Int3, a, m, false, kInterleaved, Routing::kDisjoint,
                0.0f);
    }
  }
  // gpt-oss-20b's layer in its own format (MXFP4): decode sizes, and the routings at M = 8 and 64.
  for (qmoe_accuracy a : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
    for (uint32_t m : {1u, 4u, 8u, 64u}) {
      const std::string name =
          std::string("gpu/moe_layer/gptoss20b/") + level(a) + "/m:" + std::to_string(m);
      if (m <= 8) layer_row(name, kGptOss20b, a, m, false, kInterleaved, Routing::kDisjoint, 0.0f);
      if (m >= 8) {
        layer_row(name + "/random_routing", kGptOss20b, a, m, false, kInterleaved, Routing::kRandom,
                  0.0f);
      }
    }
  }
  for (qmoe_accuracy a : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
    for (bool early : {false, true}) {
      const std::string name = std::string("gpu/moe_stack48/qwen3/") + level(a) + "/m:1" +
                               (early ? "/early_routing" : "");
      benchmark::RegisterBenchmark(name.c_str(), BM_MoeStack48, a, early, true, kInterleaved, false,
                                   false)
          ->UseManualTime()
          ->MinTime(0.3);
      if (!early) {
        benchmark::RegisterBenchmark((name + "/general_walk").c_str(), BM_MoeStack48, a, early,
                                     false, kInterleaved, false, false)
            ->UseManualTime()
            ->MinTime(0.3);
        benchmark::RegisterBenchmark((name + "/concatenated").c_str(), BM_MoeStack48, a, early,
                                     true, QMOE_SWIGLU_CONCATENATED, false, false)
            ->UseManualTime()
            ->MinTime(0.3);
      }
      if (!early && a == QMOE_ACCURACY_FAST) {
        benchmark::RegisterBenchmark((name + "/expert_counts").c_str(), BM_MoeStack48, a, early,
                                     true, kInterleaved, true, false)
            ->UseManualTime()
            ->MinTime(0.3);
        benchmark::RegisterBenchmark((name + "/logits").c_str(), BM_MoeStack48, a, early, true,
                                     kInterleaved, true, true)
            ->UseManualTime()
            ->MinTime(0.3);
      }
    }
  }
  const std::pair<const char*, StackStructure> structures[] = {
      {"two_kernels", StackStructure::kTwoKernels},
      {"two_kernels/pdl", StackStructure::kTwoKernelsPdl},
      {"two_kernels/pdl_prefetch", StackStructure::kTwoKernelsPdlPrefetch},
      {"two_kernels/flags", StackStructure::kTwoKernelsFlags},
      {"one_kernel/pdl", StackStructure::kOneKernelPdl},
      {"one_launch", StackStructure::kOneLaunch}};
  for (const auto& [name, structure] : structures) {
    benchmark::RegisterBenchmark((std::string("gpu/moe_stack48/qwen3/read_only/") + name).c_str(),
                                 BM_StackReadOnly, structure)
        ->UseManualTime()
        ->MinTime(0.3);
  }
}

}  // namespace
}  // namespace qmoe::cuda

int main(int argc, char** argv) {
  // Listing needs no device (Initialize consumes the flag, so look before it).
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    listing |= a == "--benchmark_list_tests" || a == "--benchmark_list_tests=true" ||
               a == "--benchmark_list_tests=1";
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (!listing && (e != cudaSuccess || count == 0)) {
    std::printf("qmoe_cuda_bench: no usable CUDA device (%s); nothing to measure\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 0;
  }
  if (!listing) {
    using namespace qmoe::cuda;
    DeviceMemory buffer(kRoofBytes), sink(1 << 16);
    if (buffer.p != nullptr && sink.p != nullptr &&
        cudaMemset(buffer.p, 1, kRoofBytes) == cudaSuccess) {
      const double s = time_read(buffer, kRoofBytes, sink.as<uint32_t>(), 5);
      g_roof_bytes_per_second = double(kRoofBytes) / s;
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    benchmark::AddCustomContext("gpu", prop.name);
    benchmark::AddCustomContext("hbm_read_roof_GBps",
                                std::to_string(g_roof_bytes_per_second * 1e-9));
  }
  qmoe::cuda::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
