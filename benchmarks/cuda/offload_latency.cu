// qmoe_offload_latency: the doorbell round trip, p50 and p99 over many calls, beside two
// hand-offs that move the same bytes, all in one process (DESIGN's bars: the doorbell within
// 1.5x of the raw ping-pong's p50, and at most 0.3x of the host-function hand-off's).
//
//   doorbell    the offload kernels themselves (lib/offload/kernels.h through
//               lib/cuda/offload_kernels.cu): classify-publish (all-cold routing, x staged into
//               the ring, system fence, release of req_seq), the CPU service thread
//               (lib/offload/service.h, spinning) with a handler that copies the tile into the
//               result, wait-accumulate (acquire of done_seq, the result read and added into y)
//   ping-pong   the least a mapped-memory round trip carrying the payload can cost: one kernel
//               of one block of up to 1024 threads stages x into pinned host memory with
//               16-byte stores, fences, releases a flag, waits for the CPU's flag, then issues
//               every 16-byte uncached load of the result before it adds any into y (at hidden
//               2048, 512 threads of one load each: a single PCIe round trip, at least as
//               parallel as the doorbell's wait; past 16 K values, rounds of 64 KB); a CPU
//               thread spins, copies, releases
//   bare        the same with no payload (one thread's flag and answer)
//   host-func   cudaMemcpyAsync of x into pinned memory, cudaLaunchHostFunc copying it into the
//               result, cudaMemcpyAsync of the result back: the KTransformers hand-off
// Each call is timed with CUDA events recorded on the stream around it, in two modes:
//   eager    each call enqueued after the previous one ended: its time includes the host's
//            submission of its work after the start event, which differs between the methods
//            (the doorbell two kernel launches, the host function three stream operations, the
//            ping-pong one launch)
//   queued   a gate kernel (one thread polling a word in mapped host memory, for at most 10 s)
//            holds the stream while a batch of 50 calls is enqueued behind it, each between its
//            own pair of events; then the host opens the gate. Each call's work is on the device
//            before the call before it ends, so its time is the device's and the hand-off's
//            alone, with no host submission in it, for every method alike
// The bars are read in the queued mode: the doorbell runs in a captured CUDA graph, whose replay
// submits no launch per kernel, so the per-launch submission in the eager times is no cost it
// pays there. The payload is m rows of H FP32 values each way (the ping-pong's rounded up to
// whole 16 bytes). Without a usable GPU it says why and exits 0.
//
// Usage: qmoe_offload_latency [--hidden H] [--m M] [--calls N] [--mode eager|queued|both]
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

using SystemU64 = ::cuda::atomic_ref<unsigned long long, ::cuda::thread_scope_system>;

// The gate the queued mode holds closed, if any: fail() opens it before exiting, so that no
// kernel is left polling it (the gate kernel would give up after its timeout anyway).
struct HeldGate {
  unsigned long long* word;  // host view
  unsigned long long generation;
};
HeldGate held_gate{nullptr, 0};

void open_gate(unsigned long long* word, unsigned long long generation) {
  __atomic_store_n(word, generation, __ATOMIC_RELEASE);
}

[[noreturn]] void fail() {
  if (held_gate.word != nullptr) open_gate(held_gate.word, held_gate.generation);
  std::exit(1);
}

#define CHECK_CUDA(expr)                                                    \
  do {                                                                      \
    const cudaError_t check_e = (expr);                                     \
    if (check_e != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(check_e)); \
      fail();                                                               \
    }                                                                       \
  } while (0)

__device__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// y after `calls` additions of 0.5, rounded as the device rounds each one.
float accumulated(uint64_t calls) {
  float y = 0.0f;
  for (uint64_t i = 0; i < calls; ++i) y += 0.5f;
  return y;
}

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

// ---- Timing: eager and queued ----------------------------------------------------------------

constexpr int kBatch = 50;                           // calls a queued batch holds
constexpr uint64_t kGateTimeoutNs = 10000000000ull;  // a gate never opened gives up after 10 s

// Holds the stream until the host stores `generation` (or more) into *open; after timeout_ns it
// gives up and leaves its generation in *timed_out.
__global__ void gate_kernel(unsigned long long* open, unsigned long long* timed_out,
                            unsigned long long generation, uint64_t timeout_ns) {
  SystemU64 word(*open);
  const uint64_t start = globaltimer_ns();
  while (word.load(::cuda::memory_order_acquire) < generation) {
    if (globaltimer_ns() - start > timeout_ns) {
      SystemU64(*timed_out).store(generation, ::cuda::memory_order_relaxed);
      return;
    }
    __nanosleep(1000);
  }
}

struct Modes {
  bool eager, queued;
};

struct ModeTimes {
  Percentiles eager{}, queued{};
};

// Times `one()` (which enqueues the next call on the stream) `calls` times after a warm-up, in
// either mode.
class Timer {
 public:
  Timer(cudaStream_t stream, int calls) : stream_(stream), calls_(calls) {
    // The gate's word, and the timed-out word on a line of its own.
    CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&gate_), 256, cudaHostAllocMapped));
    std::memset(gate_, 0, 256);
    CHECK_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&gate_device_), gate_, 0));
    start_.resize(kBatch);
    stop_.resize(kBatch);
    for (int i = 0; i < kBatch; ++i) {
      CHECK_CUDA(cudaEventCreate(&start_[i]));
      CHECK_CUDA(cudaEventCreate(&stop_[i]));
    }
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  ~Timer() {
    for (int i = 0; i < kBatch; ++i) {
      cudaEventDestroy(start_[i]);
      cudaEventDestroy(stop_[i]);
    }
    cudaFreeHost(gate_);
  }

  template <typename Enqueue>
  ModeTimes time(Modes modes, Enqueue one) {
    ModeTimes t;
    if (modes.eager) t.eager = eager(one);
    if (modes.queued) t.queued = queued(one);
    return t;
  }

 private:
  // Each call enqueued once the previous one has ended.
  template <typename Enqueue>
  Percentiles eager(Enqueue& one) {
    std::vector<float> us;
    const int warmup = std::max(10, calls_ / 20);
    for (int i = 0; i < warmup + calls_; ++i) {
      CHECK_CUDA(cudaEventRecord(start_[0], stream_));
      one();
      CHECK_CUDA(cudaEventRecord(stop_[0], stream_));
      CHECK_CUDA(cudaEventSynchronize(stop_[0]));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start_[0], stop_[0]));
      if (i >= warmup) us.push_back(ms * 1000.0f);
    }
    return percentiles(us);
  }

  // Batches of calls enqueued behind a closed gate, which the host opens once the whole batch
  // is on the stream; the first batch warms up.
  template <typename Enqueue>
  Percentiles queued(Enqueue& one) {
    std::vector<float> us;
    for (bool warm = false; us.size() < static_cast<size_t>(calls_); warm = true) {
      const int batch = warm ? std::min(kBatch, calls_ - static_cast<int>(us.size())) : kBatch;
      const unsigned long long generation = ++generation_;
      held_gate = {gate_, generation};
      gate_kernel<<<1, 1, 0, stream_>>>(gate_device_, gate_device_ + 16, generation,
                                        kGateTimeoutNs);
      CHECK_CUDA(cudaGetLastError());
      for (int i = 0; i < batch; ++i) {
        CHECK_CUDA(cudaEventRecord(start_[i], stream_));
        one();
        CHECK_CUDA(cudaEventRecord(stop_[i], stream_));
      }
      open_gate(gate_, generation);
      held_gate = {nullptr, 0};
      CHECK_CUDA(cudaStreamSynchronize(stream_));
      if (__atomic_load_n(gate_ + 16, __ATOMIC_ACQUIRE) != 0) {
        std::fprintf(stderr, "the gate timed out before a batch of %d calls was enqueued\n", batch);
        fail();
      }
      if (!warm) continue;
      for (int i = 0; i < batch; ++i) {
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start_[i], stop_[i]));
        us.push_back(ms * 1000.0f);
      }
    }
    return percentiles(us);
  }

  cudaStream_t stream_;
  int calls_;
  unsigned long long* gate_ = nullptr;  // [0] the generation open, [16] a timed-out gate's
  unsigned long long* gate_device_ = nullptr;
  unsigned long long generation_ = 0;
  std::vector<cudaEvent_t> start_, stop_;
};

// ---- The doorbell: the offload kernels and the service -------------------------------------

class EchoHandler : public offload::RequestHandler {
 public:
  qmoe_status serve(const offload::RequestView& r, char*, size_t) override {
    std::memcpy(r.result, r.x, size_t{r.meta.m} * r.hidden * sizeof(float));
    return QMOE_STATUS_OK;
  }
};

ModeTimes doorbell(uint32_t hidden, uint32_t m, cudaStream_t stream, Timer& timer, Modes modes) {
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
  const size_t n = size_t{m} * hidden;
  CHECK_CUDA(cudaMalloc(&state, sizeof *state));
  CHECK_CUDA(cudaMalloc(&record, sizeof *record));
  CHECK_CUDA(cudaMalloc(&flags, m));
  CHECK_CUDA(cudaMalloc(&d_m, sizeof *d_m));
  CHECK_CUDA(cudaMalloc(&ids, m * sizeof(int32_t)));
  CHECK_CUDA(cudaMalloc(&weights, m * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&residency, kExperts * sizeof(int32_t)));
  CHECK_CUDA(cudaMalloc(&x, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&y, n * sizeof(float)));
  offload::OffloadDeviceState initial{};
  initial.next_seq = 1;
  CHECK_CUDA(cudaMemcpy(state, &initial, sizeof initial, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(record, 0, sizeof *record));
  CHECK_CUDA(cudaMemcpy(d_m, &m, sizeof m, cudaMemcpyHostToDevice));
  const std::vector<int32_t> host_ids(m, 3), host_residency(kExperts, -1);  // all cold
  const std::vector<float> host_weights(m, 1.0f), host_x(n, 0.5f);
  CHECK_CUDA(cudaMemcpy(ids, host_ids.data(), m * sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(weights, host_weights.data(), m * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(residency, host_residency.data(), kExperts * sizeof(int32_t),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(x, host_x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(y, 0, n * sizeof(float)));

  EchoHandler handler;
  offload::ServiceOptions options;
  options.spin_ns = 10000000000ull;  // spin throughout
  offload::OffloadService service(static_cast<unsigned char*>(ring), layout, &handler, options);
  if (service.start("qmoe_offload_latency") != QMOE_STATUS_OK) fail();

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
  // Both modes run on this one state and service: the check below covers every call of both.
  uint64_t calls = 0;
  const ModeTimes t = timer.time(modes, [&] {
    CHECK_CUDA(qmoe::cuda::launch_offload_classify_publish(a, stream));
    CHECK_CUDA(qmoe::cuda::launch_offload_wait_accumulate(w, blocks, stream));
    ++calls;
  });
  offload::OffloadDeviceState final_state{};
  CHECK_CUDA(cudaMemcpy(&final_state, state, sizeof final_state, cudaMemcpyDeviceToHost));
  std::vector<float> host_y(n);
  CHECK_CUDA(cudaMemcpy(host_y.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost));
  service.stop();
  // Every call published one request, the service answered it, the wait consumed it and added
  // its 0.5s into y.
  const float expected = accumulated(calls);
  const size_t wrong = static_cast<size_t>(
      std::count_if(host_y.begin(), host_y.end(), [&](float v) { return v != expected; }));
  const offload::DeviceTelemetry& tel = final_state.telemetry;
  if (final_state.error != 0 || tel.published != calls || final_state.next_seq != calls + 1 ||
      final_state.consumed_seq != calls || service.served() != calls || wrong != 0) {
    std::fprintf(stderr,
                 "doorbell: error 0x%x after %llu calls: %llu published, next_seq %llu, "
                 "consumed_seq %llu, %llu served, %zu of y's %zu values not %g\n",
                 final_state.error, static_cast<unsigned long long>(calls),
                 static_cast<unsigned long long>(tel.published),
                 static_cast<unsigned long long>(final_state.next_seq),
                 static_cast<unsigned long long>(final_state.consumed_seq),
                 static_cast<unsigned long long>(service.served()), wrong, n, expected);
    fail();
  }
  for (void* p : {static_cast<void*>(state), static_cast<void*>(record), static_cast<void*>(flags),
                  static_cast<void*>(d_m), static_cast<void*>(ids), static_cast<void*>(weights),
                  static_cast<void*>(residency), static_cast<void*>(x), static_cast<void*>(y)}) {
    cudaFree(p);
  }
  cudaFreeHost(ring);
  return t;
}

// ---- The raw mapped-memory ping-pong -------------------------------------------------------

constexpr uint32_t kPingPongThreads = 1024;  // at most, in the one block
constexpr uint32_t kPingPongVectors = 4;     // 16-byte loads a thread has in flight at once
constexpr uint64_t kPingPongTimeoutNs = 1000000000ull;  // as the doorbell's wait

// Copies vectors [base, base + threads * kPingPongVectors) of `from` into `to` (or adds them
// into it): a thread issues all its loads of the round before its first store.
template <bool kAdd, bool kUncached>
__device__ __forceinline__ void copy_round(const float4* __restrict__ from, float4* __restrict__ to,
                                           uint32_t base, uint32_t vectors) {
  float4 v[kPingPongVectors], old[kPingPongVectors];
#pragma unroll
  for (uint32_t j = 0; j < kPingPongVectors; ++j) {
    const uint32_t i = base + j * blockDim.x + threadIdx.x;
    if (i < vectors) {
      v[j] = kUncached ? __ldcv(from + i) : from[i];
      if (kAdd) old[j] = to[i];
    }
  }
#pragma unroll
  for (uint32_t j = 0; j < kPingPongVectors; ++j) {
    const uint32_t i = base + j * blockDim.x + threadIdx.x;
    if (i < vectors) {
      to[i] = kAdd ? make_float4(old[j].x + v[j].x, old[j].y + v[j].y, old[j].z + v[j].z,
                                 old[j].w + v[j].w)
                   : v[j];
    }
  }
}

// Payload out (x into the tile in host memory), fence, flag, wait for the answer, payload back
// in (the result added into y). `vectors` float4s each way; one block.
__global__ void __launch_bounds__(kPingPongThreads)
    ping_pong_kernel(const float4* __restrict__ x, float4* __restrict__ tile,
                     const float4* __restrict__ result, float4* __restrict__ y,
                     unsigned long long* flag, unsigned long long* answer,
                     unsigned long long* timed_out, unsigned long long seq, uint32_t vectors) {
  __shared__ int answered;
  const uint32_t round = blockDim.x * kPingPongVectors;
  for (uint32_t base = 0; base < vectors; base += round) {
    copy_round<false, false>(x, tile, base, vectors);
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    SystemU64(*flag).store(seq, ::cuda::memory_order_release);
    SystemU64 done(*answer);
    const uint64_t start = globaltimer_ns();
    int ok = 1;
    while (done.load(::cuda::memory_order_acquire) != seq) {
      if (globaltimer_ns() - start > kPingPongTimeoutNs) {
        SystemU64(*timed_out).store(seq, ::cuda::memory_order_relaxed);
        ok = 0;
        break;
      }
    }
    answered = ok;
  }
  __syncthreads();
  if (answered == 0) return;
  for (uint32_t base = 0; base < vectors; base += round) {
    copy_round<true, true>(result, y, base, vectors);
  }
}

ModeTimes ping_pong(uint32_t n, cudaStream_t stream, Timer& timer, Modes modes) {
  const uint32_t vectors = (n + 3) / 4;
  const size_t floats = size_t{vectors} * 4;
  // Host memory: flag line, answer line (and the timed-out word), tile, result.
  const size_t bytes = 256 + 2 * floats * sizeof(float);
  unsigned char* host = nullptr;
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host), bytes, cudaHostAllocMapped));
  std::memset(host, 0, bytes);
  unsigned char* dev = nullptr;
  CHECK_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), host, 0));
  auto* flag = reinterpret_cast<unsigned long long*>(host);
  auto* answer = reinterpret_cast<unsigned long long*>(host + 128);
  auto* timed_out = reinterpret_cast<unsigned long long*>(host + 192);
  auto* tile = reinterpret_cast<float*>(host + 256);
  auto* result = tile + floats;
  float *x = nullptr, *y = nullptr;
  const size_t alloc = std::max<size_t>(4, floats) * sizeof(float);
  CHECK_CUDA(cudaMalloc(&x, alloc));
  CHECK_CUDA(cudaMalloc(&y, alloc));
  const std::vector<float> host_x(floats, 0.5f);
  if (floats != 0) {
    CHECK_CUDA(cudaMemcpy(x, host_x.data(), floats * sizeof(float), cudaMemcpyHostToDevice));
  }
  CHECK_CUDA(cudaMemset(y, 0, alloc));
  std::atomic<bool> stop{false};
  std::thread responder([&] {
    for (unsigned long long seq = 1; !stop.load(std::memory_order_relaxed);) {
      if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != seq) continue;
      std::memcpy(result, tile, floats * sizeof(float));
      __atomic_store_n(answer, seq, __ATOMIC_RELEASE);
      ++seq;
    }
  });
  const auto dev_flag = reinterpret_cast<unsigned long long*>(dev);
  const auto dev_answer = reinterpret_cast<unsigned long long*>(dev + 128);
  const auto dev_timed_out = reinterpret_cast<unsigned long long*>(dev + 192);
  const auto dev_tile = reinterpret_cast<float4*>(dev + 256);
  // Enough threads that each has one 16-byte vector, up to 1024 (then up to kPingPongVectors
  // each a round); a warp for the bare flag.
  const uint32_t threads = std::min(kPingPongThreads, std::max(32u, (vectors + 31) / 32 * 32));
  unsigned long long seq = 0;  // continues across the modes, as the responder's does
  const ModeTimes t = timer.time(modes, [&] {
    ping_pong_kernel<<<1, threads, 0, stream>>>(
        reinterpret_cast<const float4*>(x), dev_tile, dev_tile + vectors,
        reinterpret_cast<float4*>(y), dev_flag, dev_answer, dev_timed_out, ++seq, vectors);
    CHECK_CUDA(cudaGetLastError());
  });
  stop.store(true);
  responder.join();
  // Every call's answer came, and added its 0.5s into y.
  std::vector<float> host_y(floats);
  if (floats != 0) {
    CHECK_CUDA(cudaMemcpy(host_y.data(), y, floats * sizeof(float), cudaMemcpyDeviceToHost));
  }
  const float expected = accumulated(seq);
  const size_t wrong = static_cast<size_t>(
      std::count_if(host_y.begin(), host_y.end(), [&](float v) { return v != expected; }));
  const unsigned long long late = __atomic_load_n(timed_out, __ATOMIC_ACQUIRE);
  if (late != 0 || wrong != 0) {
    std::fprintf(stderr, "ping-pong: timed-out call %llu (0: none), %zu of y's %zu values not %g\n",
                 late, wrong, floats, expected);
    fail();
  }
  cudaFree(x);
  cudaFree(y);
  cudaFreeHost(host);
  return t;
}

// ---- The host-function hand-off -------------------------------------------------------------

struct HostCopy {
  const float* from;
  float* to;
  size_t n;
};

// Runs on the runtime's callback thread; it waits on nothing (the gate is opened by the main
// thread, never from a callback).
void CUDART_CB copy_on_host(void* state) {
  auto* c = static_cast<HostCopy*>(state);
  std::memcpy(c->to, c->from, c->n * sizeof(float));
}

ModeTimes host_func(uint32_t n, cudaStream_t stream, Timer& timer, Modes modes) {
  float *tile = nullptr, *result = nullptr, *x = nullptr, *y = nullptr;
  CHECK_CUDA(cudaMallocHost(&tile, n * sizeof(float)));
  CHECK_CUDA(cudaMallocHost(&result, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&x, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&y, n * sizeof(float)));
  CHECK_CUDA(cudaMemset(x, 0, n * sizeof(float)));
  HostCopy copy{tile, result, n};
  const ModeTimes t = timer.time(modes, [&] {
    CHECK_CUDA(cudaMemcpyAsync(tile, x, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaLaunchHostFunc(stream, copy_on_host, &copy));
    CHECK_CUDA(cudaMemcpyAsync(y, result, n * sizeof(float), cudaMemcpyHostToDevice, stream));
  });
  cudaFreeHost(tile);
  cudaFreeHost(result);
  cudaFree(x);
  cudaFree(y);
  return t;
}

void print(const char* name, const Percentiles& p, size_t bytes) {
  std::printf("  %-10s payload %7zu B each way: p50 %8.2f us  p99 %8.2f us  best %8.2f us\n", name,
              bytes, p.p50, p.p99, p.best);
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t hidden = 2048, m = 1;
  int calls = 2000;
  Modes modes{true, true};
  for (int i = 1; i < argc; i += 2) {
    const std::string opt = argv[i];
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    const long v = std::strtol(value.c_str(), nullptr, 10);
    if (opt == "--hidden" && v > 0) {
      hidden = static_cast<uint32_t>(v);
    } else if (opt == "--m" && v > 0 && v <= 64) {
      m = static_cast<uint32_t>(v);
    } else if (opt == "--calls" && v > 0) {
      calls = static_cast<int>(v);
    } else if (opt == "--mode" && (value == "eager" || value == "queued" || value == "both")) {
      modes = {value != "queued", value != "eager"};
    } else {
      std::fprintf(stderr,
                   "usage: %s [--hidden H] [--m M (1-64)] [--calls N] "
                   "[--mode eager|queued|both]\n",
                   argv[0]);
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
  ModeTimes d, pp, bare, hf;
  {
    Timer timer(stream, calls);
    d = doorbell(hidden, m, stream, timer, modes);
    pp = ping_pong(n, stream, timer, modes);
    bare = ping_pong(0, stream, timer, modes);
    hf = host_func(n, stream, timer, modes);
  }
  auto report = [&](const char* mode, const char* how, Percentiles ModeTimes::*p) {
    std::printf("%s (%s):\n", mode, how);
    print("doorbell", d.*p, bytes);
    print("ping-pong", pp.*p, bytes);
    print("bare", bare.*p, 0);
    print("host-func", hf.*p, bytes);
    std::printf(
        "  %s: doorbell / ping-pong p50 %.2f (bar 1.5), doorbell / host-func p50 %.2f (bar 0.3)\n",
        mode, (d.*p).p50 / (pp.*p).p50, (d.*p).p50 / (hf.*p).p50);
  };
  if (modes.eager) {
    report("eager", "each call launched after the previous one ended; host submission included",
           &ModeTimes::eager);
  }
  if (modes.queued) {
    const std::string how = "batches of " + std::to_string(kBatch) +
                            " calls enqueued behind a gate; device side only, the bars' mode";
    report("queued", how.c_str(), &ModeTimes::queued);
  }
  cudaStreamDestroy(stream);
  return 0;
}
