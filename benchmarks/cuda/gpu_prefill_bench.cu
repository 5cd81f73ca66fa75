// qmoe_cuda_bench: the tensor-core INT4 prefill GEMM (lib/cuda/int4_gemm_tc.cuh) against cuBLAS
// (cublasGemmEx, BF16 inputs and output, FP32 compute) on the same weights dequantised to BF16
// once by a kernel of this file: same shape, same process, same stream.
//
// Shapes: Qwen3-30B-A3B expert FC1 [N 1536, K 2048] and FC2 [N 2048, K 768], and a
// gpt-oss-20b-like [N 5760, K 2880]; M = 128, 512, 2048. INT4 codes with FP16 block-32 scales in
// the grouped order (docs/formats.md), no zero points, no bias; X and Y in BF16.
//
// Rows: BM_Int4GemmTcVsCublas/<shape>/<M>/<tile>/<level>/<k splits>, level 0 the exact level and
// 1 the fast level (scaled weights on the wgmma tiles: the scales are FP16), k splits 0 for the
// launcher's choice. By default only the launcher's own tile choice (tile -1): 18 rows, a few
// seconds in all. QMOE_TC_BENCH_TILES=all adds every forced tile (0 .. kInt4GemmTcTileCount - 1:
// Int4GemmTcTile; those the device cannot run report an error) to each shape and M, for
// tile-choice studies; QMOE_TC_BENCH_SPLITS=1,2,4 forces those splits over K on each forced wgmma
// tile; QMOE_TC_BENCH_M=16,32,... runs those row counts instead of 128, 512 and 2048.
//
// Timing: CUDA events around batches of kBatch launches, ours and cuBLAS's alternating within
// each of kIterations benchmark iterations (a fixed count: the time does not depend on how fast
// either side is); each side rotates through copies of its weights that together exceed four
// times the L2, so weights come from HBM as they do in a model (X and Y stay resident, as
// activations do). The benchmark's (manual) time is ours per launch; counters, from the median
// batch of each side: us and cublas_us per launch, TFLOP/s (2 M N K / time) of ours and of
// cuBLAS, and ratio = ours / cuBLAS throughput.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/cuda/device_quant_matrix.cuh"
#include "lib/cuda/int4_gemm_tc.cuh"

namespace {

using qmoe::cuda::DeviceQuantMatrix;

struct Shape {
  const char* name;
  uint32_t n, k;
};
constexpr Shape kShapes[] = {
    {"qwen3_fc1", 1536, 2048}, {"qwen3_fc2", 2048, 768}, {"gptoss_like", 5760, 2880}};
constexpr uint32_t kBlock = 32;
constexpr int kBatch = 20;       // launches per timed batch
constexpr int kIterations = 25;  // timed batches per row

std::string cuda_message(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

// W[n][k] = (code - 8) * scale in BF16, row-major: what cuBLAS multiplies.
__global__ void dequantize_to_bf16(DeviceQuantMatrix w, __nv_bfloat16* out) {
  const uint32_t n = blockIdx.y;
  for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < w.k; k += gridDim.x * blockDim.x) {
    const uint8_t byte = w.codes[(size_t{n / 8} * w.chunks + k / 32) * 128 + (n % 8) * 16 + k % 16];
    const int code = k % 32 < 16 ? byte & 0x0F : byte >> 4;
    const size_t b = k / w.block_size;
    const size_t s =
        (n / 8) * w.scale_group_stride + (n % 8) * w.scale_row_stride + b * w.scale_block_stride;
    const float scale = __half2float(static_cast<const __half*>(w.scales)[s]);
    out[size_t{n} * w.k + k] = __float2bfloat16_rn(static_cast<float>(code - 8) * scale);
  }
}

// One shape's buffers, made once per process: `copies` INT4 matrices (codes and scales of each
// contiguous) and `bf16_copies` dequantised ones, plus X and Y for the largest M.
struct ShapeData {
  uint32_t n = 0, k = 0;
  std::vector<DeviceQuantMatrix> int4;
  std::vector<const __nv_bfloat16*> bf16;
  void* int4_buffer = nullptr;
  void* bf16_buffer = nullptr;
  __nv_bfloat16* x = nullptr;
  __nv_bfloat16* y = nullptr;
};

cudaError_t make_shape(const Shape& shape, uint32_t max_m, ShapeData* d) {
  d->n = shape.n;
  d->k = shape.k;
  const uint32_t groups = (shape.n + 7) / 8, chunks = (shape.k + 31) / 32;
  const uint32_t blocks = shape.k / kBlock;
  const size_t code_bytes = size_t{groups} * chunks * 128;
  const size_t scale_count = size_t{groups} * 8 * blocks;  // grouped order, padded to 8 rows
  const size_t copy_bytes = (code_bytes + scale_count * 2 + 255) / 256 * 256;

  std::mt19937_64 rng(42);
  std::vector<unsigned char> host(copy_bytes, 0);
  for (size_t i = 0; i < code_bytes; ++i) host[i] = static_cast<unsigned char>(rng());
  std::uniform_real_distribution<float> mag(0.002f, 0.05f);
  for (size_t i = 0; i < scale_count; ++i) {
    const __half h = __float2half_rn((rng() & 1 ? -1.0f : 1.0f) * mag(rng));
    std::memcpy(host.data() + code_bytes + 2 * i, &h, 2);
  }

  int device = 0, l2 = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
  if (e != cudaSuccess) return e;
  const size_t rotate_bytes = 4 * static_cast<size_t>(std::max(l2, 1 << 20));
  const size_t copies = std::max<size_t>(1, (rotate_bytes + copy_bytes - 1) / copy_bytes);
  const size_t bf16_bytes = size_t{shape.n} * shape.k * 2;
  const size_t bf16_copies = std::max<size_t>(1, (rotate_bytes + bf16_bytes - 1) / bf16_bytes);

  if ((e = cudaMalloc(&d->int4_buffer, copies * copy_bytes)) != cudaSuccess) return e;
  if ((e = cudaMalloc(&d->bf16_buffer, bf16_copies * bf16_bytes)) != cudaSuccess) return e;
  for (size_t c = 0; c < copies; ++c) {
    auto* base = static_cast<uint8_t*>(d->int4_buffer) + c * copy_bytes;
    if ((e = cudaMemcpy(base, host.data(), copy_bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
      return e;
    }
    DeviceQuantMatrix w{};
    w.n = shape.n;
    w.k = shape.k;
    w.block_size = kBlock;
    w.chunks = chunks;
    w.codes = base;
    w.scale_dtype = QMOE_DTYPE_F16;
    w.scales = base + code_bytes;
    w.scale_row_stride = 1;
    w.scale_block_stride = 8;
    w.scale_group_stride = size_t{8} * blocks;
    d->int4.push_back(w);
  }
  for (size_t c = 0; c < bf16_copies; ++c) {
    auto* out =
        reinterpret_cast<__nv_bfloat16*>(static_cast<uint8_t*>(d->bf16_buffer) + c * bf16_bytes);
    dequantize_to_bf16<<<dim3((shape.k + 255) / 256, shape.n), 256>>>(d->int4[0], out);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    d->bf16.push_back(out);
  }

  const size_t x_count = size_t{max_m} * shape.k, y_count = size_t{max_m} * shape.n;
  if ((e = cudaMalloc(&d->x, x_count * 2)) != cudaSuccess) return e;
  if ((e = cudaMalloc(&d->y, y_count * 2)) != cudaSuccess) return e;
  std::vector<__nv_bfloat16> x(x_count);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = __float2bfloat16_rn(normal(rng));
  if ((e = cudaMemcpy(d->x, x.data(), x_count * 2, cudaMemcpyHostToDevice)) != cudaSuccess) {
    return e;
  }
  return cudaDeviceSynchronize();
}

constexpr uint32_t kMaxM = 2048;

// Process-wide state, made on first use (never freed: the process ends after the benchmarks).
struct Bench {
  bool ok = false;
  std::string error;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaEvent_t events[4] = {};
  int sm_count = 0;
  size_t max_shared = 0;
  ShapeData shapes[3];
};

Bench& bench() {
  static Bench* b = [] {
    auto* s = new Bench;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      s->error = e != cudaSuccess ? cuda_message("cudaGetDeviceCount", e) : "no CUDA device";
      return s;
    }
    if ((e = cudaStreamCreate(&s->stream)) != cudaSuccess) {
      s->error = cuda_message("cudaStreamCreate", e);
      return s;
    }
    for (auto& ev : s->events) {
      if ((e = cudaEventCreate(&ev)) != cudaSuccess) {
        s->error = cuda_message("cudaEventCreate", e);
        return s;
      }
    }
    if (cublasCreate(&s->cublas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(s->cublas, s->stream) != CUBLAS_STATUS_SUCCESS) {
      s->error = "cublasCreate / cublasSetStream failed";
      return s;
    }
    int device = 0, max_shared = 0;
    if ((e = cudaGetDevice(&device)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&s->sm_count, cudaDevAttrMultiProcessorCount, device)) !=
            cudaSuccess ||
        (e = cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    device)) != cudaSuccess) {
      s->error = cuda_message("device attributes", e);
      return s;
    }
    s->max_shared = static_cast<size_t>(max_shared);
    if ((e = qmoe::cuda::prepare_int4_gemm_tc()) != cudaSuccess) {
      s->error = cuda_message("prepare_int4_gemm_tc", e);
      return s;
    }
    for (int i = 0; i < 3; ++i) {
      if ((e = make_shape(kShapes[i], kMaxM, &s->shapes[i])) != cudaSuccess) {
        s->error = cuda_message("building the weights", e);
        return s;
      }
    }
    s->ok = true;
    return s;
  }();
  return *b;
}

// Y[m][n] = X[m][k] W[n][k]^T in row-major terms is, column-major, Y^T (N x M) = W (as the
// transpose of the column-major K x N array) times X^T (K x M).
cublasStatus_t cublas_gemm(Bench& b, const ShapeData& d, uint32_t m, const __nv_bfloat16* w) {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasGemmEx(b.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(d.n),
                      static_cast<int>(m), static_cast<int>(d.k), &alpha, w, CUDA_R_16BF,
                      static_cast<int>(d.k), d.x, CUDA_R_16BF, static_cast<int>(d.k), &beta, d.y,
                      CUDA_R_16BF, static_cast<int>(d.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 != 0 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// splits: a forced tile's split over K (0: the launcher's choice for that tile).
cudaError_t ours(Bench& b, const ShapeData& d, uint32_t m, int tile, qmoe_accuracy accuracy,
                 uint32_t splits, const DeviceQuantMatrix& w) {
  if (tile < 0) {
    return qmoe::cuda::launch_int4_gemm_tc(w, m, QMOE_DTYPE_BF16, d.x, d.k, QMOE_DTYPE_BF16, d.y,
                                           d.n, 0, d.n, b.stream, accuracy);
  }
  return qmoe::cuda::launch_int4_gemm_tc_tile(static_cast<qmoe::cuda::Int4GemmTcTile>(tile), w, m,
                                              nullptr, QMOE_DTYPE_BF16, d.x, d.k, QMOE_DTYPE_BF16,
                                              d.y, d.n, 0, d.n, b.stream, accuracy, splits);
}

void BM_Int4GemmTcVsCublas(benchmark::State& state) {
  Bench& b = bench();
  if (!b.ok) {
    state.SkipWithError(b.error.c_str());
    return;
  }
  const int shape = static_cast<int>(state.range(0));
  const auto m = static_cast<uint32_t>(state.range(1));
  const int tile = static_cast<int>(state.range(2));
  const auto accuracy = state.range(3) != 0 ? QMOE_ACCURACY_FAST : QMOE_ACCURACY_EXACT;
  const auto splits = static_cast<uint32_t>(state.range(4));
  const ShapeData& d = b.shapes[shape];
  size_t rot = 0, rot_bf16 = 0;

  // Warm-up (module load, cuBLAS heuristics), and the errors of both paths surface here.
  for (int i = 0; i < 3; ++i) {
    cudaError_t e = ours(b, d, m, tile, accuracy, splits, d.int4[rot++ % d.int4.size()]);
    if (e != cudaSuccess) {
      state.SkipWithError(cuda_message("launch_int4_gemm_tc", e).c_str());
      return;
    }
    if (cublas_gemm(b, d, m, d.bf16[rot_bf16++ % d.bf16.size()]) != CUBLAS_STATUS_SUCCESS) {
      state.SkipWithError("cublasGemmEx failed");
      return;
    }
  }
  cudaError_t e = cudaStreamSynchronize(b.stream);
  if (e != cudaSuccess) {
    state.SkipWithError(cuda_message("warm-up", e).c_str());
    return;
  }

  std::vector<double> ours_ms, cublas_ms;  // per launch, one entry per batch
  for (auto _ : state) {
    cudaEventRecord(b.events[0], b.stream);
    for (int i = 0; i < kBatch; ++i) {
      e = ours(b, d, m, tile, accuracy, splits, d.int4[rot++ % d.int4.size()]);
    }
    cudaEventRecord(b.events[1], b.stream);
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < kBatch; ++i) s = cublas_gemm(b, d, m, d.bf16[rot_bf16++ % d.bf16.size()]);
    cudaEventRecord(b.events[2], b.stream);
    const cudaError_t sync = cudaEventSynchronize(b.events[2]);
    if (e != cudaSuccess || sync != cudaSuccess || s != CUBLAS_STATUS_SUCCESS) {
      state.SkipWithError(e != cudaSuccess      ? cuda_message("launch_int4_gemm_tc", e).c_str()
                          : sync != cudaSuccess ? cuda_message("cudaEventSynchronize", sync).c_str()
                                                : "cublasGemmEx failed");
      break;
    }
    float a = 0.0f, c = 0.0f;
    cudaEventElapsedTime(&a, b.events[0], b.events[1]);
    cudaEventElapsedTime(&c, b.events[1], b.events[2]);
    ours_ms.push_back(a / kBatch);
    cublas_ms.push_back(c / kBatch);
    state.SetIterationTime(a / kBatch / 1e3);
  }
  if (ours_ms.empty()) return;
  const double flop = 2.0 * m * d.n * d.k;
  const double ours_us = median(ours_ms) * 1e3, cublas_us = median(cublas_ms) * 1e3;
  const double ours_tflops = flop / (ours_us * 1e-6) / 1e12;
  const double cublas_tflops = flop / (cublas_us * 1e-6) / 1e12;
  state.counters["TFLOP/s"] = ours_tflops;
  state.counters["cublas_TFLOP/s"] = cublas_tflops;
  state.counters["ratio"] = ours_tflops / cublas_tflops;
  state.counters["us"] = ours_us;
  state.counters["cublas_us"] = cublas_us;
  std::string tile_name = tile < 0 ? "auto " : "";
  qmoe::cuda::Int4GemmTcTile shown = static_cast<qmoe::cuda::Int4GemmTcTile>(tile);
  const bool wgmma = qmoe::cuda::int4_gemm_tc_tile_available(
      qmoe::cuda::Int4GemmTcTile::kWgmma128x64, QMOE_DTYPE_BF16);
  uint32_t k_splits = splits;
  if (tile < 0 &&
      !qmoe::cuda::choose_int4_gemm_tc_tile(m, 0, d.n, d.k, b.sm_count, b.max_shared,
                                            QMOE_DTYPE_BF16, kBlock, &shown, wgmma, &k_splits)) {
    tile_name += "none";
  } else {
    const qmoe::cuda::Int4GemmTcTileShape s = qmoe::cuda::int4_gemm_tc_tile_shape(shown);
    if (k_splits == 0) {
      k_splits = qmoe::cuda::choose_int4_gemm_tc_k_splits(shown, m, 0, d.n, d.k, b.sm_count);
    }
    tile_name += std::to_string(s.rows_m) + "x" + std::to_string(s.rows_n) +
                 (shown == qmoe::cuda::Int4GemmTcTile::kWgmma128x64SplitK ? " split-k" : "") +
                 (qmoe::cuda::int4_gemm_tc_tile_is_wgmma(shown) ? " wgmma" : "") + " k splits " +
                 std::to_string(k_splits);
  }
  const bool scaled = qmoe::cuda::int4_gemm_tc_scaled_weights(shown, accuracy, QMOE_DTYPE_BF16,
                                                              d.int4[0].scale_dtype);
  state.SetLabel(std::string(kShapes[shape].name) + " m=" + std::to_string(m) + " tile " +
                 tile_name + (scaled ? " fast (scaled weights)" : " exact weights") + " weights x" +
                 std::to_string(d.int4.size()));
}

// QMOE_TC_BENCH_TILES=all: every forced tile as well as the launcher's choice.
bool all_tiles() {
  const char* v = std::getenv("QMOE_TC_BENCH_TILES");
  return v != nullptr && std::strcmp(v, "all") == 0;
}

// The comma-separated integers in [lo, hi] of environment variable `name`, else `fallback`; a
// malformed list or a value out of range exits with status 2 and a message.
std::vector<int> env_list(const char* name, long lo, long hi, std::vector<int> fallback) {
  std::vector<int> values;
  if (const char* v = std::getenv(name)) {
    for (const char* p = v; *p != '\0';) {
      char* end = nullptr;
      const long value = std::strtol(p, &end, 10);
      if (end == p || value < lo || value > hi || (*end != ',' && *end != '\0')) {
        std::fprintf(stderr, "%s: expected values in %ld..%ld, got '%s'\n", name, lo, hi, v);
        std::exit(2);
      }
      values.push_back(static_cast<int>(value));
      p = *end == ',' ? end + 1 : end;
    }
  }
  return values.empty() ? fallback : values;
}

// QMOE_TC_BENCH_M: row counts in 1..kMaxM, else 128, 512, 2048.
std::vector<int> row_counts() {
  return env_list("QMOE_TC_BENCH_M", 1, kMaxM, {128, 512, 2048});
}

// QMOE_TC_BENCH_SPLITS: splits over K (1..8) to force on each forced wgmma tile, else the
// launcher's choice for the tile (0).
std::vector<int> split_counts() {
  return env_list("QMOE_TC_BENCH_SPLITS", 1, 8, {0});
}

void Args(benchmark::internal::Benchmark* bm) {
  const int last_tile = all_tiles() ? qmoe::cuda::kInt4GemmTcTileCount - 1 : -1;
  for (int shape = 0; shape < 3; ++shape) {
    for (int m : row_counts()) {
      for (int tile = -1; tile <= last_tile; ++tile) {
        const bool wgmma = tile >= 0 && qmoe::cuda::int4_gemm_tc_tile_is_wgmma(
                                            static_cast<qmoe::cuda::Int4GemmTcTile>(tile));
        for (int split : wgmma ? split_counts() : std::vector<int>{0}) {
          for (int fast = 0; fast < 2; ++fast) bm->Args({shape, m, tile, fast, split});
        }
      }
    }
  }
}

BENCHMARK(BM_Int4GemmTcVsCublas)
    ->Apply(Args)
    ->UseManualTime()
    ->Iterations(kIterations)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

// main() is gpu_decode_bench.cu's: one binary for both (it checks for a device once).
