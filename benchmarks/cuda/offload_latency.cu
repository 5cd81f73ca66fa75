// qmoe_offload_latency: the doorbell round trip, p50 and p99 over many calls, beside two
// hand-offs that move the same bytes, all in one process (DESIGN's bars: the doorbell within
// 1.5x of the raw ping-pong's p50, and at most 0.3x of the host-function hand-off's).
//
//   doorbell    the offload kernels themselves (lib/offload/kernels.h through
//               lib/cuda/offload_kernels.cu): classify-publish (all-cold routing, x staged into
//               the ring, system fence, release of req_seq), the CPU service thread
//               (lib/offload/service.h, spinning) with a handler that copies the tile into the
//               result, wait-accumulate (acquire of done_seq, the result read and added into y)
//   ping-pong   the least a mapped-memory round trip carrying the payload can be: one kernel
//               of one block stages x, fences, releases a flag, waits for the CPU's flag and
//               adds the result into y; a CPU thread spins, copies, releases
//   bare        the same with no payload (one thread's flag and answer)
//   host-func   cudaMemcpyAsync of x into pinned memory, cudaLaunchHostFunc copying it into the
//               result, cudaMemcpyAsync of the result back: the KTransformers hand-off
// Each call is timed with CUDA events around its launches; the payload is m rows of H FP32
// values each way. Without a usable GPU it says why and exits 0.
//
// Usage: qmoe_offload_latency [--hidden H] [--m M] [--calls N]
#include <cuda_runtime_api.h>
#include <cuda/atomic>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lib/cuda/offload_kernels.cuh"
#include "lib/offload/device_state.h"
#include "lib/offload/ring_layout.h"
#include "lib/offload/service.h"

namespace {

namespace offload = qmoe::offload;

#define CHECK_CUDA(expr)                                                    \
  do {                                                                      \
    const cudaError_t check_e = (expr);                                     \
    if (check_e != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(check_e)); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

struct Percentiles {
  double p50, p99, best;
};

Percentiles percentiles(std::vector<float> us) {
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    return static_cast<double>(us[static_cast<size_t>(q * (us.size() - 1))]);
  };
  return {at(0.50), at(0.99), us.front()};
}

// Times `one(i)` (which enqueues call i on `stream`) with events, `calls` times after a warm-up.
template <typename Enqueue>
Percentiles time_calls(cudaStream_t stream, int calls, Enqueue one) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> us;
  const int warmup = std::max(10, calls / 20);
  for (int i = 0; i < warmup + calls; ++i) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    one(i);
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (i >= warmup) us.push_back(ms * 1000.0f);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return percentiles(us);
}

// ---- The doorbell: the offload kernels and the service -------------------------------------

class EchoHandler : public offload::RequestHandler {
 public:
  qmoe_status serve(const offload::RequestView& r, char*, size_t) override {
    std::memcpy(r.result, r.x, size_t{r.meta.m} * r.hidden * sizeof(float));
    return QMOE_STATUS_OK;
  }
};

Percentiles doorbell(uint32_t hidden, uint32_t m, int calls, cudaStream_t stream) {
  constexpr uint32_t kExperts = 8;
  const offload::RingGeometry g{4, m, 1, kExperts, hidden};
  const offload::RingLayout layout = offload::make_ring_layout(g);
  void* ring = nullptr;
  CHECK_CUDA(cudaHostAlloc(&ring, layout.total_bytes, cudaHostAllocMapped));
  std::memset(ring, 0, layout.total_bytes);
  void* ring_device = nullptr;
  CHECK_CUDA(cudaHostGetDevicePointer(&ring_device, ring, 0));
  // Device memory: state, one record, token flags, m, ids, weights, residency, x, y.
  offload::OffloadDeviceState* state;
  offload::OffloadCallRecord* record;
  uint8_t* flags;
  uint32_t* d_m;
  int32_t *ids, *residency;
  float *weights, *x, *y;
  CHECK_CUDA(cudaMalloc(&state, sizeof *state));
  CHECK_CUDA(cudaMalloc(&record, sizeof *record));
  CHECK_CUDA(cudaMalloc(&flags, m));
  CHECK_CUDA(cudaMalloc(&d_m, sizeof *d_m));
  CHECK_CUDA(cudaMalloc(&ids, m * sizeof(int32_t)));
  CHECK_CUDA(cudaMalloc(&weights, m * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&residency, kExperts * sizeof(int32_t)));
  CHECK_CUDA(cudaMalloc(&x, size_t{m} * hidden * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&y, size_t{m} * hidden * sizeof(float)));
  offload::OffloadDeviceState initial{};
  initial.next_seq = 1;
  CHECK_CUDA(cudaMemcpy(state, &initial, sizeof initial, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(record, 0, sizeof *record));
  CHECK_CUDA(cudaMemcpy(d_m, &m, sizeof m, cudaMemcpyHostToDevice));
  const std::vector<int32_t> host_ids(m, 3), host_residency(kExperts, -1);  // all cold
  const std::vector<float> host_weights(m, 1.0f), host_x(size_t{m} * hidden, 0.5f);
  CHECK_CUDA(cudaMemcpy(ids, host_ids.data(), m * sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(weights, host_weights.data(), m * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(residency, host_residency.data(), kExperts * sizeof(int32_t),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(x, host_x.data(), host_x.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(y, 0, size_t{m} * hidden * sizeof(float)));

  EchoHandler handler;
  offload::ServiceOptions options;
  options.spin_ns = 10000000000ull;  // spin throughout
  offload::OffloadService service(static_cast<unsigned char*>(ring), layout, &handler, options);
  if (service.start("qmoe_offload_latency") != QMOE_STATUS_OK) std::exit(1);

  offload::ClassifyArgs a{};
  a.state = state;
  a.record = record;
  a.token_cold = flags;
  a.ring = static_cast<unsigned char*>(ring_device);
  a.layout = layout;
  a.m = d_m;
  a.ids = ids;
  a.weights = weights;
  a.residency = residency;
  a.x = x;
  a.ldx = hidden;
  a.layer = 0;
  a.m_capacity = m;
  a.k = 1;
  a.num_experts = kExperts;
  a.num_slots = kExperts;
  a.dtype = QMOE_DTYPE_F32;
  a.accuracy = QMOE_ACCURACY_FAST;
  a.short_circuit = 1;
  offload::WaitArgs w{};
  w.state = state;
  w.record = record;
  w.token_cold = flags;
  w.ring = a.ring;
  w.layout = layout;
  w.y = y;
  w.ldy = hidden;
  w.dtype = QMOE_DTYPE_F32;
  w.timeout_ns = 1000000000;
  const uint32_t blocks = qmoe::cuda::offload_wait_blocks(hidden);
  const Percentiles p = time_calls(stream, calls, [&](int) {
    CHECK_CUDA(qmoe::cuda::launch_offload_classify_publish(a, stream));
    CHECK_CUDA(qmoe::cuda::launch_offload_wait_accumulate(w, blocks, stream));
  });
  offload::OffloadDeviceState final_state{};
  CHECK_CUDA(cudaMemcpy(&final_state, state, sizeof final_state, cudaMemcpyDeviceToHost));
  service.stop();
  if (final_state.error != 0 || service.served() != final_state.telemetry.published) {
    std::fprintf(stderr, "doorbell: error 0x%x, %llu published, %llu served\n", final_state.error,
                 static_cast<unsigned long long>(final_state.telemetry.published),
                 static_cast<unsigned long long>(service.served()));
    std::exit(1);
  }
  for (void* p2 : {static_cast<void*>(state), static_cast<void*>(record), static_cast<void*>(flags),
                   static_cast<void*>(d_m), static_cast<void*>(ids), static_cast<void*>(weights),
                   static_cast<void*>(residency), static_cast<void*>(x), static_cast<void*>(y)}) {
    cudaFree(p2);
  }
  cudaFreeHost(ring);
  return p;
}

// ---- The raw mapped-memory ping-pong -------------------------------------------------------

using SystemU64 = ::cuda::atomic_ref<unsigned long long, ::cuda::thread_scope_system>;

__global__ void ping_pong_kernel(const float* x, float* tile, const float* result, float* y,
                                 unsigned long long* flag, unsigned long long* answer,
                                 unsigned long long seq, uint32_t n) {
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) tile[i] = x[i];
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    SystemU64(*flag).store(seq, ::cuda::memory_order_release);
    SystemU64 done(*answer);
    while (done.load(::cuda::memory_order_acquire) != seq) {
    }
  }
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) y[i] += __ldcv(result + i);
}

Percentiles ping_pong(uint32_t n, int calls, cudaStream_t stream) {
  // Host memory: flag line, answer line, tile, result.
  const size_t bytes = 256 + 2 * size_t{n} * sizeof(float) + 256;
  unsigned char* host = nullptr;
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host), bytes, cudaHostAllocMapped));
  std::memset(host, 0, bytes);
  unsigned char* dev = nullptr;
  CHECK_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), host, 0));
  auto* flag = reinterpret_cast<unsigned long long*>(host);
  auto* answer = reinterpret_cast<unsigned long long*>(host + 128);
  auto* tile = reinterpret_cast<float*>(host + 256);
  auto* result = tile + n;
  float *x = nullptr, *y = nullptr;
  CHECK_CUDA(cudaMalloc(&x, std::max<size_t>(1, n) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&y, std::max<size_t>(1, n) * sizeof(float)));
  CHECK_CUDA(cudaMemset(x, 0, std::max<size_t>(1, n) * sizeof(float)));
  std::atomic<bool> stop{false};
  std::thread responder([&] {
    for (unsigned long long seq = 1; !stop.load(std::memory_order_relaxed);) {
      if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != seq) continue;
      std::memcpy(result, tile, n * sizeof(float));
      __atomic_store_n(answer, seq, __ATOMIC_RELEASE);
      ++seq;
    }
  });
  const auto dev_flag = reinterpret_cast<unsigned long long*>(dev);
  const auto dev_answer = reinterpret_cast<unsigned long long*>(dev + 128);
  const auto dev_tile = reinterpret_cast<float*>(dev + 256);
  const Percentiles p = time_calls(stream, calls, [&](int i) {
    ping_pong_kernel<<<1, n == 0 ? 32 : 256, 0, stream>>>(x, dev_tile, dev_tile + n, y, dev_flag,
                                                          dev_answer, i + 1ull, n);
    CHECK_CUDA(cudaGetLastError());
  });
  stop.store(true);
  responder.join();
  cudaFree(x);
  cudaFree(y);
  cudaFreeHost(host);
  return p;
}

// ---- The host-function hand-off -------------------------------------------------------------

struct HostCopy {
  const float* from;
  float* to;
  size_t n;
};

void CUDART_CB copy_on_host(void* state) {
  auto* c = static_cast<HostCopy*>(state);
  std::memcpy(c->to, c->from, c->n * sizeof(float));
}

Percentiles host_func(uint32_t n, int calls, cudaStream_t stream) {
  float *tile = nullptr, *result = nullptr, *x = nullptr, *y = nullptr;
  CHECK_CUDA(cudaMallocHost(&tile, n * sizeof(float)));
  CHECK_CUDA(cudaMallocHost(&result, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&x, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&y, n * sizeof(float)));
  CHECK_CUDA(cudaMemset(x, 0, n * sizeof(float)));
  HostCopy copy{tile, result, n};
  const Percentiles p = time_calls(stream, calls, [&](int) {
    CHECK_CUDA(cudaMemcpyAsync(tile, x, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaLaunchHostFunc(stream, copy_on_host, &copy));
    CHECK_CUDA(cudaMemcpyAsync(y, result, n * sizeof(float), cudaMemcpyHostToDevice, stream));
  });
  cudaFreeHost(tile);
  cudaFreeHost(result);
  cudaFree(x);
  cudaFree(y);
  return p;
}

void print(const char* name, const Percentiles& p, size_t bytes) {
  std::printf("%-10s payload %7zu B each way: p50 %8.2f us  p99 %8.2f us  best %8.2f us\n", name,
              bytes, p.p50, p.p99, p.best);
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t hidden = 2048, m = 1;
  int calls = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string opt = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (opt == "--hidden" && v > 0) {
      hidden = static_cast<uint32_t>(v);
    } else if (opt == "--m" && v > 0 && v <= 64) {
      m = static_cast<uint32_t>(v);
    } else if (opt == "--calls" && v > 0) {
      calls = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "usage: %s [--hidden H] [--m M (1-64)] [--calls N]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    std::printf("qmoe_offload_latency: no usable CUDA device, nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const uint32_t n = m * hidden;
  const size_t bytes = size_t{n} * sizeof(float);
  std::printf("qmoe_offload_latency on %s: m %u, hidden %u, %d calls each\n", prop.name, m, hidden,
              calls);
  const Percentiles d = doorbell(hidden, m, calls, stream);
  const Percentiles pp = ping_pong(n, calls, stream);
  const Percentiles bare = ping_pong(0, calls, stream);
  const Percentiles hf = host_func(n, calls, stream);
  print("doorbell", d, bytes);
  print("ping-pong", pp, bytes);
  print("bare", bare, 0);
  print("host-func", hf, bytes);
  std::printf("doorbell / ping-pong p50 %.2f (bar 1.5), doorbell / host-func p50 %.2f (bar 0.3)\n",
              d.p50 / pp.p50, d.p50 / hf.p50);
  cudaStreamDestroy(stream);
  return 0;
}
