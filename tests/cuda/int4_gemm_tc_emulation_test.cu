// The tensor-core GEMM's own kernel code (run_cta, lib/cuda/int4_gemm_tc_kernel.cuh) run on the
// host, so that CI, which has no GPU, executes it: every CTA of the grid on as many fibers
// (tests/cuda/host_fibers.h) as the CTA has threads, the warp- and CTA-wide instructions
// emulated as the PTX ISA defines
// them (ldmatrix: lanes 8i..8i+7 address matrix i's rows and lane L gets elements 2 (L % 4), +1
// of row L / 4; mma.m16n8k16: the A, B, C fragment layouts; wgmma m64n128k16: the register A
// and descriptor B layouts, results landing at the wait that retires their group; bar.sync, the
// CTA's and named ones; mbarrier phases with arrivals and transaction bytes; the TMA's 2-D tile
// copy with the 128-byte swizzle and zeros outside the tensor, from the launcher's own
// XTileMap), the wgmma tile (run_cta_wgmma, its producer warpgroup included) as well as the
// mma.sync ones, cp.async and TMA copies landing either at once or only at the wait that covers
// them (cp.async.wait_group; a wait on the mbarrier phase the copy completes) (the earliest and
// the latest the PTX ISA allows: held copies make any read of a stage, X, codes or planes,
// before its wait a wrong value; copies at once can expose a copy into a stage still being
// read), the clusters of a split over K (their CTAs run at once; barrier.cluster counting the
// threads that have not exited; reads of another CTA's shared memory, which must not have
// exited, its memory poisoned when it does), the launch parameters and grid from the
// launcher's own make_params and grid_for. Small
// shapes over every tile, X type, block size, row/column/K tails, column ranges, plane types,
// orders and alignments and the device row count, against the FP64 reference from the X the
// kernel multiplies within the documented bound, with poisoned outputs. The MMA is emulated
// exactly (FP64 sums rounded to FP32), not with the tensor cores' truncation; the device tests
// cover that.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/cuda/int4_gemm_tc_kernel.cuh"
#include "lib/cuda/int4_gemm_wgmma_kernel.cuh"
#include "tests/activation_dtype_util.h"
#include "tests/cuda/host_fibers.h"
#include "tests/cuda/int4_gemm_tc_test_util.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::cuda::tc {
namespace {

using qmoe::testing::Int4Matrix;
using qmoe::testing::Int4Options;
using qmoe::testing::Reference;
using qmoe::testing::ScaleOrder;

using Barrier = qmoe::testing::FiberBarrier;

// One CTA: its shared memory, its barrier and, per warp and per warpgroup, the threads'
// operands of the collective instruction in progress.
struct Cta {
  struct Warp {
    Barrier barrier{32};
    uint32_t address[32];
    uint32_t a[32][4], b[32][2];
  };
  struct WarpGroup {
    Barrier barrier{128};
    uint32_t a[128][4];
    uint64_t desc[128];
    uint32_t n[128];  // the MMA's N, as each thread gave it
  };
  Cta(uint32_t threads, size_t shared_bytes)
      : shared(shared_bytes, 0xA5),
        barrier(threads),
        warps(threads / 32),
        warp_groups((threads + 127) / 128) {}
  // An mbarrier (PTX ISA): arrivals and transaction bytes pending in the current phase, the
  // phases completed, and the TMA copies held until a wait on the phase they complete.
  struct MBarrier {
    struct Copy {
      uint32_t dst;
      std::vector<uint8_t> bytes;
    };
    uint32_t count = 0, pending = 0, phase = 0;
    // Of the pending arrivals, those that cp.async.mbarrier.arrive.noinc defers to the landing of
    // its thread's copies (held in `copies` with the TMA's, their bytes added to tx).
    uint32_t deferred = 0;
    int64_t tx = 0;
    std::vector<Copy> copies;
    // Writes a copy's bytes into `shared`; they count against the phase's transaction bytes.
    void land(const Copy& c, std::vector<uint8_t>& shared) {
      std::memcpy(shared.data() + c.dst, c.bytes.data(), c.bytes.size());
      tx -= static_cast<int64_t>(c.bytes.size());
    }
    void complete_if_done() {
      if (pending == 0 && tx == 0) {
        ++phase;
        pending = count;
      }
    }
  };
  std::vector<uint8_t> shared;
  Barrier barrier;
  std::vector<Warp> warps;
  std::vector<WarpGroup> warp_groups;
  std::map<uint32_t, MBarrier> mbarriers;  // by shared address
  // bar.sync id, threads for ids other than 0, made at first use.
  Barrier& named_barrier(uint32_t id, uint32_t threads) {
    auto it = named.find(id);
    if (it == named.end()) {
      it = named.emplace(id, std::make_pair(threads, Barrier(threads))).first;
    }
    EXPECT_EQ(it->second.first, threads) << "barrier " << id << " used with two thread counts";
    return it->second.second;  // map nodes do not move: the reference stays valid
  }
  std::map<uint32_t, std::pair<uint32_t, Barrier>> named;
  uint32_t running = 0;  // threads that have not exited
};

// The CTAs of one cluster (one CTA without a split over K) and the cluster's barrier.
struct Cluster {
  Cluster(uint32_t ctas, uint32_t threads, size_t shared_bytes) : barrier(ctas * threads) {
    for (uint32_t i = 0; i < ctas; ++i) {
      members.push_back(std::make_unique<Cta>(threads, shared_bytes));
      members.back()->running = threads;
    }
  }
  std::vector<std::unique_ptr<Cta>> members;
  Barrier barrier;  // barrier.cluster: a thread's exit releases a phase that waits for it alone
};

double half_value(bool bf16, uint16_t h) {
  if (bf16) {
    const uint32_t bits = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  __half v;
  std::memcpy(&v, &h, 2);
  return __half2float(v);
}

// When a cp.async lands.
enum class Copies { kAtOnce, kAtWait };

class ThreadEmulator : public ptx::HostEmulator {
 public:
  ThreadEmulator(Cluster* cluster, uint32_t rank, uint32_t tid, Copies copies)
      : cluster_(cluster),
        cta_(cluster->members[rank].get()),
        lane_(tid % 32),
        in_group_(tid % 128),
        warp_(cta_->warps[tid / 32]),
        group_(cta_->warp_groups[tid / 128]),
        copies_(copies) {}
  ~ThreadEmulator() override {
    EXPECT_TRUE(open_.empty() && groups_.empty()) << "cp.async left pending at the kernel's end";
    EXPECT_TRUE(mma_open_.empty() && mma_groups_.empty())
        << "wgmma left in flight at the kernel's end";
  }
  uint8_t* shared_memory() override { return cta_->shared.data(); }
  void cta_barrier() override { cta_->barrier.wait(); }
  void cluster_barrier() override { cluster_->barrier.wait(); }
  // ld.shared::cluster of CTA `rank`'s shared memory, which must still be running.
  void cluster_load_f32x2(uint32_t address, uint32_t rank, float (&v)[2]) override {
    EXPECT_EQ(address % 8, 0u) << "ld.shared::cluster.v2.f32 not 8-byte aligned";
    if (rank >= cluster_->members.size()) {
      ADD_FAILURE() << "rank " << rank << " outside the cluster";
      return;
    }
    const Cta& target = *cluster_->members[rank];
    EXPECT_GT(target.running, 0u) << "read of an exited CTA's shared memory";
    EXPECT_LE(address + 8, target.shared.size());
    std::memcpy(v, target.shared.data() + address, 8);
  }
  void named_barrier(uint32_t id, uint32_t threads) override {
    EXPECT_NE(id, 0u) << "barrier 0 is the CTA's";
    EXPECT_EQ(threads % 32, 0u);
    cta_->named_barrier(id, threads).wait();
  }

  void cp_async(uint32_t dst, const void* src, uint32_t cp_size, uint32_t src_bytes) override {
    EXPECT_EQ(dst % cp_size, 0u) << "cp.async destination not aligned to its size";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(src) % cp_size, 0u) << "cp.async source not aligned";
    EXPECT_LE(src_bytes, cp_size);
    EXPECT_LE(dst + cp_size, cta_->shared.size());
    if (copies_ == Copies::kAtOnce) {
      ptx::HostEmulator::cp_async(dst, src, cp_size, src_bytes);
      return;
    }
    // The source bytes are read now (global memory does not change during the kernel), the
    // shared bytes written at the wait.
    Copy c{dst, cp_size, {}};
    c.bytes.assign(cp_size, 0);
    if (src_bytes != 0) std::memcpy(c.bytes.data(), src, src_bytes);
    open_.push_back(std::move(c));
  }
  void cp_async_commit() override {
    groups_.push_back(std::move(open_));
    open_.clear();
  }
  void cp_async_wait(int pending) override {
    while (groups_.size() > static_cast<size_t>(pending)) {
      for (const Copy& c : groups_.front()) {
        std::memcpy(cta_->shared.data() + c.dst, c.bytes.data(), c.size);
      }
      groups_.pop_front();
    }
  }

  void mbarrier_init(uint32_t bar, uint32_t count) override {
    EXPECT_EQ(bar % 8, 0u) << "mbarrier not 8-byte aligned";
    EXPECT_LE(bar + 8, cta_->shared.size());
    Cta::MBarrier& b = cta_->mbarriers[bar];
    b = Cta::MBarrier{};
    b.count = b.pending = count;
    changed();
  }
  void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) override { arrive(bar, bytes); }
  void mbarrier_arrive(uint32_t bar) override { arrive(bar, 0); }
  // true once the phase of this parity has completed. Held copies land when a thread waits for
  // the phase they complete (the current one) and every arrival is in; a wait for the other
  // parity (a phase already complete) lands nothing.
  bool mbarrier_try_wait_parity(uint32_t bar, uint32_t parity) override {
    Cta::MBarrier& b = known_mbarrier(bar);
    if ((b.phase & 1u) == parity && b.pending == b.deferred &&
        (!b.copies.empty() || b.deferred != 0)) {
      for (const Cta::MBarrier::Copy& c : b.copies) b.land(c, cta_->shared);
      b.copies.clear();
      b.pending -= b.deferred;  // the deferred arrivals, now that their copies have landed
      b.deferred = 0;
      EXPECT_GE(b.tx, 0) << "more bytes landed than the phase expected";
      b.complete_if_done();
      changed();
    }
    if ((b.phase & 1u) != parity) return true;
    // Not yet: another thread still has to arrive or issue the copy (the other fibers run
    // before this one polls again). A phase that never completes is a kernel bug: the fibers
    // abort once a round of polls finds no barrier changed (every change calls changed()).
    qmoe::testing::tl_fiber_block->yield();
    return false;
  }
  // cp.async.mbarrier.arrive.noinc: one of the barrier's arrivals, made when every cp.async this
  // thread has issued has landed. Copies at once have; held ones move to the barrier and land,
  // with the arrival, when a thread waits for the phase and every other arrival is in (the
  // latest the PTX ISA allows), so that a read of a code before that sees stale bytes.
  void cp_async_mbarrier_arrive_noinc(uint32_t bar) override {
    std::vector<Copy> held = std::move(open_);
    open_.clear();
    for (std::vector<Copy>& group : groups_) {
      for (Copy& c : group) held.push_back(std::move(c));
    }
    groups_.clear();
    Cta::MBarrier& b = known_mbarrier(bar);
    EXPECT_GT(b.pending, b.deferred) << "arrival on a barrier with none pending";
    changed();
    if (copies_ == Copies::kAtOnce) {
      EXPECT_TRUE(held.empty());
      --b.pending;
      b.complete_if_done();
      return;
    }
    for (Copy& c : held) {
      b.tx += c.size;
      b.copies.push_back({c.dst, std::move(c.bytes)});
    }
    ++b.deferred;
  }
  // cp.async.bulk.tensor.2d ... .tile with the map of x_tile_map (the test stores its XTileMap in
  // the CUtensorMap's bytes): box (c0, c1) of box_k x box_rows 16-bit elements, zeros outside
  // the tensor, row r's 16-byte unit u at dst + 128 r + 16 u, then XORed with bits 7-9 of that
  // address (the 128-byte swizzle, as the wgmma descriptor reads it).
  void tma_load_2d(uint32_t dst, const void* tensor_map, int32_t c0, int32_t c1,
                   uint32_t bar) override {
    XTileMap m;
    std::memcpy(&m, tensor_map, sizeof m);
    EXPECT_EQ(dst % 1024, 0u) << "swizzled TMA destination not 1024-byte aligned";
    EXPECT_EQ(m.box_k * 2, 128u) << "a swizzled box row is not 128 bytes";
    EXPECT_EQ(m.row_bytes % 16, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.base) % 16, 0u);
    EXPECT_LE(dst + m.box_rows * 128, cta_->shared.size());
    Cta::MBarrier::Copy c{dst, std::vector<uint8_t>(size_t{m.box_rows} * 128, 0)};
    for (uint32_t r = 0; r < m.box_rows; ++r) {
      for (uint32_t e = 0; e < m.box_k; ++e) {
        const uint64_t k = static_cast<uint64_t>(c0) + e, row = static_cast<uint64_t>(c1) + r;
        uint16_t v = 0;
        if (k < m.k && row < m.rows) {
          std::memcpy(&v, static_cast<const uint8_t*>(m.base) + row * m.row_bytes + 2 * k, 2);
        }
        const uint32_t plain = dst + 128 * r + 2 * e;
        const uint32_t address = plain ^ (((plain >> 7) & 7u) << 4);
        std::memcpy(c.bytes.data() + (address - dst), &v, 2);
      }
    }
    Cta::MBarrier& b = known_mbarrier(bar);
    changed();
    if (copies_ == Copies::kAtOnce) {
      b.land(c, cta_->shared);
      b.complete_if_done();
    } else {
      b.copies.push_back(std::move(c));
    }
  }

  void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) override {
    warp_.address[lane_] = address;
    warp_.barrier.wait();
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t row = warp_.address[8 * i + lane_ / 4];
      EXPECT_EQ(row % 16, 0u) << "ldmatrix row address not 16-byte aligned";
      EXPECT_LE(row + 16, cta_->shared.size());
      std::memcpy(&r[i], cta_->shared.data() + row + 4 * (lane_ % 4), 4);
    }
    warp_.barrier.wait();  // the addresses stay until every lane has read
  }

  void mma_16816(bool bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                 const float (&c)[4]) override {
    for (uint32_t i = 0; i < 4; ++i) warp_.a[lane_][i] = a[i];
    warp_.b[lane_][0] = b0;
    warp_.b[lane_][1] = b1;
    warp_.barrier.wait();
    // A[r][k] is element k % 2 of register (k / 8) * 2 + r / 8 of lane 4 (r % 8) + (k % 8) / 2;
    // B[k][n] element k % 2 of register k / 8 of lane 4 n + (k % 8) / 2; this lane's C/D
    // elements are (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
    float out[4];
    for (uint32_t e = 0; e < 4; ++e) {
      const uint32_t r = lane_ / 4 + (e / 2) * 8, n = (lane_ % 4) * 2 + e % 2;
      double sum = c[e];
      for (uint32_t k = 0; k < 16; ++k) {
        const uint32_t a_reg = warp_.a[4 * (r % 8) + (k % 8) / 2][(k / 8) * 2 + r / 8];
        const uint32_t b_reg = warp_.b[4 * n + (k % 8) / 2][k / 8];
        sum += half_value(bf16, static_cast<uint16_t>(a_reg >> (16 * (k % 2)))) *
               half_value(bf16, static_cast<uint16_t>(b_reg >> (16 * (k % 2))));
      }
      out[e] = static_cast<float>(sum);
    }
    warp_.barrier.wait();  // the operands stay until every lane has read
    for (uint32_t e = 0; e < 4; ++e) d[e] = out[e];
  }

  // wgmma.mma_async m64nNk16 (N = 128 or 256) with A from registers and B through a K-major,
  // 128-byte-swizzled descriptor (PTX ISA: the descriptor's start address, stride byte offset
  // and swizzle mode; an element's address is formed unswizzled, start + (n / 8) * stride +
  // (n % 8) * 128 + 2 k, and its 16-byte unit then XORed with bits 7-9 of that address).
  // A[r][k] is element k % 2 of register (k / 8) * 2 + (r % 16) / 8 of thread
  // 32 (r / 16) + 4 (r % 8) + (k % 8) / 2; this thread's D elements are
  // d[4i + e] = D[16w + g + 8 (e / 2)][8i + 2t + e % 2], i < N / 8. The result is held until the
  // wgmma_wait that retires its group (the latest the PTX ISA allows), so a read of d before that
  // wait sees the old values; an MMA that accumulates into a d with an MMA still pending chains
  // on that MMA's result.
  void wgmma_m64k16(bool bf16, uint32_t n_size, float* d, const uint32_t (&a)[4], uint64_t desc,
                    bool accumulate) override {
    EXPECT_TRUE(n_size == 128 || n_size == 256) << "no wgmma m64n" << n_size << "k16 here";
    for (uint32_t i = 0; i < 4; ++i) group_.a[in_group_][i] = a[i];
    group_.desc[in_group_] = desc;
    group_.n[in_group_] = n_size;
    group_.barrier.wait();
    EXPECT_EQ(group_.desc[0], desc) << "wgmma descriptors differ across the warpgroup";
    EXPECT_EQ(group_.n[0], n_size) << "wgmma shapes differ across the warpgroup";
    const uint32_t start = static_cast<uint32_t>(desc & 0x3FFFu) << 4;
    const uint32_t stride = static_cast<uint32_t>((desc >> 32) & 0x3FFFu) << 4;
    EXPECT_EQ(desc >> 62, 1u) << "not the 128-byte swizzle";
    EXPECT_EQ((desc >> 49) & 7u, 0u) << "nonzero base offset";
    EXPECT_EQ(stride, 1024u);
    const uint32_t w = in_group_ / 32, g = lane_ / 4, t = lane_ % 4;
    const uint32_t count = n_size / 2;
    std::vector<float> out(count);
    for (uint32_t e = 0; e < count; ++e) {
      const uint32_t r = 16 * w + g + 8 * ((e / 2) % 2), n = 8 * (e / 4) + 2 * t + e % 2;
      double sum = 0.0;
      for (uint32_t k = 0; k < 16; ++k) {
        const uint32_t a_reg =
            group_.a[32 * (r / 16) + 4 * (r % 8) + (k % 8) / 2][(k / 8) * 2 + (r % 16) / 8];
        const uint32_t plain = start + (n / 8) * stride + (n % 8) * 128 + 2 * k;
        const uint32_t address = plain ^ (((plain >> 7) & 7u) << 4);
        EXPECT_LE(address + 2, cta_->shared.size());
        uint16_t b;
        std::memcpy(&b, cta_->shared.data() + address, 2);
        sum +=
            half_value(bf16, static_cast<uint16_t>(a_reg >> (16 * (k % 2)))) * half_value(bf16, b);
      }
      out[e] = static_cast<float>(sum);
    }
    group_.barrier.wait();  // the operands stay until every thread has read
    const std::vector<float>* base = pending_result(d);
    EXPECT_TRUE(base == nullptr || base->size() == count) << "accumulators change shape";
    for (uint32_t e = 0; e < count; ++e) {
      if (accumulate) out[e] += base != nullptr ? (*base)[e] : d[e];
    }
    mma_open_.push_back({d, std::move(out)});
  }
  void wgmma_commit() override {
    mma_groups_.push_back(std::move(mma_open_));
    mma_open_.clear();
  }
  void wgmma_wait(int pending) override {
    EXPECT_TRUE(mma_open_.empty()) << "wgmma issued but not committed before a wait";
    while (mma_groups_.size() > static_cast<size_t>(pending)) {
      for (const MmaResult& r : mma_groups_.front()) {
        std::memcpy(r.d, r.values.data(), r.values.size() * 4);
      }
      mma_groups_.pop_front();
    }
  }

 private:
  struct Copy {
    uint32_t dst, size;
    std::vector<uint8_t> bytes;
  };
  struct MmaResult {
    float* d;
    std::vector<float> values;
  };
  // One arrival on the barrier at `bar`, adding `bytes` to its phase's transaction bytes first.
  void arrive(uint32_t bar, uint32_t bytes) {
    Cta::MBarrier& b = known_mbarrier(bar);
    EXPECT_GT(b.pending, b.deferred) << "arrival on a barrier with none pending";
    b.tx += bytes;
    --b.pending;
    b.complete_if_done();
    changed();
  }
  // An mbarrier's state (what mbarrier_try_wait_parity reads) has changed: the polling fibers
  // get another round.
  static void changed() { qmoe::testing::tl_fiber_block->note_progress(); }
  // The barrier at `bar`, which must have been initialised.
  Cta::MBarrier& known_mbarrier(uint32_t bar) {
    auto it = cta_->mbarriers.find(bar);
    if (it == cta_->mbarriers.end()) {
      ADD_FAILURE() << "mbarrier at " << bar << " used before its init";
      std::abort();
    }
    return it->second;
  }
  // The newest pending result for the accumulators at d, if any.
  const std::vector<float>* pending_result(const float* d) const {
    for (auto r = mma_open_.rbegin(); r != mma_open_.rend(); ++r) {
      if (r->d == d) return &r->values;
    }
    for (auto group = mma_groups_.rbegin(); group != mma_groups_.rend(); ++group) {
      for (auto r = group->rbegin(); r != group->rend(); ++r) {
        if (r->d == d) return &r->values;
      }
    }
    return nullptr;
  }
  Cluster* cluster_;
  Cta* cta_;
  uint32_t lane_, in_group_;
  Cta::Warp& warp_;
  Cta::WarpGroup& group_;
  Copies copies_;
  std::vector<Copy> open_;                // issued, not yet committed
  std::deque<std::vector<Copy>> groups_;  // committed, oldest first, not yet landed
  std::vector<MmaResult> mma_open_;
  std::deque<std::vector<MmaResult>> mma_groups_;
};

// Runs every cluster of the grid, one after the other, its grid.z CTAs (the cluster along z of
// a split over K) at once, each on `threads` fibers running
// run_one(shared memory, bx, by, bz, tid); clusters start with the first thread of the first
// CTA and with the last thread of the last CTA in turn, alternating from grid to grid too (so
// a one-cluster grid runs both orders; host_fibers.h: the schedule). When a
// CTA's last thread exits, its shared memory is poisoned (0xFF bytes, NaN floats), so that a
// read of it after that gives a wrong result.
template <class RunCta>
void emulate_grid(uint32_t threads_per_cta, size_t shared_bytes, dim3 grid, Copies copies,
                  const RunCta& run_one) {
  static uint64_t grids = 0;  // emulated so far: the parity of the first cluster's order
  uint64_t cluster_index = grids++;
  for (uint32_t by = 0; by < grid.y; ++by) {
    for (uint32_t bx = 0; bx < grid.x; ++bx) {
      Cluster cluster(grid.z, threads_per_cta, shared_bytes);
      // Fiber f is thread f % threads_per_cta of CTA f / threads_per_cta; each resumed fiber
      // finds its own emulator (ptx::host_emulator is per OS thread).
      std::vector<ThreadEmulator*> emulators(size_t{grid.z} * threads_per_cta, nullptr);
      struct Run {
        Cluster* cluster;
        std::vector<ThreadEmulator*>* emulators;
        const RunCta* run_one;
        uint32_t threads_per_cta, bx, by;
        Copies copies;
      } run{&cluster, &emulators, &run_one, threads_per_cta, bx, by, copies};
      auto switch_in = [](void* p, uint32_t f) {
        ptx::host_emulator = (*static_cast<Run*>(p)->emulators)[f];
      };
      auto body = [](void* p, uint32_t f) {
        Run& r = *static_cast<Run*>(p);
        const uint32_t bz = f / r.threads_per_cta, tid = f % r.threads_per_cta;
        Cta& cta = *r.cluster->members[bz];
        {
          ThreadEmulator emulator(r.cluster, bz, tid, r.copies);
          (*r.emulators)[f] = &emulator;
          ptx::host_emulator = &emulator;
          (*r.run_one)(cta.shared.data(), r.bx, r.by, bz, tid);
          ptx::host_emulator = nullptr;
          (*r.emulators)[f] = nullptr;
        }
        if (--cta.running == 0) std::fill(cta.shared.begin(), cta.shared.end(), 0xFF);
        r.cluster->barrier.leave();
      };
      qmoe::testing::FiberBlock::run(grid.z * threads_per_cta,
                                     /*highest_first=*/cluster_index++ % 2 == 1, body, switch_in,
                                     &run);
    }
  }
}

template <int kTile, XMode kX, uint32_t kFold>
void emulate(const Params& p, dim3 grid, Copies copies) {
  using C = Config<kTile, kX, kFold>;
  emulate_grid(C::kThreads, C::kSharedBytes, grid, copies,
               [&](uint8_t* smem, uint32_t bx, uint32_t by, uint32_t /*bz*/, uint32_t tid) {
                 run_cta<C, kX>(p, smem, bx, by, tid);
               });
}

// The same for a wgmma tile (16-bit X; scaled weights with BF16 X).
template <int kTile, XMode kX, uint32_t kFold, bool kScaled = false>
void emulate_wgmma(const Params& p, dim3 grid, Copies copies) {
  if constexpr (kX == XMode::kF32Split || (kScaled && kX != XMode::kBf16)) {
    ADD_FAILURE() << "the wgmma tiles take 16-bit X, scaled weights BF16 X";
  } else {
    using C = WgmmaConfig<kTile, kX, kFold, kScaled>;
    // The launcher's own description of the X tensor, where the device holds its encoded map.
    const XTileMap description = x_tile_map(p, C::kBM);
    static_assert(sizeof(XTileMap) <= sizeof(CUtensorMap));
    CUtensorMap map{};
    std::memcpy(&map, &description, sizeof description);
    emulate_grid(C::kCtaThreads, C::kSharedBytes, grid, copies,
                 [&](uint8_t* smem, uint32_t bx, uint32_t by, uint32_t bz, uint32_t tid) {
                   run_cta_wgmma<C, kX>(p, &map, smem, bx, by, bz, tid);
                 });
  }
}

template <XMode kX, uint32_t kFold>
void emulate_tile(int tile, const Params& p, dim3 grid, Copies copies, bool scaled) {
  if (scaled) {
    switch (tile) {
      case 4:
        return emulate_wgmma<4, kX, kFold, true>(p, grid, copies);
      case 5:
        return emulate_wgmma<5, kX, kFold, true>(p, grid, copies);
      case 6:
        return emulate_wgmma<6, kX, kFold, true>(p, grid, copies);
      case 7:
        return emulate_wgmma<7, kX, kFold, true>(p, grid, copies);
      default:
        ADD_FAILURE() << "scaled weights on an mma.sync tile";
        return;
    }
  }
  switch (tile) {
    case 0:
      return emulate<0, kX, kFold>(p, grid, copies);
    case 1:
      return emulate<1, kX, kFold>(p, grid, copies);
    case 2:
      return emulate<2, kX, kFold>(p, grid, copies);
    case 3:
      return emulate<3, kX, kFold>(p, grid, copies);
    case 4:
      return emulate_wgmma<4, kX, kFold>(p, grid, copies);
    case 5:
      return emulate_wgmma<5, kX, kFold>(p, grid, copies);
    case 6:
      return emulate_wgmma<6, kX, kFold>(p, grid, copies);
    default:
      ADD_FAILURE() << "tile " << tile << " runs scaled weights only";
      return;
  }
}

// As the launcher does for the tile, X type and level (scaled weights where
// int4_gemm_tc_scaled_weights says).
void emulate_launch(int tile, qmoe_dtype xd, qmoe_accuracy accuracy, const Params& p,
                    Copies copies) {
  const dim3 grid = grid_for(static_cast<Int4GemmTcTile>(tile), p);
  const bool fold16 = fold_k(p.w.block_size) == 16;
  const bool scaled =
      int4_gemm_tc_scaled_weights(static_cast<Int4GemmTcTile>(tile), accuracy, xd, p.w.scale_dtype);
  switch (xd) {
    case QMOE_DTYPE_BF16:
      return fold16 ? emulate_tile<XMode::kBf16, 16>(tile, p, grid, copies, scaled)
                    : emulate_tile<XMode::kBf16, 32>(tile, p, grid, copies, scaled);
    case QMOE_DTYPE_F16:
      return fold16 ? emulate_tile<XMode::kF16, 16>(tile, p, grid, copies, false)
                    : emulate_tile<XMode::kF16, 32>(tile, p, grid, copies, false);
    case QMOE_DTYPE_F32:
      break;
  }
  return fold16 ? emulate_tile<XMode::kF32Split, 16>(tile, p, grid, copies, false)
                : emulate_tile<XMode::kF32Split, 32>(tile, p, grid, copies, false);
}

struct Case {
  Int4Options w;
  uint32_t m = 17;
  uint32_t n_begin = 0, n_end = 0;  // n_end 0: all columns
  qmoe_dtype xd = QMOE_DTYPE_BF16, yd = QMOE_DTYPE_F32;
  int tile = 0;
  uint32_t device_rows = UINT32_MAX;  // below m: the row count read through m_device
  Copies copies = Copies::kAtWait;
  uint32_t scale_offset = 0;  // bytes: the scale plane placed this far into its buffer
  qmoe_accuracy accuracy = QMOE_ACCURACY_EXACT;
  uint32_t k_splits = 1;  // CTAs of a cluster on each output tile (wgmma tiles)
  // Y's rows a multiple of 16 bytes apart (the wgmma epilogue's 16-byte stores), else an odd
  // number of elements (pairs and single stores).
  bool aligned_y = false;
};

void run_case(const Case& c, uint64_t seed) {
  using namespace qmoe::testing;
  const std::string where =
      c.w.describe() + " m=" + std::to_string(c.m) + " cols [" + std::to_string(c.n_begin) + "," +
      std::to_string(c.n_end) + ") x " + dtype_name(c.xd) + " y " + dtype_name(c.yd) + " tile " +
      std::to_string(c.tile) + " device rows " + std::to_string(c.device_rows) +
      (c.copies == Copies::kAtOnce ? " copies at once" : " copies at wait") + " scale offset " +
      std::to_string(c.scale_offset) + (c.accuracy == QMOE_ACCURACY_FAST ? " fast" : " exact") +
      " k splits " + std::to_string(c.k_splits) + " seed " + std::to_string(seed);
  SCOPED_TRACE(where);
  ContextPtr ctx = default_context();
  std::mt19937_64 rng(seed);
  const Int4Matrix w = make_int4_matrix(c.w, rng);
  const uint32_t n = c.w.n, k = c.w.k, m = c.m;
  const uint32_t n_begin = c.n_begin, n_end = c.n_end == 0 ? n : c.n_end;
  const size_t ldx = k + 8, ldy = c.aligned_y ? (n + 7) / 8 * 8 + 8 : n + 3;
  const std::vector<float> x_values = random_activations(m, static_cast<uint32_t>(ldx), rng);
  const std::vector<unsigned char> x = narrow(ctx.get(), c.xd, x_values.data(), x_values.size());
  const std::vector<float> x_true = dense_rows(widen(ctx.get(), c.xd, x), m, k, ldx);
  const std::vector<float> x_used =
      c.xd == QMOE_DTYPE_F32 ? split_bf16_sum(ctx.get(), x_true) : x_true;
  const Reference ref = reference_gemm(w, x_used, m);

  // The view the device would get, with host pointers; X copied to a 16-byte aligned buffer.
  DeviceQuantMatrix view{};
  view.n = n;
  view.k = k;
  view.block_size = c.w.block_size;
  view.chunks = (k + 31) / 32;
  view.codes = w.codes.data();
  view.scale_dtype = w.desc.scale_dtype;
  // The plane at scale_offset bytes into a 16-byte aligned buffer (a 16-bit plane at 2 mod 4:
  // the first element's word then starts before the plane).
  std::vector<uint4> scale_buffer((c.scale_offset + w.scales.size() + 15) / 16);
  std::memcpy(reinterpret_cast<uint8_t*>(scale_buffer.data()) + c.scale_offset, w.scales.data(),
              w.scales.size());
  view.scales = reinterpret_cast<const uint8_t*>(scale_buffer.data()) + c.scale_offset;
  view.scale_row_stride = w.desc.scale_row_stride;
  view.scale_block_stride = w.desc.scale_block_stride;
  view.scale_group_stride = w.desc.scale_group_stride;
  view.zero_points = w.desc.zero_points;
  view.zero_point_row_stride = w.desc.zero_point_row_stride;
  view.zero_point_block_stride = w.desc.zero_point_block_stride;
  view.zero_point_group_stride = w.desc.zero_point_group_stride;
  view.bias_dtype = w.desc.bias_dtype;
  view.bias = w.desc.bias;
  std::vector<uint4> x_buffer((x.size() + 15) / 16);
  std::memcpy(x_buffer.data(), x.data(), x.size());
  const size_t es = element_size(c.yd);
  std::vector<unsigned char> y((size_t{m} * ldy + 16) * es, 0xFF);
  const uint32_t device_rows = c.device_rows;
  Params p = make_params(view, m, c.device_rows < m ? &device_rows : nullptr, x_buffer.data(), ldx,
                         c.yd, y.data(), ldy, n_begin, n_end);
  EXPECT_EQ(p.y_octets, c.aligned_y) << "Y's alignment is not the case's";
  ASSERT_TRUE(c.k_splits == 1 || (int4_gemm_tc_tile_is_wgmma(static_cast<Int4GemmTcTile>(c.tile)) &&
                                  c.k_splits <= p.k_tiles && c.k_splits <= kMaxKSplits));
  p.k_splits = c.k_splits;
  emulate_launch(c.tile, c.xd, c.accuracy, p, c.copies);

  const uint32_t rows = c.device_rows < m ? c.device_rows : m;
  const bool scaled = int4_gemm_tc_scaled_weights(static_cast<Int4GemmTcTile>(c.tile), c.accuracy,
                                                  c.xd, c.w.scale_dtype);
  // Scaled weights: against the FP64 reference on the weights as the kernel rounds them, with
  // the accumulation bound alone, and against the exact weights' within the fast bound.
  const Reference ref_scaled = scaled ? scaled_weight_reference(w, x_used, m) : Reference{};
  const double acc_bound = c.accuracy == QMOE_ACCURACY_FAST
                               ? int4_gemm_tc_fast_bound(k)
                               : int4_gemm_tc_accumulation_bound(k, c.w.block_size, c.xd);
  const double scaled_bound = int4_gemm_tc_scaled_accumulation_bound(k);
  int reported = 0;
  for (size_t e = 0; e < y.size() / es; ++e) {
    const size_t i = e / ldy, col = e % ldy;
    const unsigned char* got_bytes = y.data() + e * es;
    if (i < rows && col >= n_begin && col < n_end) {
      const size_t o = i * n + col;
      const double got = element_value(c.yd, got_bytes);
      const double tol = output_tolerance(
          c.yd, ref.y[o], acc_bound * (ref.abs_sum[o] + std::fabs(w.bias_values[col])));
      if (!(std::fabs(got - ref.y[o]) <= tol) && reported++ < 5) {
        ADD_FAILURE() << "y[" << i << "][" << col << "] = " << got << ", FP64 reference "
                      << ref.y[o] << ", bound " << tol;
      }
      if (scaled) {
        const double tol_scaled = output_tolerance(
            c.yd, ref_scaled.y[o],
            scaled_bound * (ref_scaled.abs_sum[o] + std::fabs(w.bias_values[col])));
        if (!(std::fabs(got - ref_scaled.y[o]) <= tol_scaled) && reported++ < 5) {
          ADD_FAILURE() << "y[" << i << "][" << col << "] = " << got
                        << ", FP64 reference on the BF16-rounded weights " << ref_scaled.y[o]
                        << ", bound " << tol_scaled;
        }
      }
    } else {
      for (size_t b = 0; b < es; ++b) {
        if (got_bytes[b] != 0xFF && reported++ < 5) {
          ADD_FAILURE() << "element " << e << " (row " << i << ", col " << col
                        << ") outside the output changed";
          break;
        }
      }
    }
  }
}

const qmoe_dtype kTypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
const ScaleOrder kOrders[] = {ScaleOrder::kGrouped, ScaleOrder::kBlockMajor, ScaleOrder::kRowMajor,
                              ScaleOrder::kPaddedRowMajor};

// The plane variants that case `index` of a sweep takes: the scale order, zero points or not and
// their order, bias or not and its type, each rotating at its own period.
void rotate_planes(int index, Case* c) {
  c->w.scale_order = kOrders[index % 4];
  c->w.zero_points = index % 2 == 0;
  c->w.zero_point_order = kOrders[(index + 1) % 4];
  c->w.bias = index % 3 != 1;
  c->w.bias_dtype = kTypes[index % 3];
}

// Every tile x X type x fold granularity, with N, M and K tails (a 6-row last group, 17 rows,
// a partial last k-tile, for block 16 a half-filled last chunk) and a column range cut inside
// groups; the scale, zero-point and bias variants rotate.
TEST(CudaInt4GemmTcEmulation, EveryTileXTypeAndBlockSize) {
  const uint32_t blocks[] = {16, 32, 128};
  const uint32_t ks[] = {80, 96, 128};
  int index = 0;
  for (int tile = 0; tile < kInt4GemmTcTileCount; ++tile) {
    for (qmoe_dtype xd : {QMOE_DTYPE_BF16, QMOE_DTYPE_F16, QMOE_DTYPE_F32}) {
      const auto t = static_cast<Int4GemmTcTile>(tile);
      if (int4_gemm_tc_tile_is_wgmma(t) && xd == QMOE_DTYPE_F32) continue;      // 16-bit X only
      if (int4_gemm_tc_tile_scaled_only(t) && xd != QMOE_DTYPE_BF16) continue;  // BF16 X only
      for (int b = 0; b < 3; ++b) {
        Case c;
        c.w.n = 46;
        c.w.k = ks[b];
        c.w.block_size = blocks[b];
        // A scaled-weights-only tile: FP16 scales, the fast level.
        c.w.scale_dtype = int4_gemm_tc_tile_scaled_only(t) ? QMOE_DTYPE_F16 : kTypes[index % 3];
        c.accuracy = int4_gemm_tc_tile_scaled_only(t) ? QMOE_ACCURACY_FAST : QMOE_ACCURACY_EXACT;
        c.w.scale_order = kOrders[index % 4];
        c.w.zero_points = index % 2 == 0;
        c.w.zero_point_order = kOrders[(index + 1) % 4];
        c.w.bias = index % 3 != 1;
        c.w.bias_dtype = kTypes[(index + 2) % 3];
        c.m = 17;
        c.n_begin = index % 2 == 0 ? 0 : 3;
        c.n_end = index % 2 == 0 ? 0 : 45;
        c.xd = xd;
        c.yd = kTypes[(index / 2) % 3];
        c.tile = tile;
        c.copies = (index / 2) % 2 == 0 ? Copies::kAtWait : Copies::kAtOnce;
        c.aligned_y = (index / 3) % 2 == 0;
        c.scale_offset = c.w.scale_dtype == QMOE_DTYPE_F32 ? 4 * (index % 2) : 2 * (index % 4);
        ++index;
        ASSERT_NO_FATAL_FAILURE(run_case(c, qmoe::testing::fresh_seed()));
      }
    }
  }
}

// More than one CTA in each direction (rows past the first 64 or 128, columns past the first
// tile) and a k loop that wraps the pipeline's stages more than twice (C::kStages <= 8), on
// the split-K and the plain tile, with copies landing at their waits and at once (for the wgmma
// tiles: their producer warpgroup's publishing past the prologue, and its waits for the consumers'
// release of a stage).
TEST(CudaInt4GemmTcEmulation, SeveralCtasAndALongerK) {
  static_assert(kMaxStages * 2 < 1088 / kTileK);
  for (int tile : {0, 1, 3, 4, 5, 6, 7}) {
    Case c;
    c.w.n = tile == 0 || tile >= 4 ? 136 : 72;
    c.w.k = 1088;  // 17 k-tiles
    c.w.block_size = 64;
    c.w.scale_dtype = QMOE_DTYPE_F16;
    c.w.scale_order = ScaleOrder::kGrouped;
    c.w.zero_points = true;
    c.w.zero_point_order = ScaleOrder::kGrouped;
    c.w.bias = true;
    c.m = tile == 7 ? 260 : tile == 0 || tile >= 4 ? 130 : 70;
    c.xd = QMOE_DTYPE_BF16;
    c.yd = QMOE_DTYPE_BF16;
    c.tile = tile;
    c.accuracy = tile == 7 ? QMOE_ACCURACY_FAST : QMOE_ACCURACY_EXACT;  // scaled weights only
    c.copies = tile == 1 || tile == 6 ? Copies::kAtOnce : Copies::kAtWait;
    c.aligned_y = tile >= 4;
    ASSERT_NO_FATAL_FAILURE(run_case(c, qmoe::testing::fresh_seed()));
  }
}

// The fast level's scaled weights on every wgmma tile (BF16 X, FP16 scales): every fold
// granularity, zero points or not, both copy timings, and a k loop that wraps the stages.
TEST(CudaInt4GemmTcEmulation, ScaledWeightsOnEveryWgmmaTile) {
  int index = 0;
  for (int tile : {4, 5, 6, 7}) {
    for (uint32_t block : {16u, 32u, 128u}) {
      Case c;
      c.w.n = 70;
      c.w.k = block == 128 ? 640 : 96;
      c.w.block_size = block;
      c.w.scale_dtype = QMOE_DTYPE_F16;
      rotate_planes(index, &c);
      c.m = 17;
      c.n_begin = index % 2 == 0 ? 0 : 3;
      c.n_end = index % 2 == 0 ? 0 : 69;
      c.xd = QMOE_DTYPE_BF16;
      c.yd = kTypes[(index / 2) % 3];
      c.tile = tile;
      c.copies = index % 2 == 0 ? Copies::kAtWait : Copies::kAtOnce;
      c.accuracy = QMOE_ACCURACY_FAST;
      c.aligned_y = (index / 3) % 2 == 0;
      ++index;
      ASSERT_NO_FATAL_FAILURE(run_case(c, qmoe::testing::fresh_seed()));
    }
  }
}

// The split over K across a cluster on every wgmma tile: 2 and 3 CTAs a tile, K slices of
// unequal length (7 and 17 k-tiles), row and column tails and a column range, both levels, both
// copy timings; and with the row count read through m_device, a cluster whose rows are all past
// it returns at once and leaves its outputs alone.
TEST(CudaInt4GemmTcEmulation, SplitOverKAcrossACluster) {
  int index = 0;
  for (int tile : {4, 5, 6, 7}) {
    for (uint32_t splits : {2u, 3u}) {
      Case c;
      c.w.n = tile == 5 || tile == 7 ? 136 : 70;
      c.w.k = index % 3 == 2 ? 1088 : 448;
      c.w.block_size = index % 2 == 0 ? 32 : 16;
      c.w.scale_dtype = QMOE_DTYPE_F16;
      rotate_planes(index, &c);
      c.m = index % 2 == 0 ? 17 : 130;
      c.n_begin = index % 2 == 0 ? 0 : 3;
      c.n_end = index % 2 == 0 ? 0 : 69;
      // 256 x 128 runs scaled weights only: BF16 X, the fast level, rows past its first 256.
      c.xd = index % 3 == 1 && tile != 7 ? QMOE_DTYPE_F16 : QMOE_DTYPE_BF16;
      c.yd = kTypes[(index / 2) % 3];
      c.tile = tile;
      c.copies = index % 2 == 0 ? Copies::kAtWait : Copies::kAtOnce;
      c.accuracy = index % 4 < 2 || tile == 7 ? QMOE_ACCURACY_FAST : QMOE_ACCURACY_EXACT;
      if (tile == 7 && c.m > 17) c.m = 270;
      c.k_splits = splits;
      c.aligned_y = (index / 3) % 2 == 0;
      ++index;
      ASSERT_NO_FATAL_FAILURE(run_case(c, qmoe::testing::fresh_seed()));
    }
  }
  for (uint32_t rows : {0u, 100u}) {
    Case c;
    c.w.n = 24;
    c.w.k = 256;
    c.m = 150;
    c.tile = 4;
    c.device_rows = rows;
    c.k_splits = 2;
    ASSERT_NO_FATAL_FAILURE(run_case(c, qmoe::testing::fresh_seed()));
  }
}

// The row count read through m_device: rows from it up keep their poison.
TEST(CudaInt4GemmTcEmulation, DeviceRowCount) {
  for (int tile : {3, 4, 5, 7}) {
    for (uint32_t rows : {0u, 1u, 40u}) {
      Case c;
      c.w.n = 24;
      c.w.k = 64;
      c.m = tile == 3 ? 70 : tile == 7 ? 300 : 150;
      c.tile = tile;
      c.accuracy = tile == 7 ? QMOE_ACCURACY_FAST : QMOE_ACCURACY_EXACT;  // scaled weights only
      // 256 x 128: the second row tile cut short instead of the first.
      c.device_rows = tile == 7 && rows == 40 ? 280 : rows;
      ASSERT_NO_FATAL_FAILURE(run_case(c, qmoe::testing::fresh_seed()));
    }
  }
}

}  // namespace
}  // namespace qmoe::cuda::tc
