// Cooperative fibers that stand in for the threads of one CUDA block (or one cluster's blocks)
// in the host emulations of the kernels (cuda_host_emulator.h for the decode kernels,
// int4_gemm_tc_emulation_test.cu for the tensor-core GEMM). Every thread is a ucontext fiber on
// the launching OS thread; a fiber runs until it waits at a FiberBarrier that is not complete,
// polls (yield), or returns, and then the next runnable fiber runs. Switching costs a user-space
// context switch, where one OS thread per CUDA thread cost a futex wake-up and a scheduler
// decision at every barrier and shuffle (the emulated layer tests spent most of their time in
// the kernel).
//
// The schedule is one legal CUDA schedule among many, chosen to expose missing barriers: the
// scheduler always resumes the lowest-numbered runnable fiber (or, for highest_first, the
// highest-numbered). So a warp runs ahead of the others through its warp operations until every
// lane waits at __syncthreads (or returns), and only then does the next warp start: a warp that
// reads another warp's shared-memory writes with no block barrier between them reads them
// before they happen under one of the two orders. FiberBlock::run takes the order, so a caller
// can run both across its blocks.
//
// A wait that can never complete (a lane that skips a warp operation, a thread that skips a
// __syncthreads that others reach) leaves no fiber runnable while some have not returned: run
// reports the block's state and aborts at once, where the thread-based barrier needed a timeout.
// A poll that can never succeed (an mbarrier phase that no thread will complete) is caught the
// same way: a round in which every runnable fiber ran to its next wait and none changed state a
// poll reads leaves the next round the same, so run aborts rather than poll forever. That needs
// the polls' state to announce its changes (note_progress); a barrier arrival or a fiber's return
// counts by itself.
//
// Not for sanitizer builds: ASan and TSan need fiber annotations for stack switches, and the
// sanitizer suites build without CUDA, so no emulation test is built there.
#ifndef QMOE_TESTS_CUDA_HOST_FIBERS_H_
#define QMOE_TESTS_CUDA_HOST_FIBERS_H_

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#error \
    "host_fibers.h switches stacks without sanitizer annotations; build the emulation tests without sanitizers"
#endif

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace qmoe::testing {

class FiberBlock;
inline thread_local FiberBlock* tl_fiber_block = nullptr;

// A barrier among some fibers of the running FiberBlock: it releases when every expected
// participant has arrived, and a participant that exits (leave) no longer counts, as
// __syncthreads counts only threads that have not exited.
class FiberBarrier {
 public:
  explicit FiberBarrier(uint32_t count = 0) : expected_(count) {}
  void reset(uint32_t count) {
    expected_ = count;
    arrived_ = 0;
    waiters_.clear();
  }
  inline void wait();
  inline void leave();

 private:
  inline void release();
  uint32_t expected_ = 0, arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<uint32_t> waiters_;  // fibers blocked in this generation
};

// One block's fibers, run to completion on the calling OS thread.
class FiberBlock {
 public:
  using Body = void (*)(void* state, uint32_t thread);

  // Runs body(state, t) for every t in [0, threads), each on a fiber of its own, until every
  // one has returned. switch_in(state, t) runs on the OS thread's own stack each time before
  // fiber t starts or resumes (the emulator sets the thread's built-in variables there).
  // highest_first: resume runnable fibers from the highest thread index down.
  static void run(uint32_t threads, bool highest_first, Body body, Body switch_in, void* state) {
    if (tl_fiber_block != nullptr) {  // the stacks of the running block would be reused
      std::fprintf(stderr, "host fibers: run called from a fiber (a kernel launching one)\n");
      std::abort();
    }
    FiberBlock block(threads, body, state);
    tl_fiber_block = &block;
    for (;;) {
      int f = highest_first ? block.highest_runnable() : block.lowest_runnable();
      if (f < 0 && !block.spinners_.empty()) {
        // Every fiber that could run has; the spinners poll again, unless nothing they read has
        // changed since they last did.
        if (block.progress_ == block.progress_at_wake_) block.report_stuck_polls();
        block.progress_at_wake_ = block.progress_;
        block.wake_spinning();
        f = highest_first ? block.highest_runnable() : block.lowest_runnable();
      }
      if (f < 0) {
        if (block.live_ == 0) break;
        block.report_deadlock();
      }
      switch_in(state, static_cast<uint32_t>(f));
      block.current_ = static_cast<uint32_t>(f);
      swapcontext(&block.scheduler_, &block.fibers_[f].context);
    }
    tl_fiber_block = nullptr;
  }

  // The running fiber waits until make_runnable is called for it and the scheduler resumes it.
  void block_current() {
    set_runnable(current_, false);
    swapcontext(&fibers_[current_].context, &scheduler_);
  }
  void make_runnable(uint32_t fiber) { set_runnable(fiber, true); }
  // For a fiber whose poll failed (an mbarrier's try_wait): it resumes only after every other
  // fiber that can run has run to its next wait, so the poll cannot starve the fibers that will
  // satisfy it. The state the poll reads must call note_progress when it changes, unless the
  // fiber that changes it then reaches a barrier or returns before it next yields.
  void yield() {
    set_runnable(current_, false);
    spinners_.push_back(current_);
    swapcontext(&fibers_[current_].context, &scheduler_);
  }
  uint32_t current() const { return current_; }
  // Some state a poll reads has changed: the spinners' next round may differ from their last.
  void note_progress() { ++progress_; }

 private:
  static constexpr size_t kStackBytes = 512 * 1024;

  // A fiber's stack: kStackBytes above one inaccessible guard page (an overflow faults), mapped
  // once per OS thread and reused by every later block (only the touched pages are backed).
  struct Stack {
    unsigned char* base = nullptr;  // the guard page
    unsigned char* usable() const { return base + page_size(); }
  };
  static size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
  static std::vector<Stack>& stacks(size_t count) {
    static thread_local std::vector<Stack> pool;
    while (pool.size() < count) {
      void* p = mmap(nullptr, kStackBytes + page_size(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED || mprotect(p, page_size(), PROT_NONE) != 0) {
        std::fprintf(stderr, "host fibers: cannot map a %zu-byte stack\n", kStackBytes);
        std::abort();
      }
      pool.push_back(Stack{static_cast<unsigned char*>(p)});
    }
    return pool;
  }

  struct Fiber {
    ucontext_t context;
  };

  void set_runnable(uint32_t f, bool on) {
    const uint64_t bit = uint64_t{1} << (f % 64);
    runnable_[f / 64] = on ? runnable_[f / 64] | bit : runnable_[f / 64] & ~bit;
  }
  void wake_spinning() {
    for (uint32_t f : spinners_) set_runnable(f, true);
    spinners_.clear();
  }
  int lowest_runnable() const {
    for (size_t w = 0; w < runnable_.size(); ++w) {
      if (runnable_[w] != 0) return static_cast<int>(64 * w + __builtin_ctzll(runnable_[w]));
    }
    return -1;
  }
  int highest_runnable() const {
    for (size_t w = runnable_.size(); w-- > 0;) {
      if (runnable_[w] != 0) return static_cast<int>(64 * w + 63 - __builtin_clzll(runnable_[w]));
    }
    return -1;
  }

  FiberBlock(uint32_t threads, Body body, void* state)
      : fibers_(threads),
        runnable_((threads + 63) / 64),
        live_(threads),
        body_(body),
        state_(state) {
    for (uint32_t f = 0; f < threads; ++f) set_runnable(f, true);
    std::vector<Stack>& pool = stacks(threads);
    for (uint32_t f = 0; f < threads; ++f) {
      Fiber& fiber = fibers_[f];
      getcontext(&fiber.context);
      fiber.context.uc_stack.ss_sp = pool[f].usable();
      fiber.context.uc_stack.ss_size = kStackBytes;
      fiber.context.uc_link = &scheduler_;  // a returning fiber resumes the scheduler
      makecontext(&fiber.context, &FiberBlock::entry, 0);
    }
  }

  static void entry() {
    FiberBlock& block = *tl_fiber_block;
    const uint32_t f = block.current_;
    block.body_(block.state_, f);
    block.set_runnable(f, false);
    --block.live_;
    block.note_progress();  // a return leaves barriers and may end what a poll waited for
  }

  [[noreturn]] void report_deadlock() const {
    std::fprintf(stderr,
                 "host fibers: deadlock: %u of %zu threads wait at barriers that the others will "
                 "never reach (a divergent __syncthreads or warp operation)\n",
                 live_, fibers_.size());
    std::abort();
  }
  [[noreturn]] void report_stuck_polls() const {
    std::fprintf(stderr,
                 "host fibers: deadlock: %zu of %zu threads poll for a condition that no thread "
                 "will make true (an mbarrier phase that never completes); %zu others wait\n",
                 spinners_.size(), fibers_.size(), live_ - spinners_.size());
    std::abort();
  }

  std::vector<Fiber> fibers_;
  std::vector<uint64_t> runnable_;  // bit f: fiber f may resume
  uint32_t live_;                   // fibers that have not returned
  std::vector<uint32_t> spinners_;  // fibers in yield(), resumed when no other fiber can run
  // note_progress calls so far, and their count when the spinners were last resumed (zero: the
  // first round counts from the block's start, when every poll read the initial state).
  uint64_t progress_ = 0, progress_at_wake_ = 0;
  Body body_;
  void* state_;
  ucontext_t scheduler_;
  uint32_t current_ = 0;
};

void FiberBarrier::wait() {
  FiberBlock& block = *tl_fiber_block;
  const uint64_t generation = generation_;
  block.note_progress();
  if (++arrived_ >= expected_) {
    release();
    return;
  }
  waiters_.push_back(block.current());
  while (generation_ == generation) block.block_current();
}

void FiberBarrier::leave() {
  tl_fiber_block->note_progress();
  --expected_;
  if (arrived_ > 0 && arrived_ >= expected_) release();
}

void FiberBarrier::release() {
  arrived_ = 0;
  ++generation_;
  FiberBlock& block = *tl_fiber_block;
  for (uint32_t f : waiters_) block.make_runnable(f);
  waiters_.clear();
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_CUDA_HOST_FIBERS_H_
