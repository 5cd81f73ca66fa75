// Contexts through the C ABI: tier choice and caps, threads, the caller's parallel-for,
// kernel-name queries, versions and statuses, and bad handles.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lib/dispatch.h"
#include "qmoe/qmoe.h"
#include "qmoe/qmoe_experimental.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/destroy_race.h"
#include "tests/expected_tier.h"

namespace {

using qmoe::Isa;

struct ContextDeleter {
  void operator()(qmoe_context* c) const { qmoe_context_destroy(c); }
};

qmoe_context_options options_for(qmoe_isa isa, uint32_t threads = 0) {
  qmoe_context_options o;
  qmoe_context_options_init(&o);
  o.max_isa = isa;
  o.num_threads = threads;
  return o;
}

TEST(Version, HeaderAndLibraryAgree) {
  EXPECT_EQ(qmoe_version_number(), static_cast<unsigned>(QMOE_VERSION_NUMBER));
  EXPECT_STREQ(qmoe_version_string(), QMOE_VERSION_STRING);
}

TEST(Status, NamesAreFixed) {
  EXPECT_STREQ(qmoe_status_string(QMOE_STATUS_OK), "QMOE_STATUS_OK");
  EXPECT_STREQ(qmoe_status_string(QMOE_STATUS_INTERNAL_ERROR), "QMOE_STATUS_INTERNAL_ERROR");
  EXPECT_STREQ(qmoe_status_string(static_cast<qmoe_status>(1234)), "QMOE_STATUS_<unknown>");
  // The values are ABI: never renumbered.
  EXPECT_EQ(QMOE_STATUS_INVALID_ARGUMENT, 1);
  EXPECT_EQ(QMOE_STATUS_UNSUPPORTED_HARDWARE, 2);
  EXPECT_EQ(QMOE_STATUS_INVALID_CONTEXT, 5);
  EXPECT_EQ(QMOE_ISA_AVX512, 3);
  EXPECT_EQ(QMOE_WEIGHT_FORMAT_INT4, 1);
  EXPECT_EQ(QMOE_ACCURACY_FAST, 2);
}

TEST(Status, LastErrorIsPerThread) {
  EXPECT_EQ(qmoe_context_create(nullptr, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  const std::string mine = qmoe_last_error_message();
  EXPECT_NE(mine.find("qmoe_context_create"), std::string::npos) << mine;
  std::string other = "unset";
  std::thread([&] { other = qmoe_last_error_message(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(mine, qmoe_last_error_message());
}

// The tier a default context gets is compared with the test's own expectation (cpuinfo's flags
// and QMOE_MAX_ISA read here, tests/expected_tier.h), not with the library's default_isa(),
// which would compare the code with itself.
TEST(Context, DefaultUsesTheProcessDefaultTier) {
  qmoe_context* raw = nullptr;
  ASSERT_EQ(qmoe_context_create(nullptr, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
  std::unique_ptr<qmoe_context, ContextDeleter> ctx(raw);
  qmoe_isa isa = QMOE_ISA_DEFAULT;
  ASSERT_EQ(qmoe_context_get_isa(ctx.get(), &isa), QMOE_STATUS_OK);
  EXPECT_STREQ(qmoe_isa_name(isa), qmoe::isa_name(qmoe::testing::expected_default_tier()));
  uint32_t threads = 0;
  ASSERT_EQ(qmoe_context_get_num_threads(ctx.get(), &threads), QMOE_STATUS_OK);
  EXPECT_GE(threads, 1u);
}

// Per tier: available tiers give a context of exactly that tier whose kernels are all that tier's;
// a tier the host lacks gives UNSUPPORTED_HARDWARE and no context.
class ContextTier : public ::testing::TestWithParam<Isa> {};

TEST_P(ContextTier, CreateAtTierOrReportUnsupported) {
  const Isa isa = GetParam();
  qmoe_context_options o = options_for(static_cast<qmoe_isa>(isa), 1);
  qmoe_context* raw = reinterpret_cast<qmoe_context*>(0x1);
  const qmoe_status status = qmoe_context_create(&o, &raw);
  std::unique_ptr<qmoe_context, ContextDeleter> ctx(status == QMOE_STATUS_OK ? raw : nullptr);
  if (qmoe::isa_unavailable_reason(isa) != nullptr) {
    EXPECT_EQ(status, QMOE_STATUS_UNSUPPORTED_HARDWARE);
    EXPECT_EQ(raw, nullptr);
    EXPECT_NE(std::string(qmoe_last_error_message()).find(qmoe::isa_unavailable_reason(isa)),
              std::string::npos)
        << qmoe_last_error_message();
    GTEST_SKIP() << "tier " << qmoe::isa_name(isa)
                 << " unavailable: " << qmoe::isa_unavailable_reason(isa);
  }
  ASSERT_EQ(status, QMOE_STATUS_OK) << qmoe_last_error_message();
  qmoe_isa got = QMOE_ISA_DEFAULT;
  ASSERT_EQ(qmoe_context_get_isa(ctx.get(), &got), QMOE_STATUS_OK);
  EXPECT_EQ(got, static_cast<qmoe_isa>(isa));
  uint32_t count = 0;
  ASSERT_EQ(qmoe_context_get_kernel_count(ctx.get(), &count), QMOE_STATUS_OK);
  ASSERT_GT(count, 0u);
  for (uint32_t i = 0; i < count; ++i) {
    qmoe_kernel_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(qmoe_context_get_kernel_info(ctx.get(), i, &info), QMOE_STATUS_OK);
    ASSERT_NE(info.name, nullptr);
    // Assembly lets a tier inherit an entry from the next lower one, but every tier provides
    // every entry itself today, and an inherited entry would go unnoticed elsewhere (that
    // tier's kernel tests would compare the lower tier's kernel with itself): each entry must
    // be this tier's own (or its extension's). A tier that means to inherit one must be listed
    // here.
    const std::string n(info.name);
    std::string suffix = n.substr(n.rfind("__") + 2);
    // Extension kernels name their feature; each belongs to the tier it extends.
    if (suffix == "avxvnni") suffix = "avx2";
    if (suffix == "avx512vnni" || suffix == "avx512vbmi" || suffix == "avx512gfni")
      suffix = "avx512";
    EXPECT_EQ(suffix, qmoe::isa_name(isa)) << n << " is not the tier's own";
    EXPECT_EQ(n.rfind(std::string("qmoe_") + info.operation, 0), 0u) << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, ContextTier, ::testing::ValuesIn(qmoe::testing::built_tiers()),
                         qmoe::testing::IsaParamName);

TEST(Context, CappedContextsDoNotDowngradeOthers) {
  qmoe_context_options scalar_opts = options_for(QMOE_ISA_SCALAR, 1);
  qmoe_context* scalar = nullptr;
  ASSERT_EQ(qmoe_context_create(&scalar_opts, &scalar), QMOE_STATUS_OK);
  qmoe_context* dflt = nullptr;
  ASSERT_EQ(qmoe_context_create(nullptr, &dflt), QMOE_STATUS_OK);
  qmoe_isa a = QMOE_ISA_DEFAULT, b = QMOE_ISA_DEFAULT;
  qmoe_context_get_isa(scalar, &a);
  qmoe_context_get_isa(dflt, &b);
  EXPECT_EQ(a, QMOE_ISA_SCALAR);
  EXPECT_STREQ(qmoe_isa_name(b), qmoe::isa_name(qmoe::testing::expected_default_tier()));
  qmoe_context_destroy(scalar);
  qmoe_context_destroy(dflt);
}

TEST(Context, RejectsBadOptions) {
  qmoe_context* ctx = nullptr;
  qmoe_context_options o = options_for(static_cast<qmoe_isa>(99));
  EXPECT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(ctx, nullptr);
  o = options_for(QMOE_ISA_DEFAULT);
  o.struct_size = 3;
  EXPECT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("struct_size"), std::string::npos);
  o.struct_size = size_t{1} << 40;
  EXPECT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_context_create(&o, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  // More threads than the cap: refused before a pool is asked for them (pthreadpool would wait
  // forever for workers it could not start).
  o = options_for(QMOE_ISA_DEFAULT);
  o.num_threads = QMOE_MAX_THREADS + 1;
  EXPECT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("num_threads"), std::string::npos);
  EXPECT_EQ(ctx, nullptr);
  o.num_threads = UINT32_MAX;
  EXPECT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_INVALID_ARGUMENT);
  // A struct_size that ends inside parallel_for would leave half a function pointer: no
  // version of the struct had that size.
  o = options_for(QMOE_ISA_DEFAULT);
  o.parallel_for = [](void*, qmoe_parallel_task_fn, void*, size_t) {};
  o.struct_size = offsetof(qmoe_context_options, parallel_for) + 4;
  EXPECT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("struct_size"), std::string::npos);
  EXPECT_EQ(ctx, nullptr);
  // Ending where parallel_for begins is a shorter version: accepted, the pool is libqmoe's.
  o.struct_size = offsetof(qmoe_context_options, parallel_for);
  ASSERT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_OK);
  qmoe_context_destroy(ctx);
}

TEST(Context, AcceptsAnOlderSmallerOptionsStruct) {
  // A caller compiled before parallel_for existed: its struct ends after num_threads, and the
  // bytes beyond must not be read.
  struct OldOptions {
    size_t struct_size;
    qmoe_isa max_isa;
    uint32_t num_threads;
  };
  struct {
    OldOptions old;
    unsigned char poison[64];
  } storage;
  std::memset(&storage, 0xA5, sizeof(storage));
  storage.old.struct_size = offsetof(qmoe_context_options, parallel_for);
  storage.old.max_isa = QMOE_ISA_SCALAR;
  storage.old.num_threads = 2;
  qmoe_context* ctx = nullptr;
  ASSERT_EQ(qmoe_context_create(reinterpret_cast<const qmoe_context_options*>(&storage), &ctx),
            QMOE_STATUS_OK)
      << qmoe_last_error_message();
  uint32_t threads = 0;
  qmoe_context_get_num_threads(ctx, &threads);
  EXPECT_EQ(threads, 2u);
  std::vector<float> in(100000, 1.5f);
  std::vector<uint16_t> out(in.size());
  EXPECT_EQ(qmoe_convert_f32_to_bf16(ctx, in.data(), out.data(), in.size()), QMOE_STATUS_OK);
  EXPECT_EQ(out.back(), 0x3FC0);
  qmoe_context_destroy(ctx);
}

TEST(Context, DestroyedAndForeignHandlesAreRejected) {
  qmoe_context* ctx = nullptr;
  ASSERT_EQ(qmoe_context_create(nullptr, &ctx), QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_context_destroy(ctx), QMOE_STATUS_OK);
  qmoe_isa isa;
  EXPECT_EQ(qmoe_context_get_isa(ctx, &isa), QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("destroyed"), std::string::npos);
  EXPECT_EQ(qmoe_context_destroy(ctx), QMOE_STATUS_INVALID_CONTEXT);  // double destroy
  float f = 0;
  uint16_t h = 0;
  EXPECT_EQ(qmoe_convert_f16_to_f32(ctx, &h, &f, 1), QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_EQ(qmoe_context_destroy(nullptr), QMOE_STATUS_OK);

  alignas(64) unsigned char not_a_context[64] = {};
  auto* foreign = reinterpret_cast<qmoe_context*>(not_a_context);
  EXPECT_EQ(qmoe_context_get_isa(foreign, &isa), QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_EQ(qmoe_context_get_isa(nullptr, &isa), QMOE_STATUS_INVALID_CONTEXT);
}

TEST(Context, QueriesRejectNullOutputs) {
  qmoe_context* ctx = nullptr;
  ASSERT_EQ(qmoe_context_create(nullptr, &ctx), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_context_get_isa(ctx, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_context_get_num_threads(ctx, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  qmoe_context_destroy(ctx);
}

// A host runtime's own pool: the library must hand every index of the range to it exactly once.
struct RecordingPool {
  std::atomic<int> calls{0};
  std::atomic<size_t> items{0};
  static void parallel_for(void* state, qmoe_parallel_task_fn task, void* task_state,
                           size_t range) {
    auto* self = static_cast<RecordingPool*>(state);
    self->calls.fetch_add(1);
    // Run in reverse on two threads to prove the library does not depend on order.
    std::thread other([&] {
      for (size_t i = range; i-- > range / 2;) task(task_state, i);
    });
    for (size_t i = 0; i < range / 2; ++i) task(task_state, i);
    other.join();
    self->items.fetch_add(range);
  }
};

TEST(Context, CallerParallelForIsUsedForLongRows) {
  RecordingPool pool;
  qmoe_context_options o = options_for(QMOE_ISA_DEFAULT, 4);
  o.parallel_for = &RecordingPool::parallel_for;
  o.parallel_for_state = &pool;
  qmoe_context* ctx = nullptr;
  ASSERT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_OK);
  const size_t n = 1 << 20;
  std::vector<uint16_t> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint16_t>(i * 2654435761u >> 16) & 0x7BFF;
  std::vector<float> threaded(n, -1.0f), inline_result(n, -2.0f);
  ASSERT_EQ(qmoe_convert_f16_to_f32(ctx, src.data(), threaded.data(), n), QMOE_STATUS_OK);
  EXPECT_EQ(pool.calls.load(), 1);
  EXPECT_GT(pool.items.load(), 1u);

  qmoe_context_options one = options_for(QMOE_ISA_DEFAULT, 1);
  qmoe_context* single = nullptr;
  ASSERT_EQ(qmoe_context_create(&one, &single), QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_convert_f16_to_f32(single, src.data(), inline_result.data(), n), QMOE_STATUS_OK);
  EXPECT_EQ(std::memcmp(threaded.data(), inline_result.data(), n * sizeof(float)), 0);
  qmoe_context_destroy(single);
  qmoe_context_destroy(ctx);
}

TEST(Context, ManyContextsCreatedAndDestroyedConcurrently) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        qmoe_context_options o = options_for(QMOE_ISA_DEFAULT, 1 + (i % 2));
        qmoe_context* ctx = nullptr;
        if (qmoe_context_create(&o, &ctx) != QMOE_STATUS_OK) ++failures;
        if (qmoe_context_destroy(ctx) != QMOE_STATUS_OK) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// Two threads destroying the same context at once: one frees it, the other is told it was
// destroyed (it once freed it a second time).
TEST(Context, RacingDestroysFreeTheContextOnce) {
  constexpr int kRounds = 20000;
  const qmoe_test::DestroyRaceCounts counts = qmoe_test::race_destroys<qmoe_context>(
      kRounds,
      [] {
        qmoe_context_options o = options_for(QMOE_ISA_DEFAULT, 1);
        qmoe_context* ctx = nullptr;
        return qmoe_context_create(&o, &ctx) == QMOE_STATUS_OK ? ctx : nullptr;
      },
      [](qmoe_context* ctx) { return qmoe_context_destroy(ctx); }, QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_EQ(counts.ok, kRounds);
  EXPECT_EQ(counts.rejected, kRounds);
  EXPECT_EQ(counts.other, 0);
}

TEST(HostInfo, ReportsTiersAndRejectsBadStructs) {
  qmoe_host_info info{};
  info.struct_size = sizeof(info);
  ASSERT_EQ(qmoe_get_host_info(&info), QMOE_STATUS_OK);
  EXPECT_STREQ(qmoe_isa_name(info.best_supported_isa),
               qmoe::isa_name(qmoe::testing::expected_best_tier()));
  EXPECT_STREQ(qmoe_isa_name(info.default_isa),
               qmoe::isa_name(qmoe::testing::expected_default_tier()));
  EXPECT_GE(info.logical_processors, 1u);
  EXPECT_GE(info.physical_cores, 1u);
  EXPECT_EQ(qmoe_get_host_info(nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  info.struct_size = 0;
  EXPECT_EQ(qmoe_get_host_info(&info), QMOE_STATUS_INVALID_ARGUMENT);
}

// Runs under ctest with QMOE_MAX_ISA set (see tests/CMakeLists.txt), and without: the process
// default is the best tier capped by the variable, and an unknown value is ignored with a
// reason. The expected tiers are the test's own (tests/expected_tier.h).
TEST(ProcessDefault, FollowsQmoeMaxIsa) {
  const char* env = std::getenv("QMOE_MAX_ISA");
  const Isa best = qmoe::testing::expected_best_tier();
  const Isa expected = qmoe::testing::expected_default_tier();
  qmoe_host_info info{};
  info.struct_size = sizeof(info);
  ASSERT_EQ(qmoe_get_host_info(&info), QMOE_STATUS_OK);
  EXPECT_STREQ(qmoe_isa_name(info.best_supported_isa), qmoe::isa_name(best));
  EXPECT_STREQ(qmoe_isa_name(info.default_isa), qmoe::isa_name(expected));
  EXPECT_EQ(qmoe::default_isa(), expected);
  if (env == nullptr || *env == '\0') {
    EXPECT_STREQ(info.max_isa_env, "");
    EXPECT_STREQ(info.default_isa_reason, "");
    return;
  }
  EXPECT_STREQ(info.max_isa_env, env);
  if (expected != best) {
    EXPECT_NE(std::string(info.default_isa_reason).find("QMOE_MAX_ISA"), std::string::npos);
  }
  Isa parsed = best;
  if (!qmoe::parse_isa_name(env, &parsed)) {
    EXPECT_NE(std::string(info.default_isa_reason).find("ignored"), std::string::npos);
  }
  // A context may still ask for any tier the host has: the cap is a default, not a switch.
  qmoe_context_options o = options_for(static_cast<qmoe_isa>(best), 1);
  qmoe_context* ctx = nullptr;
  EXPECT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_OK);
  qmoe_context_destroy(ctx);
}

// The second guard of the process default, through what a default context runs: its kernels
// are the expected default tier's own (tests/cpu/tier_kernels.h), under every QMOE_MAX_ISA the
// ctest entries set. A default that named the capped tier but kept the best tier's table (or
// the reverse) fails here.
TEST(ProcessDefault, DefaultContextsRunTheExpectedTiersKernels) {
  const Isa expected = qmoe::testing::expected_default_tier();
  for (uint32_t threads : {1u, 2u}) {
    qmoe_context_options o = options_for(QMOE_ISA_DEFAULT, threads);
    qmoe_context* raw = nullptr;
    ASSERT_EQ(qmoe_context_create(&o, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
    std::unique_ptr<qmoe_context, ContextDeleter> ctx(raw);
    EXPECT_EQ(qmoe::testing::check_context_kernels(ctx.get(), expected, "default context"), 0);
    // And a context that names no options at all.
    qmoe_context* plain = nullptr;
    ASSERT_EQ(qmoe_context_create(nullptr, &plain), QMOE_STATUS_OK);
    std::unique_ptr<qmoe_context, ContextDeleter> plain_ctx(plain);
    EXPECT_EQ(qmoe::testing::check_context_kernels(plain, expected, "NULL options"), 0);
  }
}

}  // namespace
