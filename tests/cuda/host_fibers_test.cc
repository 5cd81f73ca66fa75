// The fibers of the kernels' host emulations (host_fibers.h): barriers release only when every
// participant has arrived or left, the schedule lets a warp run ahead to the block barrier in
// the order asked for, a polling fiber lets the others run first, a wait that cannot complete
// and a run from inside a fiber abort at once, and a block of 256 fibers with deep stacks runs
// again and again on the reused stacks.
#include "tests/cuda/host_fibers.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace qmoe::testing {
namespace {

// Phases of a 64-fiber block: in each, every fiber writes its slot, waits at the barrier and
// then reads every slot; fibers 60-63 return after phase 1, so later phases complete without
// them only because they left.
struct PhaseState {
  FiberBarrier barrier;
  uint32_t slot[64] = {};
  uint32_t mismatches = 0;
  uint32_t phases_done[64] = {};
};

TEST(HostFibers, BarrierWaitsForEveryParticipantAndCountsThoseThatLeft) {
  for (bool highest_first : {false, true}) {
    PhaseState s;
    s.barrier.reset(64);
    FiberBlock::run(
        64, highest_first,
        [](void* p, uint32_t t) {
          auto& st = *static_cast<PhaseState*>(p);
          const uint32_t phases = t >= 60 ? 2 : 5;
          for (uint32_t phase = 1; phase <= phases; ++phase) {
            st.slot[t] = phase;
            st.barrier.wait();
            const uint32_t writers = phase <= 2 ? 64 : 60;
            for (uint32_t u = 0; u < writers; ++u) st.mismatches += st.slot[u] != phase;
            st.barrier.wait();  // every reader is done before the next phase writes
            st.phases_done[t] = phase;
          }
          st.barrier.leave();
        },
        [](void*, uint32_t) {}, &s);
    EXPECT_EQ(s.mismatches, 0u) << (highest_first ? "highest first" : "lowest first");
    for (uint32_t t = 0; t < 64; ++t) EXPECT_EQ(s.phases_done[t], t >= 60 ? 2u : 5u) << t;
  }
}

// Two "warps" of 4 fibers, each with its own barrier, then one block barrier: the warp first in
// the order runs its warp-barrier rounds through to the block barrier before the other warp's
// first fiber starts.
struct OrderState {
  FiberBarrier warp[2], block;
  uint32_t at_block[2] = {};       // fibers of each warp that reached the block barrier
  uint32_t seen_at_start[8] = {};  // the other warp's at_block when each fiber started
  uint32_t after_block = 0;        // fibers past the block barrier
  uint32_t early = 0;              // fibers past it before every fiber arrived
  uint32_t switched_in = 0;
};

void run_order(bool highest_first) {
  OrderState s;
  s.warp[0].reset(4);
  s.warp[1].reset(4);
  s.block.reset(8);
  FiberBlock::run(
      8, highest_first,
      [](void* p, uint32_t t) {
        auto& st = *static_cast<OrderState*>(p);
        const uint32_t w = t / 4;
        st.seen_at_start[t] = st.at_block[1 - w];
        for (int round = 0; round < 3; ++round) st.warp[w].wait();
        ++st.at_block[w];
        st.block.wait();
        st.early += st.at_block[0] + st.at_block[1] != 8;
        ++st.after_block;
        st.warp[w].leave();
        st.block.leave();
      },
      [](void* p, uint32_t) { ++static_cast<OrderState*>(p)->switched_in; }, &s);
  const uint32_t first = highest_first ? 1 : 0;
  for (uint32_t t = 0; t < 8; ++t) {
    EXPECT_EQ(s.seen_at_start[t], t / 4 == first ? 0u : 4u)
        << (highest_first ? "highest first" : "lowest first") << ", fiber " << t;
  }
  EXPECT_EQ(s.early, 0u);
  EXPECT_EQ(s.after_block, 8u);
  EXPECT_GT(s.switched_in, 8u);  // fibers resumed after their waits, each through switch_in
}

TEST(HostFibers, AWarpRunsAheadToTheBlockBarrierInTheOrderAskedFor) {
  run_order(false);
  run_order(true);
}

// A fiber that polls (an mbarrier's try_wait) lets the others run to their next wait before it
// polls again: fiber 0 runs first and polls a flag that fiber 3 sets only after fibers 1-3 meet
// at a barrier.
struct PollState {
  FiberBarrier barrier{3};
  bool flag = false;
  uint32_t polls = 0;
};

TEST(HostFibers, APollingFiberLetsTheOthersRunFirst) {
  for (bool highest_first : {false, true}) {
    PollState s;
    FiberBlock::run(
        4, highest_first,
        [](void* p, uint32_t t) {
          auto& st = *static_cast<PollState*>(p);
          if (t == 0) {
            while (!st.flag && st.polls < 1000) {
              ++st.polls;
              tl_fiber_block->yield();
            }
            return;
          }
          st.barrier.wait();
          if (t == 3) st.flag = true;
          st.barrier.leave();
        },
        [](void*, uint32_t) {}, &s);
    // Lowest first, fiber 0 polls once, then everyone else runs; highest first, it starts last.
    EXPECT_TRUE(s.flag);
    EXPECT_EQ(s.polls, highest_first ? 0u : 1u) << (highest_first ? "highest" : "lowest");
  }
}

TEST(HostFibersDeathTest, AWaitThatCannotCompleteAbortsAtOnce) {
  struct Crossed {
    FiberBarrier a, b;
  };
  EXPECT_DEATH(
      {
        Crossed c;
        c.a.reset(2);
        c.b.reset(2);
        FiberBlock::run(
            2, false,
            [](void* p, uint32_t t) {
              auto& st = *static_cast<Crossed*>(p);
              (t == 0 ? st.a : st.b).wait();  // each waits where the other never arrives
            },
            [](void*, uint32_t) {}, &c);
      },
      "deadlock: 2 of 2 threads wait");
}

TEST(HostFibersDeathTest, APollThatCannotSucceedAbortsAtOnce) {
  for (bool highest_first : {false, true}) {
    EXPECT_DEATH(
        {
          bool flag = false;  // no fiber sets it
          FiberBlock::run(
              2, highest_first,
              [](void* p, uint32_t t) {
                if (t == 1) return;
                while (!*static_cast<bool*>(p)) tl_fiber_block->yield();
              },
              [](void*, uint32_t) {}, &flag);
        },
        "deadlock: 1 of 2 threads poll for a condition that no thread will make true");
  }
}

// Polls go on for as many rounds as another fiber announces a change: here fiber 1 raises a
// count by one a round (it yields in between, as a poller would) and fiber 0 waits for 5.
struct CountState {
  uint32_t count = 0, polls = 0;
};

TEST(HostFibers, PollsGoOnWhileAFiberAnnouncesProgress) {
  CountState s;
  FiberBlock::run(
      2, false,
      [](void* p, uint32_t t) {
        auto& st = *static_cast<CountState*>(p);
        if (t == 1) {
          for (uint32_t i = 0; i < 5; ++i) {
            ++st.count;
            tl_fiber_block->note_progress();
            tl_fiber_block->yield();
          }
          return;
        }
        while (st.count < 5) {
          ++st.polls;
          tl_fiber_block->yield();
        }
      },
      [](void*, uint32_t) {}, &s);
  EXPECT_EQ(s.count, 5u);
  EXPECT_EQ(s.polls, 5u);  // fiber 0 polls once a round, before fiber 1's raise
}

TEST(HostFibersDeathTest, ARunFromInsideAFiberAborts) {
  EXPECT_DEATH(FiberBlock::run(
                   2, false,
                   [](void*, uint32_t) {
                     FiberBlock::run(
                         1, false, [](void*, uint32_t) {}, [](void*, uint32_t) {}, nullptr);
                   },
                   [](void*, uint32_t) {}, nullptr),
               "run called from a fiber");
}

// 256 fibers, each with 128 KB of live stack across a barrier (the kernels' locals are far
// smaller), run in several blocks one after another on the same stacks.
struct DeepState {
  FiberBarrier barrier;
  uint64_t sums[256] = {};
};

TEST(HostFibers, ManyFibersWithDeepStacksRunBlockAfterBlock) {
  for (int block = 0; block < 4; ++block) {
    DeepState s;
    s.barrier.reset(256);
    FiberBlock::run(
        256, block % 2 == 1,
        [](void* p, uint32_t t) {
          auto& st = *static_cast<DeepState*>(p);
          volatile unsigned char local[128 * 1024];
          for (size_t i = 0; i < sizeof(local); i += 512) local[i] = static_cast<unsigned char>(t);
          st.barrier.wait();  // every other fiber's frame is live now
          uint64_t sum = 0;
          for (size_t i = 0; i < sizeof(local); i += 512) sum += local[i];
          st.sums[t] = sum;
          st.barrier.leave();
        },
        [](void*, uint32_t) {}, &s);
    for (uint32_t t = 0; t < 256; ++t) ASSERT_EQ(s.sums[t], uint64_t{t} * 256) << t;
  }
}

}  // namespace
}  // namespace qmoe::testing
