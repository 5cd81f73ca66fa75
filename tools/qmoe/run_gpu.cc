#include "run_gpu.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gpu_rms_norm.h"
#include "progress.h"
#include "residency_schedule.h"
#include "run_check.h"
#include "run_checksum.h"
#include "run_clock.h"
#include "run_report.h"
#include "run_routing.h"
#include "weight_formats.h"

namespace {

int report_cuda(cudaError_t e, const char* what) {
  std::fprintf(stderr, "\nqmoe run: %s: %s (%s)\n", what, cudaGetErrorName(e),
               cudaGetErrorString(e));
  return 1;
}

#define CUDA_CHECK(call)                        \
  do {                                          \
    const cudaError_t cuda_check_e_ = (call);   \
    if (cuda_check_e_ != cudaSuccess) {         \
      return report_cuda(cuda_check_e_, #call); \
    }                                           \
  } while (0)

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

int device_alloc(size_t bytes, DeviceBuffer* out) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  out->reset(p);
  return 0;
}

struct CudaSetDeleter {
  void operator()(qmoe_cuda_expert_set* s) const { qmoe_cuda_expert_set_destroy(s); }
};
struct SessionDeleter {
  void operator()(qmoe_cuda_offload* s) const { qmoe_cuda_offload_destroy(s); }
};
struct GraphExecDeleter {
  void operator()(CUgraphExec_st* g) const { cudaGraphExecDestroy(g); }
};
using GraphExec = std::unique_ptr<CUgraphExec_st, GraphExecDeleter>;

// Page-locks host ranges for as long as it lives (--host-memory pinned): copies from pinned
// memory run on the copy engine alone, while from pageable memory the CUDA runtime first waits
// for the copy stream's earlier work and then stages the bytes on the calling thread, which
// puts every expert cache promotion on the step's critical path.
class HostRegistrations {
 public:
  HostRegistrations() = default;
  HostRegistrations(const HostRegistrations&) = delete;
  HostRegistrations& operator=(const HostRegistrations&) = delete;
  ~HostRegistrations() {
    for (void* p : ranges_) cudaHostUnregister(p);
  }
  int add(const void* p, size_t bytes) {
    // cudaHostRegister takes a non-const pointer; it does not write the memory.
    void* range = const_cast<void*>(p);
    CUDA_CHECK(cudaHostRegister(range, bytes, cudaHostRegisterDefault));
    ranges_.push_back(range);
    return 0;
  }

 private:
  std::vector<void*> ranges_;
};

// Every step's routing, drawn on the host as `qmoe run` draws it on the CPU (run_routing.h).
int draw_run_routing(const RunOptions& o, uint32_t steps, RoutingTrace* routing) {
  RoutingDraw draw;
  draw.kind = o.routing;
  draw.layers = o.shape.layers;
  draw.experts = o.shape.experts;
  draw.top_k = o.shape.top_k;
  draw.tokens = o.batch;
  draw.seed = o.seed;
  draw.drift_period = o.drift_period;
  QMOE_CHECK(draw_routing(draw, steps, routing));
  return 0;
}

// One graph of every layer: forward(l) then the RMS rescale of its output.
template <typename Forward>
int capture_step(cudaStream_t stream, uint32_t layers, Forward forward, GraphExec* out) {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  qmoe_status status = QMOE_STATUS_OK;
  cudaError_t launched = cudaSuccess;
  for (uint32_t l = 0; l < layers && status == QMOE_STATUS_OK && launched == cudaSuccess; ++l) {
    status = forward(l, &launched);
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (status != QMOE_STATUS_OK) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return report_failed_call(status);
  }
  CUDA_CHECK(launched);
  CUDA_CHECK(ended);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(instantiated);
  out->reset(exec);
  return 0;
}

qmoe_cuda_offload_telemetry read_telemetry(qmoe_cuda_offload* session, cudaStream_t stream,
                                           qmoe_status* status) {
  qmoe_cuda_offload_telemetry t{};
  t.struct_size = sizeof t;
  *status = qmoe_cuda_offload_get_telemetry(session, stream, &t);
  return t;
}

// The hybrid's cold work on the CPU alone, to tell the hand-off's cost from the executor's: per
// step, every layer call that had a cold selection (the others publish nothing, so the service
// never sees them), in layer order as the service thread answers them, through
// qmoe_moe_forward on the same context (its thread count, its pool) and CPU sets, with the
// layer's cold experts as the run mask, the step's routing, FP32 x [M, H] and y = the result
// (accumulate 0), as the service's handler runs them. The calling thread is the pool's caller
// here, as the service thread is in the hybrid. x is one fixed [M, H] buffer: the values do not
// change the work. Step 0 is the warm-up, as in the GPU passes; each timed step's wall time
// goes to `ms`.
int run_cpu_alone(const RunOptions& o, qmoe_context* context,
                  const std::vector<const qmoe_expert_set*>& host_layers,
                  const ResidencySchedule& schedule, const RoutingTrace& routing,
                  const std::vector<float>& x, std::vector<double>* ms) {
  const ModelShape& shape = o.shape;
  const uint32_t L = shape.layers, E = shape.experts, K = shape.top_k, M = o.batch;
  const uint32_t H = shape.hidden, steps = o.tokens + 1;
  const size_t per_layer = size_t{M} * K, per_step = per_layer * L;
  // Each call's run mask: the experts its step runs on the CPU (one per layer without a cache).
  const uint32_t masked_steps = schedule.cached ? steps : 1;
  std::vector<std::vector<uint8_t>> cold(size_t{masked_steps} * L, std::vector<uint8_t>(E));
  for (uint32_t s = 0; s < masked_steps; ++s) {
    for (uint32_t l = 0; l < L; ++l) {
      const std::vector<uint8_t>& resident = schedule.resident(s, l);
      for (uint32_t e = 0; e < E; ++e) cold[size_t{s} * L + l][e] = resident[e] ? 0 : 1;
    }
  }
  auto cold_of = [&](size_t call) -> const std::vector<uint8_t>& {
    return cold[schedule.cached ? call : call % L];
  };
  size_t workspace_bytes = 0;
  for (uint32_t l = 0; l < L; ++l) {
    size_t bytes = 0;
    QMOE_CHECK(qmoe_moe_workspace_size(context, host_layers[l], o.accuracy, M, K, &bytes));
    workspace_bytes = std::max(workspace_bytes, bytes);
  }
  // A workspace of the caller's, as the service's handler has its own: no scratch lease a call.
  std::vector<unsigned char> workspace(workspace_bytes);
  std::vector<float> y(size_t{M} * H);
  // Which calls the device would publish (a cold expert with a nonzero weight), decided before
  // the clock runs: the hybrid's classification is the GPU's work, not the CPU's.
  std::vector<uint8_t> served(size_t{steps} * L, 0);
  for (size_t call = 0; call < served.size(); ++call) {
    for (size_t j = call * per_layer; j < (call + 1) * per_layer; ++j) {
      if (routing.weights[j] != 0.0f && cold_of(call)[routing.ids[j]]) served[call] = 1;
    }
  }
  ms->reserve(o.tokens);
  Progress progress("cold experts on the cpu alone", o.tokens, true);
  for (uint32_t s = 0; s < steps; ++s) {
    const auto start = Clock::now();
    for (uint32_t l = 0; l < L; ++l) {
      if (!served[size_t{s} * L + l]) continue;
      const size_t at = s * per_step + l * per_layer;
      qmoe_moe_params p;
      qmoe_moe_params_init(&p);
      p.accuracy = o.accuracy;
      p.m = M;
      p.dtype = QMOE_DTYPE_F32;
      p.x = x.data();
      p.ldx = H;
      p.y = y.data();
      p.ldy = H;
      p.k = K;
      p.ids = routing.ids.data() + at;
      p.weights = routing.weights.data() + at;
      p.run_mask = cold_of(size_t{s} * L + l).data();
      p.accumulate = 0;
      p.workspace = workspace.data();
      p.workspace_bytes = workspace.size();
      QMOE_CHECK(qmoe_moe_forward(context, host_layers[l], &p));
    }
    const double elapsed = seconds_since(start) * 1e3;
    if (s == 0) continue;
    ms->push_back(elapsed);
    progress.update(s);
  }
  progress.finish();
  return 0;
}

}  // namespace

int run_gpu_decode(const RunOptions& options, qmoe_context* context, const RunModel& model,
                   GpuDecodeResult* result) {
  const ModelShape& shape = options.shape;
  const uint32_t L = shape.layers, E = shape.experts, K = shape.top_k, M = options.batch;
  const uint32_t H = shape.hidden;
  const uint32_t steps = options.tokens + 1;  // the first is the warm-up
  CUDA_CHECK(cudaSetDevice(options.device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, options.device));
  result->device_name = prop.name;

  // Residency: each layer's most popular experts, as a runtime would keep them.
  const uint32_t resident = static_cast<uint32_t>(std::lround(options.residency * E));
  result->resident_per_layer = resident;
  std::vector<std::vector<uint32_t>> resident_ids(L);
  for (uint32_t l = 0; l < L; ++l) {
    const std::vector<uint32_t> order = popularity_order(E, options.seed, l);
    resident_ids[l].assign(order.begin(), order.begin() + resident);
  }

  // Declared before the device sets, so it outlives their copies.
  HostRegistrations pinned;
  if (options.pin_host_experts) {
    const Clock::time_point start = Clock::now();
    Progress progress("page-locking the host experts", L, true);
    for (uint32_t l = 0; l < L; ++l) {
      if (const int code =
              pinned.add(model.layers[l]->weight_data(), model.layers[l]->weight_bytes());
          code != 0) {
        return code;
      }
      progress.update(l + 1);
    }
    progress.finish();
    result->pin_seconds = seconds_since(start);
  }

  std::vector<std::unique_ptr<qmoe_cuda_expert_set, CudaSetDeleter>> gpu_sets;
  std::vector<const qmoe_cuda_expert_set*> gpu_layers;
  std::vector<const qmoe_expert_set*> host_layers;
  {
    Progress progress("placing experts on the GPU", L, true);
    for (uint32_t l = 0; l < L; ++l) {
      qmoe_cuda_expert_set_desc d;
      qmoe_cuda_expert_set_desc_init(&d);
      d.device = options.device;
      d.experts = model.layers[l]->set();
      d.resident = resident_ids[l].data();
      d.num_resident = resident;
      d.num_slots = std::max(resident, 1u);
      qmoe_cuda_expert_set* set = nullptr;
      QMOE_CHECK(qmoe_cuda_expert_set_create(&d, &set));
      gpu_sets.emplace_back(set);
      gpu_layers.push_back(set);
      host_layers.push_back(model.layers[l]->set());
      progress.update(l + 1);
    }
    progress.finish();
  }

  qmoe_cuda_offload_desc od;
  qmoe_cuda_offload_desc_init(&od);
  od.device = options.device;
  od.context = context;
  od.num_layers = L;
  od.host_layers = host_layers.data();
  od.gpu_layers = gpu_layers.data();
  od.m_capacity = M;
  od.k = K;
  qmoe_cuda_offload* raw_session = nullptr;
  QMOE_CHECK(qmoe_cuda_offload_create(&od, &raw_session));
  std::unique_ptr<qmoe_cuda_offload, SessionDeleter> session(raw_session);

  RoutingTrace routing;
  if (const int code = draw_run_routing(options, steps, &routing); code != 0) return code;
  // Which experts each step runs resident: the placement above throughout, or (--cache) as the
  // expert cache moves them (residency_schedule.h).
  CacheChoice cache_choice;
  cache_choice.policy = options.cache;
  cache_choice.budget = options.cache_budget;
  cache_choice.admission_margin = options.cache_margin;
  ResidencySchedule schedule;
  QMOE_CHECK(build_residency_schedule(routing, steps, L, E, std::max(resident, 1u), resident_ids,
                                      cache_choice, &schedule));
  result->scheduled_promotions = schedule.promotions;
  const size_t per_layer = size_t{M} * K, per_step = per_layer * L;
  // What each step reads, from the routing as drawn.
  std::vector<uint8_t> seen(E);
  for (uint32_t s = 1; s < steps; ++s) {
    for (uint32_t l = 0; l < L; ++l) {
      std::fill(seen.begin(), seen.end(), 0);
      bool cold_call = false;
      const size_t at = s * per_step + l * per_layer;
      for (size_t j = 0; j < per_layer; ++j) {
        if (routing.weights[at + j] == 0.0f) continue;
        const int32_t e = routing.ids[at + j];
        const bool cold = !schedule.resident(s, l)[e];
        ++result->selections;
        result->cold_selections += cold ? 1 : 0;
        cold_call |= cold;
        if (!seen[e]) {
          seen[e] = 1;
          (cold ? result->cold_experts : result->resident_experts) += 1;
        }
      }
      result->calls_with_cold += cold_call ? 1 : 0;
      ++result->layer_calls;
    }
  }

  // Device buffers: every step's routing, the layers' routing, the hidden states (layer l reads
  // row block l and writes l + 1), the token count, the resident-only graph's workspace.
  DeviceBuffer all_ids, all_weights, ids, weights, acts, count, workspace, expert_counts;
  const size_t act_rows = size_t{L + 1} * M;
  if (device_alloc(routing.ids.size() * sizeof(int32_t), &all_ids) != 0 ||
      device_alloc(size_t{L} * E * sizeof(uint32_t), &expert_counts) != 0 ||
      device_alloc(routing.weights.size() * sizeof(float), &all_weights) != 0 ||
      device_alloc(per_step * sizeof(int32_t), &ids) != 0 ||
      device_alloc(per_step * sizeof(float), &weights) != 0 ||
      device_alloc(act_rows * H * sizeof(float), &acts) != 0 ||
      device_alloc(sizeof(uint32_t), &count) != 0) {
    return 1;
  }
  size_t workspace_bytes = 0;
  QMOE_CHECK(qmoe_cuda_moe_workspace_size(gpu_layers[0], options.accuracy, M, K, &workspace_bytes));
  if (device_alloc(workspace_bytes, &workspace) != 0) return 1;
  CUDA_CHECK(cudaMemcpy(all_ids.get(), routing.ids.data(), routing.ids.size() * sizeof(int32_t),
                        cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(all_weights.get(), routing.weights.data(),
                        routing.weights.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(count.get(), &M, sizeof M, cudaMemcpyHostToDevice));
  std::vector<float> x0(size_t{M} * H);
  SplitMix64 rng(options.seed ^ 0xD1B54A32D192ED03ull);
  for (float& v : x0) v = rng.normalish();
  float* act = static_cast<float*>(acts.get());
  auto params = [&](uint32_t l, void* ws, size_t ws_bytes) {
    qmoe_cuda_moe_params p;
    qmoe_cuda_moe_params_init(&p);
    p.accuracy = options.accuracy;
    p.m_capacity = M;
    p.m = static_cast<const uint32_t*>(count.get());
    p.x = act + size_t{l} * M * H;
    p.ldx = H;
    p.y = act + size_t{l + 1} * M * H;
    p.ldy = H;
    p.k = K;
    p.ids = static_cast<const int32_t*>(ids.get()) + l * per_layer;
    p.weights = static_cast<const float*>(weights.get()) + l * per_layer;
    p.expert_counts = static_cast<uint32_t*>(expert_counts.get()) + size_t{l} * E;
    p.workspace = ws;
    p.workspace_bytes = ws_bytes;
    return p;
  };
  const auto* d_count = static_cast<const uint32_t*>(count.get());

  cudaStream_t stream = nullptr, copy_stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct StreamDestroy {
    cudaStream_t s;
    ~StreamDestroy() { cudaStreamDestroy(s); }
  } stream_guard{stream};
  CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  StreamDestroy copy_stream_guard{copy_stream};
  GraphExec hybrid, resident_only;
  const auto normalize = [&](uint32_t l) {
    return launch_rms_normalize(act + size_t{l + 1} * M * H, d_count, M, H, H, stream);
  };
  if (const int code = capture_step(
          stream, L,
          [&](uint32_t l, cudaError_t* launched) {
            const qmoe_cuda_moe_params p = params(l, nullptr, 0);
            const qmoe_status st = qmoe_cuda_offload_forward(session.get(), l, &p, stream);
            if (st == QMOE_STATUS_OK) *launched = normalize(l);
            return st;
          },
          &hybrid);
      code != 0) {
    return code;
  }
  if (const int code = capture_step(
          stream, L,
          [&](uint32_t l, cudaError_t* launched) {
            const qmoe_cuda_moe_params p = params(l, workspace.get(), workspace_bytes);
            const qmoe_status st = qmoe_cuda_moe_forward(gpu_layers[l], &p, stream);
            if (st == QMOE_STATUS_OK) *launched = normalize(l);
            return st;
          },
          &resident_only);
      code != 0) {
    return code;
  }

  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  const bool any_cold = resident < E;
  // The device's selections per expert after a pass against the last step's routing.
  auto last_step_counts_match = [&](bool* match) -> int {
    std::vector<uint32_t> got(size_t{L} * E), want(size_t{L} * E, 0);
    CUDA_CHECK(cudaMemcpy(got.data(), expert_counts.get(), got.size() * sizeof(uint32_t),
                          cudaMemcpyDeviceToHost));
    const size_t at = size_t{steps - 1} * per_step;
    for (uint32_t l = 0; l < L; ++l) {
      for (size_t j = 0; j < per_layer; ++j) {
        if (routing.weights[at + l * per_layer + j] == 0.0f) continue;
        ++want[size_t{l} * E + static_cast<uint32_t>(routing.ids[at + l * per_layer + j])];
      }
    }
    *match = got == want;
    return 0;
  };
  // --cache (residency_schedule.h): before step s's graph, each layer's update to the list the
  // schedule begins there, its copies on copy_stream (step 0 restores the placement the pass
  // starts from); once the graph is launched, every begun update finished behind it (the stream
  // waits for the copies, then maps the joiners), so the host enqueues the finishes while the
  // graph runs and only the begins, which need the last step's routing, precede the launch.
  auto begin_updates = [&](uint32_t s, uint64_t* copied_total) -> int {
    for (uint32_t l = 0; l < L; ++l) {
      qmoe_cuda_expert_set* set = gpu_sets[l].get();
      uint32_t copied = 0;
      if (s == 0) {
        const std::vector<uint32_t>& first = schedule.initial[l];
        QMOE_CHECK(qmoe_cuda_expert_set_update_residency(set, host_layers[l], first.data(),
                                                         static_cast<uint32_t>(first.size()),
                                                         stream, nullptr));
      } else if (schedule.begins[s][l]) {
        const std::vector<uint32_t>& next = schedule.begin_lists[s][l];
        QMOE_CHECK(qmoe_cuda_expert_set_begin_residency_update(set, host_layers[l], next.data(),
                                                               static_cast<uint32_t>(next.size()),
                                                               stream, copy_stream, &copied));
      }
      *copied_total += copied;
    }
    return 0;
  };
  auto finish_updates = [&]() -> int {
    for (uint32_t l = 0; l < L; ++l) {
      int finished = 0;
      QMOE_CHECK(
          qmoe_cuda_expert_set_finish_residency_update(gpu_sets[l].get(), stream, 1, &finished));
    }
    return 0;
  };
  // One pass of every step through `exec`; the hidden state restarts from x0.
  auto run_pass = [&](cudaGraphExec_t exec, bool hybrid_pass, std::vector<double>* gpu_ms,
                      std::vector<double>* wall_ms, const char* label) -> int {
    CUDA_CHECK(
        cudaMemcpyAsync(act, x0.data(), x0.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    uint64_t copied = 0;
    Progress progress(label, options.tokens, true);
    for (uint32_t s = 0; s < steps; ++s) {
      if (hybrid_pass && s == 1) {
        qmoe_status st = QMOE_STATUS_OK;
        result->before = read_telemetry(session.get(), stream, &st);
        QMOE_CHECK(st);
      }
      const auto wall_start = Clock::now();
      // With --cache the step's time includes its residency updates (the wait for copies that
      // outlast a step among them).
      if (schedule.cached) {
        CUDA_CHECK(cudaEventRecord(start, stream));
        const auto update_start = Clock::now();
        if (const int code = begin_updates(s, &copied); code != 0) return code;
        // The host's share before the launch: every layer's begin (the GPU has nothing of this
        // step to run meanwhile).
        if (hybrid_pass && s > 0)
          result->update_host_ms.push_back(seconds_since(update_start) * 1e3);
      }
      // A parked service thread starts spinning before the graph's first request.
      if (hybrid_pass && any_cold) QMOE_CHECK(qmoe_cuda_offload_wake(session.get()));
      CUDA_CHECK(cudaMemcpyAsync(ids.get(), static_cast<int32_t*>(all_ids.get()) + s * per_step,
                                 per_step * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
      CUDA_CHECK(cudaMemcpyAsync(weights.get(),
                                 static_cast<float*>(all_weights.get()) + s * per_step,
                                 per_step * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      // The last layer's output is the next step's input.
      if (s > 0) {
        CUDA_CHECK(cudaMemcpyAsync(act, act + size_t{L} * M * H, size_t{M} * H * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream));
      }
      if (!schedule.cached) CUDA_CHECK(cudaEventRecord(start, stream));
      CUDA_CHECK(cudaGraphLaunch(exec, stream));
      if (schedule.cached) {
        if (const int code = finish_updates(); code != 0) return code;
      }
      CUDA_CHECK(cudaEventRecord(stop, stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      const double wall = seconds_since(wall_start) * 1e3;
      if (hybrid_pass) QMOE_CHECK(qmoe_cuda_offload_check(session.get(), stream));
      if (s == 0) continue;
      float ms = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      gpu_ms->push_back(ms);
      if (wall_ms != nullptr) wall_ms->push_back(wall);
      progress.update(s);
    }
    progress.finish();
    if (hybrid_pass) result->copied_promotions = copied;
    return 0;
  };
  if (const int code = run_pass(hybrid.get(), true, &result->hybrid_ms, &result->hybrid_wall_ms,
                                "hybrid decode");
      code != 0) {
    return code;
  }
  qmoe_status st = QMOE_STATUS_OK;
  result->after = read_telemetry(session.get(), stream, &st);
  QMOE_CHECK(st);
  std::vector<float> last(size_t{M} * H);
  CUDA_CHECK(cudaMemcpy(last.data(), act + size_t{L} * M * H, last.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  result->checksum = fnv1a(last.data(), last.size() * sizeof(float));
  for (float v : last) result->finite = result->finite && std::isfinite(v);
  bool hybrid_counts = false, resident_counts = false;
  if (const int code = last_step_counts_match(&hybrid_counts); code != 0) return code;
  CUDA_CHECK(cudaMemset(expert_counts.get(), 0xFF, size_t{L} * E * sizeof(uint32_t)));
  if (const int code = run_pass(resident_only.get(), false, &result->resident_ms, nullptr,
                                "resident layers alone");
      code != 0) {
    return code;
  }
  QMOE_CHECK(qmoe_cuda_moe_check(workspace.get(), stream));
  if (const int code = last_step_counts_match(&resident_counts); code != 0) return code;
  result->counts_match = hybrid_counts && resident_counts;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  // The CPU's share alone, after the GPU passes so that their numbers are as before. The
  // session goes first: its parked service thread would still wake every park_poll_us to poll
  // the ring, beside the pool's threads. Its counters were read above.
  session.reset();
  if (any_cold) {
    if (const int code = run_cpu_alone(options, context, host_layers, schedule, routing, x0,
                                       &result->cpu_alone_ms);
        code != 0) {
      return code;
    }
  }

  // Conservation: the device's counters against each other, the host's, and the routing.
  const qmoe_cuda_offload_telemetry& a = result->after;
  const qmoe_cuda_offload_telemetry& b = result->before;
  const uint64_t published = a.published_requests - b.published_requests;
  const uint64_t shorted = a.short_circuits - b.short_circuits;
  const uint64_t cold_sel = a.cold_selections - b.cold_selections;
  char text[640];
  const bool device_sums =
      a.published_requests + a.short_circuits + a.refused_calls == a.classify_calls;
  const bool served = a.cold_selections == a.selections_served &&
                      a.published_requests == a.requests_served && a.failed_requests == 0;
  const bool matches_routing = published == result->calls_with_cold &&
                               shorted == result->layer_calls - result->calls_with_cold &&
                               cold_sel == result->cold_selections && a.refused_calls == 0;
  const bool promotions_match = result->copied_promotions == result->scheduled_promotions;
  result->conserved = device_sums && served && matches_routing && promotions_match;
  std::snprintf(
      text, sizeof text,
      "published %" PRIu64 " + short-circuited %" PRIu64 " + refused %" PRIu64
      " %s classify calls %" PRIu64 "; cold selections %" PRIu64 " %s served %" PRIu64
      "; timed steps: published %" PRIu64 " %s layer calls with a cold selection %" PRIu64
      ", cold selections %" PRIu64 " %s the routing's %" PRIu64 "; promotions copied %" PRIu64
      " %s scheduled %" PRIu64,
      a.published_requests, a.short_circuits, a.refused_calls,
      device_sums ? "==" : "!=", a.classify_calls, a.cold_selections,
      served ? "==" : "!=", a.selections_served, published,
      published == result->calls_with_cold ? "==" : "!=", result->calls_with_cold, cold_sel,
      cold_sel == result->cold_selections ? "==" : "!=", result->cold_selections,
      result->copied_promotions, promotions_match ? "==" : "!=", result->scheduled_promotions);
  result->conservation = text;
  return 0;
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

}  // namespace

void print_gpu_report(std::FILE* out, const RunOptions& options, const RunContext& run,
                      const RunModel& model, const RunBandwidth& bandwidth,
                      const GpuDecodeResult& g, double total_s) {
  const double steps = static_cast<double>(options.tokens);
  const double M = options.batch;
  const double expert = static_cast<double>(model.expert_bytes.total());
  const double hybrid = median(g.hybrid_ms), resident = median(g.resident_ms);
  const double wall = median(g.hybrid_wall_ms);
  const double cold_bytes = g.cold_experts * expert / steps;  // per step
  const double resident_bytes = g.resident_experts * expert / steps;
  const double roof = best_read_roof(bandwidth);
  const double cpu_floor = roof > 0 ? cold_bytes / roof * 1e3 : 0.0;  // ms per step
  // The cold work on the CPU alone, when it ran: the hybrid's time over the floor is the
  // hand-off (hybrid - cpu alone) plus the executor below the read roof (cpu alone - floor).
  const bool alone_ran = !g.cpu_alone_ms.empty();
  const double cpu_alone = median(g.cpu_alone_ms);
  const double us_per_layer = 1e3 / options.shape.layers;  // ms per step to us per layer
  const auto& a = g.after;
  const auto& b = g.before;
  const double wakeups = (a.wakeups - b.wakeups) / steps;
  // The service thread's time on the timed steps' requests, from seeing each request to
  // publishing its answer: the hand-off (hybrid - cpu alone) splits into the service's excess
  // over the same calls on the CPU alone, and the time outside the service (the GPU before the
  // publish and after the answer, the transport each way, the service noticing the request).
  const double service = (a.service_ns - b.service_ns) * 1e-6 / steps;  // ms per step
  const double published = (a.published_requests - b.published_requests) / steps;
  const double shorted = (a.short_circuits - b.short_circuits) / steps;
  // The ring's traffic per request: the routing and the x tile the GPU writes, the result the
  // CPU writes, each m rows of H FP32 values, and the request's header lines.
  const double request_bytes =
      M * options.shape.top_k * 8.0 + 2.0 * M * options.shape.hidden * 4.0 + 3 * 128.0;
  const double host_bytes = published * request_bytes;
  const double hit = g.selections > 0 ? 1.0 - double(g.cold_selections) / g.selections : 0.0;
  std::fprintf(out,
               "\nhybrid decode on %s, %u of %u experts per layer resident (%.0f%%), %s routing\n",
               g.device_name.c_str(), g.resident_per_layer, options.shape.experts,
               options.residency * 100.0, routing_name(options.routing));
  std::fprintf(out,
               "  %-28s %.3f ms per step, %.3f ms per token (median of %u; host wall %.3f ms)\n",
               "hybrid graph", hybrid, hybrid / M, options.tokens, wall);
  std::fprintf(out, "  %-28s %.3f ms per step (the resident experts alone, same routing)\n",
               "gpu time", resident);
  std::fprintf(out,
               "  %-28s %.3f ms per step: %.1f MB of cold experts a step over %.1f GB/s (%s; the "
               "best of the buffer before %.1f, the weights' pages %.1f, the buffer after %.1f)\n",
               "cpu floor", cpu_floor, cold_bytes * 1e-6, roof * 1e-9,
               run.threads > 1 ? "all threads" : "1 thread", bandwidth.reference * 1e-9,
               bandwidth.weights * 1e-9, bandwidth.reference_after * 1e-9);
  if (cpu_floor > 0) {
    std::fprintf(out, "  %-28s %.3f (hybrid / cpu floor)\n", "over the cpu floor",
                 hybrid / cpu_floor);
  }
  if (resident > 0) {
    std::fprintf(out, "  %-28s %.3f (hybrid / resident alone)\n", "over the resident layers",
                 hybrid / resident);
  }
  if (alone_ran) {
    char ratio[32] = "-";
    if (cpu_floor > 0) std::snprintf(ratio, sizeof ratio, "%.3f", cpu_alone / cpu_floor);
    std::fprintf(
        out, "  %-28s %.3f ms per step, %s (cpu alone / cpu floor; the same cold work, no GPU)\n",
        "cpu alone", cpu_alone, ratio);
  } else {
    std::fprintf(out, "  %-28s - (no cold experts)\n", "cpu alone");
  }
  if (alone_ran && cpu_floor > 0) {
    const double hand_off = hybrid - cpu_alone, below_roof = cpu_alone - cpu_floor;
    std::fprintf(out,
                 "  %-28s hand-off %.3f ms per step (%.1f us a layer), executor below the roof "
                 "%.3f ms per step (%.1f us a layer)\n",
                 "hybrid over the cpu floor", hand_off, hand_off * us_per_layer, below_roof,
                 below_roof * us_per_layer);
    std::fprintf(
        out,
        "  %-28s service %.3f ms per step (mean), %.3f over the cpu alone (%.1f us a layer); "
        "outside the service %.3f ms per step (%.1f us a layer)\n",
        "hand-off split", service, service - cpu_alone, (service - cpu_alone) * us_per_layer,
        hybrid - service, (hybrid - service) * us_per_layer);
  } else {
    std::fprintf(out, "  %-28s -\n", "hybrid over the cpu floor");
  }
  std::fprintf(out,
               "  %-28s %.1f%% of selections; %.1f MB resident, %.1f MB cold weights read a step\n",
               "resident hits", hit * 100.0, resident_bytes * 1e-6, cold_bytes * 1e-6);
  const double promotions = g.scheduled_promotions / steps;
  if (options.cache != 0) {
    std::fprintf(out,
                 "  %-28s %s, budget %u, margin %g: %.2f experts promoted a step (%.1f MB copied "
                 "on the copy stream; each step's time includes its residency updates, %.3f ms "
                 "of them on the host before the launch)\n",
                 "expert cache", cache_policy_name(options.cache), options.cache_budget,
                 double(options.cache_margin), promotions, promotions * expert * 1e-6,
                 median(g.update_host_ms));
  }
  if (options.pin_host_experts) {
    std::fprintf(out, "  %-28s page-locked (cudaHostRegister, %.2f s)\n", "host experts",
                 g.pin_seconds);
  } else {
    std::fprintf(out, "  %-28s pageable\n", "host experts");
  }
  std::fprintf(
      out, "  %-28s %.2f wakeups, %.2f requests, %.2f short circuits, %.0f host bytes per step\n",
      "offload per step", wakeups, published, shorted, host_bytes);
  std::fprintf(out, "  %-28s %s: %s\n", "telemetry conservation", g.conserved ? "holds" : "FAILS",
               g.conservation.c_str());
  std::fprintf(out, "  %-28s %s\n", "expert counts (device)",
               g.counts_match ? "the last step's routing, both graphs" : "DIFFER from the routing");
  std::fprintf(out, "  %-28s %.1f s\n", "total", total_s);
  std::fflush(out);
  if (!options.json) return;
  std::printf(
      "{\"command\": \"run\", \"mode\": \"gpu\", \"library_version\": \"%s\", \"device\": \"%s\",\n"
      " \"cpu\": \"%s\", \"tier\": \"%s\", \"threads\": %u, \"accuracy\": \"%s\",\n"
      " \"model\": {\"name\": \"%s\", \"layers\": %u, \"experts\": %u, \"top_k\": %u, "
      "\"hidden\": %u, "
      "\"intermediate\": %u, \"format\": \"%s\", \"bytes_per_expert\": %.0f},\n"
      " \"decode\": {\"steps\": %u, \"batch\": %u, \"seed\": %" PRIu64
      ", \"routing\": \"%s\", \"residency\": %.4f, \"resident_per_layer\": %u, \"cache\": "
      "\"%s\", \"cache_budget\": %u, \"cache_margin\": %.9g, \"promotions_per_step\": %.4f, "
      "\"update_host_ms_per_step\": %.4f, "
      "\"host_experts\": \"%s\"},\n"
      " \"hybrid_ms_per_step\": %.4f, \"hybrid_ms_per_token\": %.4f, \"hybrid_wall_ms_per_step\": "
      "%.4f,\n"
      " \"resident_only_ms_per_step\": %.4f, \"cpu_floor_ms_per_step\": %.4f, \"cpu_read_gbps\": "
      "%.3f,\n"
      " \"cpu_read_gbps_buffer_before\": %.3f, \"cpu_read_gbps_weights\": %.3f, "
      "\"cpu_read_gbps_buffer_after\": %.3f,\n"
      " \"over_cpu_floor\": %.4f, \"over_resident_only\": %.4f, \"resident_hit_rate\": %.4f,\n"
      " \"cpu_alone_ms_per_step\": %s, \"over_cpu_alone\": %s, \"cpu_alone_over_cpu_floor\": %s,\n"
      " \"service_ms_per_step\": %.4f,\n"
      " \"cold_bytes_per_step\": %.0f, \"resident_bytes_per_step\": %.0f,\n"
      " \"wakeups_per_step\": %.3f, \"requests_per_step\": %.3f, \"short_circuits_per_step\": "
      "%.3f, "
      "\"host_bytes_per_step\": %.0f,\n"
      " \"conservation\": %s, \"expert_counts_match\": %s, \"checksum\": \"%016" PRIx64
      "\", \"finite\": %s}\n",
      qmoe_version_string(), json_escape(g.device_name.c_str()).c_str(),
      json_escape(run.host.cpu_brand).c_str(), qmoe_isa_name(run.tier), run.threads,
      accuracy_name(options.accuracy), options.shape.model, options.shape.layers,
      options.shape.experts, options.shape.top_k, options.shape.hidden, options.shape.intermediate,
      run_format(options.shape.format).name, expert, options.tokens, options.batch, options.seed,
      routing_name(options.routing), options.residency, g.resident_per_layer,
      cache_policy_name(options.cache), options.cache_budget, double(options.cache_margin),
      promotions, median(g.update_host_ms), options.pin_host_experts ? "pinned" : "pageable",
      hybrid, hybrid / M, wall, resident, cpu_floor, roof * 1e-9, bandwidth.reference * 1e-9,
      bandwidth.weights * 1e-9, bandwidth.reference_after * 1e-9,
      cpu_floor > 0 ? hybrid / cpu_floor : 0.0, resident > 0 ? hybrid / resident : 0.0, hit,
      json_number(alone_ran, "%.4f", cpu_alone).c_str(),
      json_number(alone_ran && cpu_alone > 0, "%.4f", hybrid / cpu_alone).c_str(),
      json_number(alone_ran && cpu_floor > 0, "%.4f", cpu_alone / cpu_floor).c_str(), service,
      cold_bytes, resident_bytes, wakeups, published, shorted, host_bytes,
      g.conserved ? "true" : "false", g.counts_match ? "true" : "false", g.checksum,
      g.finite ? "true" : "false");
}
