#include "lib/offload/host_device.h"

#include <cstdlib>
#include <new>

#include "lib/cpu/kernels.h"

namespace qmoe::offload {

uint32_t HostCta::threads() const {
  return grid_->threads();
}

void HostCta::sync() {
  grid_->barrier(0, false);
}

int HostCta::sync_count(int predicate) {
  return grid_->barrier(predicate, true);
}

int HostCta::sync_or(int predicate) {
  return grid_->barrier(predicate, true) != 0 ? 1 : 0;
}

// Elements by memcpy: the scalar conversion kernels are the library's reference rounding.
float HostCta::load_element(uint32_t dtype, const void* p, uint64_t i) {
  float v = 0.0f;
  if (dtype == QMOE_DTYPE_F32) {
    std::memcpy(&v, static_cast<const float*>(p) + i, sizeof v);
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(p) + i;
    if (dtype == QMOE_DTYPE_F16) {
      scalar::convert_f16_to_f32(h, &v, 1);
    } else {
      scalar::convert_bf16_to_f32(h, &v, 1);
    }
  }
  return v;
}

void HostCta::store_element(uint32_t dtype, void* p, uint64_t i, float v) {
  if (dtype == QMOE_DTYPE_F32) {
    std::memcpy(static_cast<float*>(p) + i, &v, sizeof v);
  } else if (dtype == QMOE_DTYPE_F16) {
    scalar::convert_f32_to_f16(&v, static_cast<uint16_t*>(p) + i, 1);
  } else {
    scalar::convert_f32_to_bf16(&v, static_cast<uint16_t*>(p) + i, 1);
  }
}

HostGrid::HostGrid(uint32_t threads) : threads_(threads < 1 ? 1 : threads) {
  try {
    workers_.reserve(threads_);
    for (uint32_t t = 0; t < threads_; ++t) workers_.emplace_back([this, t] { worker(t); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& w : workers_) w.join();
    throw;
  }
}

HostGrid::~HostGrid() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void HostGrid::run(uint32_t blocks, const std::function<void(HostCta&)>& body) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    blocks_ = blocks;
    finished_ = 0;
    ++launch_;
  }
  start_.notify_all();
  std::unique_lock<std::mutex> lock(mutex_);
  finish_.wait(lock, [&] { return finished_ == threads_; });
  body_ = nullptr;
}

void HostGrid::worker(uint32_t thread) {
  HostCta cta(this, thread);
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(HostCta&)>* body = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stop_ || launch_ != seen; });
      if (stop_) return;
      seen = launch_;
      body = body_;
      cta.blocks_ = blocks_;
    }
    for (uint32_t b = 0; b < cta.blocks_; ++b) {
      cta.block_ = b;
      (*body)(cta);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (++finished_ == threads_) finish_.notify_all();
  }
}

// A generation barrier that also counts the threads with a nonzero value; the count is read
// under the lock by every thread before any of them can reach the next barrier.
int HostGrid::barrier(int value, bool count) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (count && value != 0) ++barrier_accumulator_;
  const uint64_t generation = barrier_generation_;
  if (++barrier_arrived_ == threads_) {
    barrier_result_ = barrier_accumulator_;
    barrier_accumulator_ = 0;
    barrier_arrived_ = 0;
    ++barrier_generation_;
    barrier_cv_.notify_all();
    return barrier_result_;
  }
  barrier_cv_.wait(lock, [&] { return barrier_generation_ != generation; });
  return barrier_result_;
}

HostDevice::HostDevice(const Options& options)
    : options_(options), layout_(make_ring_layout(options.geometry)), grid_(options.threads) {
  const size_t bytes = align_up(layout_.total_bytes, kLineBytes);
  ring_ = static_cast<unsigned char*>(std::aligned_alloc(kLineBytes, bytes));
  if (ring_ == nullptr) throw std::bad_alloc();
  std::memset(ring_, 0, bytes);
  state_.next_seq = 1;
  const uint32_t records = options.num_records < 1 ? 1 : options.num_records;
  records_.assign(records, OffloadCallRecord{});
  token_cold_.assign(size_t{records} * options.geometry.m_capacity, 0);
}

HostDevice::~HostDevice() {
  std::free(ring_);
}

void HostDevice::classify_publish(const HostLayerCall& call) {
  ClassifyArgs a{};
  a.state = &state_;
  a.record = &records_[call.layer];
  a.token_cold = token_cold_.data() + size_t{call.layer} * layout_.geometry.m_capacity;
  a.ring = ring_;
  a.layout = layout_;
  a.m = call.m;
  a.ids = call.ids;
  a.weights = call.weights;
  a.residency = call.residency;
  a.x = call.x;
  a.ldx = call.ldx;
  a.layer = call.layer;
  a.m_capacity = call.m_capacity;
  a.k = call.k;
  a.num_experts = call.num_experts;
  a.num_slots = call.num_slots;
  a.dtype = static_cast<uint32_t>(call.dtype);
  a.accuracy = static_cast<uint32_t>(call.accuracy);
  a.short_circuit = options_.short_circuit ? 1 : 0;
  grid_.launch<ClassifyShared>(
      1, [&](HostCta& cta, ClassifyShared& sh) { offload::classify_publish(cta, sh, a); });
}

void HostDevice::wait_accumulate(const HostLayerCall& call) {
  WaitArgs a{};
  a.state = &state_;
  a.record = &records_[call.layer];
  a.token_cold = token_cold_.data() + size_t{call.layer} * layout_.geometry.m_capacity;
  a.ring = ring_;
  a.layout = layout_;
  a.y = call.y;
  a.ldy = call.ldy;
  a.dtype = static_cast<uint32_t>(call.dtype);
  a.timeout_ns = options_.timeout_ns;
  grid_.launch<WaitShared>(
      options_.wait_blocks < 1 ? 1 : options_.wait_blocks,
      [&](HostCta& cta, WaitShared& sh) { offload::wait_accumulate(cta, sh, a); });
}

}  // namespace qmoe::offload
