// Which kernels a context runs, through the C ABI: the stable availability query, the
// experimental kernel listing, and tier names.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>

#include "lib/formats/format_traits.h"
#include "qmoe/qmoe.h"
#include "qmoe/qmoe_experimental.h"
#include "tests/cpu/isa_test_util.h"

namespace qmoe::testing {
namespace {

TEST(GemmKernelAvailable, Int4RunsAtEveryBlockSizeAndLevel) {
  ContextPtr ctx = make_context(Isa::kScalar, 1);
  for (uint32_t block : {16u, 32u, 64u, 128u}) {
    for (qmoe_accuracy accuracy : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      int available = -1;
      const char* name = nullptr;
      ASSERT_EQ(qmoe_gemm_kernel_available(ctx.get(), QMOE_WEIGHT_FORMAT_INT4, block, accuracy,
                                           &available, &name),
                QMOE_STATUS_OK)
          << qmoe_last_error_message();
      EXPECT_EQ(available, 1) << block;
      const std::string expected = accuracy == QMOE_ACCURACY_EXACT
                                       ? "qmoe_gemm_int4_exact_8x32__scalar"
                                       : "qmoe_gemm_int4_fast_8x32__scalar";
      ASSERT_NE(name, nullptr);
      EXPECT_EQ(name, expected);
      // The name is optional.
      available = -1;
      EXPECT_EQ(qmoe_gemm_kernel_available(ctx.get(), QMOE_WEIGHT_FORMAT_INT4, block, accuracy,
                                           &available, nullptr),
                QMOE_STATUS_OK);
      EXPECT_EQ(available, 1);
    }
  }
}

TEST(GemmKernelAvailable, Fp4FormatsRunAtTheirBlockSizeOnEveryTier) {
  const struct {
    qmoe_weight_format format;
    uint32_t block;
    const char* name;
  } formats[] = {{QMOE_WEIGHT_FORMAT_MXFP4, 32, "mxfp4"}, {QMOE_WEIGHT_FORMAT_NVFP4, 16, "nvfp4"}};
  for (Isa isa : built_tiers()) {
    if (isa_unavailable_reason(isa) != nullptr) continue;
    ContextPtr ctx = make_context(isa, 1);
    for (const auto& f : formats) {
      for (qmoe_accuracy accuracy : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        int available = -1;
        const char* name = nullptr;
        ASSERT_EQ(
            qmoe_gemm_kernel_available(ctx.get(), f.format, f.block, accuracy, &available, &name),
            QMOE_STATUS_OK);
        EXPECT_EQ(available, 1) << f.name;
        ASSERT_NE(name, nullptr);
        // Every tier has its own kernels (upstream had no AVX2 FP4 path; this one does).
        const std::string prefix = std::string("qmoe_gemm_") + f.name + "_" +
                                   (accuracy == QMOE_ACCURACY_EXACT ? "exact" : "fast") +
                                   "_8x32__" + isa_name(isa);
        EXPECT_EQ(std::string(name).rfind(prefix, 0), 0u) << name << " on " << isa_name(isa);
      }
    }
  }
}

TEST(GemmKernelAvailable, OtherFormatsAndBlockSizesAreAnsweredNo) {
  ContextPtr ctx = make_context(Isa::kScalar, 1);
  const struct {
    int32_t format;
    uint32_t block;
  } cases[] = {{QMOE_WEIGHT_FORMAT_INT4, 0},
               {QMOE_WEIGHT_FORMAT_INT4, 8},
               {QMOE_WEIGHT_FORMAT_INT4, 48},
               {QMOE_WEIGHT_FORMAT_INT4, 256},
               {QMOE_WEIGHT_FORMAT_INT4, 33},
               {QMOE_WEIGHT_FORMAT_INT4, 0x80000000u},
               {QMOE_WEIGHT_FORMAT_MXFP4, 16},
               {QMOE_WEIGHT_FORMAT_MXFP4, 64},
               {QMOE_WEIGHT_FORMAT_NVFP4, 32},
               {QMOE_WEIGHT_FORMAT_NVFP4, 64},
               {0, 32},
               {5, 32},
               {-1, 32},
               {1000, 32}};
  for (const auto& c : cases) {
    int available = -1;
    const char* name = "poison";
    ASSERT_EQ(qmoe_gemm_kernel_available(ctx.get(), static_cast<qmoe_weight_format>(c.format),
                                         c.block, QMOE_ACCURACY_FAST, &available, &name),
              QMOE_STATUS_OK)
        << c.format << " " << c.block;
    EXPECT_EQ(available, 0) << c.format << " " << c.block;
    EXPECT_EQ(name, nullptr) << c.format << " " << c.block;
  }
}

TEST(GemmKernelAvailable, RejectsBadArguments) {
  ContextPtr ctx = make_context(Isa::kScalar, 1);
  int available = 0;
  EXPECT_EQ(qmoe_gemm_kernel_available(ctx.get(), QMOE_WEIGHT_FORMAT_INT4, 32, QMOE_ACCURACY_FAST,
                                       nullptr, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  for (int32_t accuracy : {0, 3, -1}) {
    EXPECT_EQ(qmoe_gemm_kernel_available(ctx.get(), QMOE_WEIGHT_FORMAT_INT4, 32,
                                         static_cast<qmoe_accuracy>(accuracy), &available, nullptr),
              QMOE_STATUS_INVALID_ARGUMENT)
        << accuracy;
  }
  EXPECT_EQ(qmoe_gemm_kernel_available(nullptr, QMOE_WEIGHT_FORMAT_INT4, 32, QMOE_ACCURACY_FAST,
                                       &available, nullptr),
            QMOE_STATUS_INVALID_CONTEXT);
}

TEST(KernelInfo, ListsEveryOperationAndOneGemmPerFormatAndLevel) {
  ContextPtr ctx = make_context(Isa::kScalar, 1);
  uint32_t count = 0;
  ASSERT_EQ(qmoe_context_get_kernel_count(ctx.get(), &count), QMOE_STATUS_OK);
  // Six operations (four conversions, the read kernel, the activation quantizer) and each
  // format's exact and fast GEMMs, for every format this build has; a format is available at
  // the block size of this table, which names every format.
  const std::map<int, uint32_t> kBlockOf = {{QMOE_WEIGHT_FORMAT_INT4, 32},
                                            {QMOE_WEIGHT_FORMAT_INT3, 32},
                                            {QMOE_WEIGHT_FORMAT_MXFP4, 32},
                                            {QMOE_WEIGHT_FORMAT_NVFP4, 16}};
  ASSERT_EQ(count, 6u + 2u * format_count());
  std::set<std::string> names, operations;
  std::set<int> formats;
  uint32_t gemms = 0;
  for (uint32_t i = 0; i < count; ++i) {
    qmoe_kernel_info info;
    std::memset(&info, 0xAB, sizeof info);
    info.struct_size = sizeof info;
    ASSERT_EQ(qmoe_context_get_kernel_info(ctx.get(), i, &info), QMOE_STATUS_OK);
    ASSERT_NE(info.name, nullptr);
    ASSERT_NE(info.operation, nullptr);
    names.insert(info.name);
    operations.insert(info.operation);
    if (std::string(info.operation) == "gemm") {
      ++gemms;
      EXPECT_NE(find_format(info.format), nullptr) << info.name;
      formats.insert(info.format);
      ASSERT_EQ(kBlockOf.count(info.format), 1u) << info.name;
      EXPECT_TRUE(info.accuracy == QMOE_ACCURACY_EXACT || info.accuracy == QMOE_ACCURACY_FAST);
      const char* available_name = nullptr;
      int available = 0;
      ASSERT_EQ(qmoe_gemm_kernel_available(ctx.get(), info.format, kBlockOf.at(info.format),
                                           info.accuracy, &available, &available_name),
                QMOE_STATUS_OK);
      EXPECT_STREQ(available_name, info.name);
    } else {
      EXPECT_EQ(static_cast<int>(info.format), 0) << info.name;
      EXPECT_EQ(static_cast<int>(info.accuracy), 0) << info.name;
    }
    EXPECT_EQ(std::string(info.name).rfind(std::string("qmoe_") + info.operation, 0), 0u)
        << info.name;
  }
  EXPECT_EQ(names.size(), count);
  EXPECT_EQ(count, 6u + gemms);
  EXPECT_EQ(formats.size(), format_count());
  EXPECT_EQ(gemms, 2u * formats.size());
  const std::set<std::string> expected = {"convert_f16_to_f32",
                                          "convert_f32_to_f16",
                                          "convert_bf16_to_f32",
                                          "convert_f32_to_bf16",
                                          "read_bandwidth",
                                          "quantize_activations_q8",
                                          "gemm"};
  EXPECT_EQ(operations, expected);
}

TEST(KernelInfo, RejectsBadArguments) {
  ContextPtr ctx = make_context(Isa::kScalar, 1);
  uint32_t count = 0;
  ASSERT_EQ(qmoe_context_get_kernel_count(ctx.get(), &count), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_context_get_kernel_count(ctx.get(), nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_context_get_kernel_count(nullptr, &count), QMOE_STATUS_INVALID_CONTEXT);
  qmoe_kernel_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  EXPECT_EQ(qmoe_context_get_kernel_info(ctx.get(), count, &info), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(info.name, nullptr);
  EXPECT_EQ(qmoe_context_get_kernel_info(ctx.get(), 0xFFFFFFFFu, &info),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_context_get_kernel_info(ctx.get(), 0, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  info.struct_size = sizeof info - 1;
  EXPECT_EQ(qmoe_context_get_kernel_info(ctx.get(), 0, &info), QMOE_STATUS_INVALID_ARGUMENT);
  info.struct_size = 0;
  EXPECT_EQ(qmoe_context_get_kernel_info(ctx.get(), 0, &info), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(info.name, nullptr);
}

TEST(IsaFromName, NamesEveryTierAndNothingElse) {
  const struct {
    const char* name;
    qmoe_isa isa;
  } tiers[] = {{"scalar", QMOE_ISA_SCALAR},
               {"avx2", QMOE_ISA_AVX2},
               {"AVX512", QMOE_ISA_AVX512},
               {"Avx2", QMOE_ISA_AVX2}};
  for (const auto& t : tiers) {
    qmoe_isa isa = QMOE_ISA_DEFAULT;
    ASSERT_EQ(qmoe_isa_from_name(t.name, &isa), QMOE_STATUS_OK) << t.name;
    EXPECT_EQ(isa, t.isa) << t.name;
    // And back: qmoe_isa_name gives the lower-case name.
    std::string lower(t.name);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(qmoe_isa_name(isa), lower);
  }
  for (const char* bad : {"default", "", "avx", "avx512f", "sse4", "scalar "}) {
    qmoe_isa isa = QMOE_ISA_AVX2;
    EXPECT_EQ(qmoe_isa_from_name(bad, &isa), QMOE_STATUS_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(isa, QMOE_ISA_AVX2) << bad;
  }
  qmoe_isa isa = QMOE_ISA_DEFAULT;
  EXPECT_EQ(qmoe_isa_from_name(nullptr, &isa), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_isa_from_name("avx2", nullptr), QMOE_STATUS_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace qmoe::testing
