// The CUDA ABI's host-side checks (lib/cuda_api.cc), which run in every build and on every
// machine: bad arguments are INVALID_ARGUMENT (or UNSUPPORTED_FORMAT) before any CUDA call, and
// good ones then reach the backend: CUDA_UNAVAILABLE without a usable device or without CUDA,
// a created set where a device is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "qmoe/qmoe_cuda.h"
#include "tests/cuda/cuda_set_util.h"
#include "tests/gemm/fp4_reference.h"
#include "tests/gemm/int3_reference.h"
#include "tests/gemm/int4_reference.h"
#include "tests/moe/moe_fp4_reference.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {
namespace {

bool device_usable() {
  int count = 0;
  return qmoe_cuda_get_device_count(&count) == QMOE_STATUS_OK && count > 0;
}

// The small layer the expert-set checks use: 4 experts, H = 64, I = 32.
MoeOptions small_layer() {
  MoeOptions o;
  o.experts = 4;
  o.hidden = 64;
  o.intermediate = 32;
  return o;
}

TEST(CudaApiChecks, GemmRefusesBadArgumentsBeforeCuda) {
  std::mt19937_64 rng(3);
  Int4Options o;
  o.n = 16;
  o.k = 64;
  const Int4Matrix w = make_int4_matrix(o, rng);
  std::vector<float> x(o.k), y(o.n);
  auto gemm = [&](const qmoe_quant_matrix* d, qmoe_accuracy level, uint32_t m, const void* xp,
                  void* yp, uint32_t n0, uint32_t n1, qmoe_dtype xd = QMOE_DTYPE_F32) {
    return qmoe_cuda_gemm(d, level, m, xd, xp, o.k, QMOE_DTYPE_F32, yp, o.n, n0, n1, nullptr);
  };
  EXPECT_EQ(gemm(nullptr, QMOE_ACCURACY_FAST, 1, x.data(), y.data(), 0, 16),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, static_cast<qmoe_accuracy>(7), 1, x.data(), y.data(), 0, 16),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, QMOE_ACCURACY_FAST, 0, x.data(), y.data(), 0, 16),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, QMOE_ACCURACY_FAST, 1, nullptr, y.data(), 0, 16),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, QMOE_ACCURACY_FAST, 1, x.data(), nullptr, 0, 16),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, QMOE_ACCURACY_FAST, 1, x.data(), y.data(), 8, 8),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, QMOE_ACCURACY_FAST, 1, x.data(), y.data(), 0, 17),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, QMOE_ACCURACY_FAST, 1, x.data(), y.data(), 0, 16,
                 static_cast<qmoe_dtype>(QMOE_DTYPE_E8M0)),
            QMOE_STATUS_INVALID_ARGUMENT);
  qmoe_quant_matrix d = w.desc;
  d.codes = static_cast<const unsigned char*>(d.codes) + 4;  // not 16-byte aligned
  EXPECT_EQ(gemm(&d, QMOE_ACCURACY_FAST, 1, x.data(), y.data(), 0, 16),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("aligned"), std::string::npos);
  d = w.desc;
  d.format = static_cast<qmoe_weight_format>(77);
  EXPECT_EQ(gemm(&d, QMOE_ACCURACY_FAST, 1, x.data(), y.data(), 0, 16),
            QMOE_STATUS_UNSUPPORTED_FORMAT);
  // Everything the host can check is right: host pointers are refused where a device exists,
  // and without one the call says CUDA is unavailable.
  const qmoe_status status = gemm(&w.desc, QMOE_ACCURACY_FAST, 1, x.data(), y.data(), 0, 16);
  EXPECT_EQ(status, device_usable() ? QMOE_STATUS_INVALID_ARGUMENT : QMOE_STATUS_CUDA_UNAVAILABLE)
      << qmoe_last_error_message();
}

TEST(CudaApiChecks, ExpertSetCreationRefusesBadDescriptions) {
  std::mt19937_64 rng(4);
  const auto model = make_moe_model(small_layer(), rng);
  const HostSet host = make_host_set(model->desc);
  ASSERT_TRUE(host);

  qmoe_cuda_expert_set_desc good;
  std::memset(&good, 0xCD, sizeof good);
  qmoe_cuda_expert_set_desc_init(&good);
  EXPECT_EQ(good.struct_size, sizeof good);
  EXPECT_EQ(good.device, 0);
  EXPECT_EQ(good.experts, nullptr);
  EXPECT_EQ(good.resident, nullptr);
  EXPECT_EQ(good.copy_mode, QMOE_CUDA_COPY_BATCHED);
  EXPECT_EQ(good.num_slots, 0u);
  good.experts = host.get();
  auto create = [](const qmoe_cuda_expert_set_desc* d) {
    qmoe_cuda_expert_set* set = reinterpret_cast<qmoe_cuda_expert_set*>(0x1);
    const qmoe_status s = qmoe_cuda_expert_set_create(d, &set);
    if (s != QMOE_STATUS_OK) {
      EXPECT_EQ(set, nullptr);
    } else {
      EXPECT_EQ(qmoe_cuda_expert_set_destroy(set), QMOE_STATUS_OK);
    }
    return s;
  };
  auto with = [&](auto&& edit) {
    qmoe_cuda_expert_set_desc d = good;
    edit(d);
    return create(&d);
  };
  EXPECT_EQ(create(nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_cuda_expert_set_create(&good, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.struct_size = 8; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.experts = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.device = -1; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.copy_mode = static_cast<qmoe_cuda_copy_mode>(5); }),
            QMOE_STATUS_INVALID_ARGUMENT);
  const uint32_t out_of_range[] = {1, 4};
  const uint32_t twice[] = {2, 0, 2};
  EXPECT_EQ(with([&](auto& d) {
              d.resident = out_of_range;
              d.num_resident = 2;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([&](auto& d) {
              d.resident = twice;
              d.num_resident = 3;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([&](auto& d) {
              d.resident = twice;
              d.num_resident = 0;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  // Slots: at least the resident experts, at most E; a set may start empty only with slots.
  const uint32_t two[] = {3, 1};
  EXPECT_EQ(with([&](auto& d) {
              d.resident = two;
              d.num_resident = 2;
              d.num_slots = 1;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([&](auto& d) { d.num_slots = 3; }), QMOE_STATUS_INVALID_ARGUMENT);  // all 4
  EXPECT_EQ(with([&](auto& d) { d.num_slots = 5; }), QMOE_STATUS_INVALID_ARGUMENT);
  // A struct_size ending inside num_slots is no version of the struct.
  EXPECT_EQ(
      with([](auto& d) { d.struct_size = offsetof(qmoe_cuda_expert_set_desc, num_slots) + 2; }),
      QMOE_STATUS_INVALID_ARGUMENT);
  // A destroyed host set.
  qmoe_expert_set* gone = nullptr;
  ASSERT_EQ(qmoe_expert_set_create(&model->desc, &gone), QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_expert_set_destroy(gone), QMOE_STATUS_OK);
  EXPECT_EQ(with([&](auto& d) { d.experts = gone; }), QMOE_STATUS_INVALID_ARGUMENT);
  // A good description: a set where a device is usable, CUDA_UNAVAILABLE elsewhere.
  EXPECT_EQ(create(&good), device_usable() ? QMOE_STATUS_OK : QMOE_STATUS_CUDA_UNAVAILABLE)
      << qmoe_last_error_message();
  // So do the first version of the struct (no num_slots: the default), an empty start with
  // slots, and spare slots.
  const qmoe_status reached = device_usable() ? QMOE_STATUS_OK : QMOE_STATUS_CUDA_UNAVAILABLE;
  EXPECT_EQ(with([](auto& d) {
              d.struct_size = offsetof(qmoe_cuda_expert_set_desc, num_slots);
              d.num_slots = 1;  // past the caller's struct: never read
            }),
            reached)
      << qmoe_last_error_message();
  EXPECT_EQ(with([&](auto& d) {
              d.resident = twice;
              d.num_resident = 0;
              d.num_slots = 2;
            }),
            reached)
      << qmoe_last_error_message();
  EXPECT_EQ(with([&](auto& d) {
              d.resident = two;
              d.num_resident = 2;
              d.num_slots = 3;
            }),
            reached)
      << qmoe_last_error_message();
}

TEST(CudaApiChecks, ResidencyUpdateRefusesBadHandlesBeforeCuda) {
  std::mt19937_64 rng(5);
  const auto model = make_moe_model(small_layer(), rng);
  const HostSet host = make_host_set(model->desc);
  ASSERT_TRUE(host);
  const uint32_t ids[] = {0, 2};
  uint32_t copied = 7;
  EXPECT_EQ(qmoe_cuda_expert_set_update_residency(nullptr, host.get(), ids, 2, nullptr, &copied),
            QMOE_STATUS_INVALID_ARGUMENT);
  uint64_t junk[8] = {};
  auto* not_a_set = reinterpret_cast<qmoe_cuda_expert_set*>(junk);
  EXPECT_EQ(qmoe_cuda_expert_set_update_residency(not_a_set, host.get(), ids, 2, nullptr, &copied),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(copied, 7u);
  if (!device_usable()) GTEST_SKIP() << "no usable CUDA device: the set-dependent checks need one";
  qmoe_cuda_expert_set_desc d;
  qmoe_cuda_expert_set_desc_init(&d);
  d.experts = host.get();
  d.resident = ids;
  d.num_resident = 2;
  qmoe_cuda_expert_set* set = nullptr;
  ASSERT_EQ(qmoe_cuda_expert_set_create(&d, &set), QMOE_STATUS_OK) << qmoe_last_error_message();
  const uint32_t out_of_range[] = {4}, twice[] = {1, 1}, three[] = {0, 1, 2};
  auto update = [&](const qmoe_expert_set* h, const uint32_t* r, uint32_t n) {
    return qmoe_cuda_expert_set_update_residency(set, h, r, n, nullptr, &copied);
  };
  EXPECT_EQ(update(nullptr, ids, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(update(host.get(), out_of_range, 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(update(host.get(), twice, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(update(host.get(), three, 3), QMOE_STATUS_INVALID_ARGUMENT);  // 2 slots
  EXPECT_EQ(update(host.get(), nullptr, 1), QMOE_STATUS_INVALID_ARGUMENT);
  // A host set of another shape.
  MoeOptions wider = small_layer();
  wider.hidden = 128;
  const auto other = make_moe_model(wider, rng);
  const HostSet other_host = make_host_set(other->desc);
  ASSERT_TRUE(other_host);
  EXPECT_EQ(update(other_host.get(), ids, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(update(host.get(), nullptr, 0), QMOE_STATUS_OK) << qmoe_last_error_message();
  EXPECT_EQ(copied, 0u);
  EXPECT_EQ(qmoe_cuda_expert_set_destroy(set), QMOE_STATUS_OK);
  EXPECT_EQ(update(host.get(), ids, 2), QMOE_STATUS_INVALID_ARGUMENT);  // destroyed
}

// The begun update takes update_residency's checks (one function makes them for both) and
// refuses bad handles and a NULL `finished` before any CUDA call, in every build.
TEST(CudaApiChecks, BegunResidencyUpdateRefusesBadArgumentsBeforeCuda) {
  std::mt19937_64 rng(5);
  const auto model = make_moe_model(small_layer(), rng);
  const HostSet host = make_host_set(model->desc);
  ASSERT_TRUE(host);
  const uint32_t ids[] = {0, 2};
  uint32_t copied = 7;
  int finished = 7;
  uint64_t junk[8] = {};
  auto* not_a_set = reinterpret_cast<qmoe_cuda_expert_set*>(junk);
  for (qmoe_cuda_expert_set* bad : {static_cast<qmoe_cuda_expert_set*>(nullptr), not_a_set}) {
    EXPECT_EQ(qmoe_cuda_expert_set_begin_residency_update(bad, host.get(), ids, 2, nullptr, nullptr,
                                                          &copied),
              QMOE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(qmoe_cuda_expert_set_finish_residency_update(bad, nullptr, 0, &finished),
              QMOE_STATUS_INVALID_ARGUMENT);
  }
  EXPECT_EQ(copied, 7u);
  EXPECT_EQ(finished, 7);
  if (!device_usable()) GTEST_SKIP() << "no usable CUDA device: the set-dependent checks need one";
  qmoe_cuda_expert_set_desc d;
  qmoe_cuda_expert_set_desc_init(&d);
  d.experts = host.get();
  d.resident = ids;
  d.num_resident = 2;
  qmoe_cuda_expert_set* set = nullptr;
  ASSERT_EQ(qmoe_cuda_expert_set_create(&d, &set), QMOE_STATUS_OK) << qmoe_last_error_message();
  const uint32_t twice[] = {1, 1}, three[] = {0, 1, 2};
  auto begin = [&](const qmoe_expert_set* h, const uint32_t* r, uint32_t n) {
    return qmoe_cuda_expert_set_begin_residency_update(set, h, r, n, nullptr, nullptr, &copied);
  };
  EXPECT_EQ(begin(nullptr, ids, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(begin(host.get(), twice, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(begin(host.get(), three, 3), QMOE_STATUS_INVALID_ARGUMENT);  // 2 slots
  EXPECT_EQ(qmoe_cuda_expert_set_finish_residency_update(set, nullptr, 0, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  // Nothing begun: finished at once.
  EXPECT_EQ(qmoe_cuda_expert_set_finish_residency_update(set, nullptr, 0, &finished),
            QMOE_STATUS_OK)
      << qmoe_last_error_message();
  EXPECT_EQ(finished, 1);
  // One begun update at a time, and no plain update beside it.
  const uint32_t next[] = {1};
  ASSERT_EQ(begin(host.get(), next, 1), QMOE_STATUS_OK) << qmoe_last_error_message();
  EXPECT_EQ(copied, 1u);
  EXPECT_EQ(begin(host.get(), ids, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_cuda_expert_set_update_residency(set, host.get(), ids, 2, nullptr, &copied),
            QMOE_STATUS_INVALID_ARGUMENT);
  ASSERT_EQ(qmoe_cuda_expert_set_finish_residency_update(set, nullptr, 1, &finished),
            QMOE_STATUS_OK)
      << qmoe_last_error_message();
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(begin(host.get(), ids, 2), QMOE_STATUS_OK) << qmoe_last_error_message();
  EXPECT_EQ(qmoe_cuda_expert_set_destroy(set), QMOE_STATUS_OK);  // with an update begun
}

TEST(CudaApiChecks, LayerCallsRefuseBadHandlesAndParams) {
  qmoe_cuda_moe_params p;
  std::memset(&p, 0xCD, sizeof p);
  qmoe_cuda_moe_params_init(&p);
  EXPECT_EQ(p.struct_size, sizeof p);
  EXPECT_EQ(p.accuracy, QMOE_ACCURACY_FAST);
  EXPECT_EQ(p.dtype, QMOE_DTYPE_F32);
  EXPECT_EQ(p.renormalize, 1);
  EXPECT_EQ(p.accumulate, 0);
  EXPECT_EQ(p.m, nullptr);
  EXPECT_EQ(p.workspace, nullptr);
  EXPECT_EQ(p.expected_tokens_per_expert, 0.0f);
  EXPECT_EQ(p.expert_counts, nullptr);
  qmoe_cuda_moe_params_init(nullptr);
  qmoe_cuda_expert_set_desc_init(nullptr);
  EXPECT_EQ(qmoe_cuda_moe_forward(nullptr, &p, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  // Not a set: any other pointer is rejected by its magic, never dereferenced as a set.
  uint64_t junk[8] = {};
  const auto* not_a_set = reinterpret_cast<const qmoe_cuda_expert_set*>(junk);
  EXPECT_EQ(qmoe_cuda_moe_forward(not_a_set, &p, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  size_t bytes = 0;
  EXPECT_EQ(qmoe_cuda_moe_workspace_size(nullptr, QMOE_ACCURACY_FAST, 1, 1, &bytes),
            QMOE_STATUS_INVALID_ARGUMENT);
  const int32_t* map = nullptr;
  EXPECT_EQ(qmoe_cuda_expert_set_residency(not_a_set, &map), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_cuda_expert_set_destroy(nullptr), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_cuda_moe_check(nullptr, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
}

// The GPU kernels read INT4, INT3, MXFP4 and NVFP4: a matrix of each passes the format check
// at M <= 8 (the GEMV) and above (the tensor-core GEMM or the GEMV 8 rows at a time) and reaches
// the device checks (host pointers refused where a device is usable, CUDA_UNAVAILABLE
// without one); a format value the library does not know is still UNSUPPORTED_FORMAT.
TEST(CudaApiChecks, GemmTakesEveryGpuFormatAndRefusesAnUnknownOne) {
  std::mt19937_64 rng(5);
  Int4Options o;
  o.n = 16;
  o.k = 64;
  const Int4Matrix int4 = make_int4_matrix(o, rng);
  const Int4Matrix int3 = make_int3_matrix(o, rng);
  ASSERT_EQ(int3.desc.format, QMOE_WEIGHT_FORMAT_INT3);
  std::vector<const qmoe_quant_matrix*> matrices = {&int4.desc, &int3.desc};
  std::vector<Fp4Matrix> fp4;
  for (qmoe_weight_format format : {QMOE_WEIGHT_FORMAT_MXFP4, QMOE_WEIGHT_FORMAT_NVFP4}) {
    Fp4Options f;
    f.format = format;
    f.n = o.n;
    f.k = o.k;
    fp4.push_back(make_fp4_matrix(f, rng));
  }
  for (const Fp4Matrix& w : fp4) matrices.push_back(&w.desc);
  const qmoe_status past_the_format =
      device_usable() ? QMOE_STATUS_INVALID_ARGUMENT : QMOE_STATUS_CUDA_UNAVAILABLE;
  for (const qmoe_quant_matrix* w : matrices) {
    for (uint32_t m : {1u, 8u, 9u, 17u}) {
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        std::vector<float> x(size_t{m} * w->k), y(size_t{m} * w->n);
        EXPECT_EQ(qmoe_cuda_gemm(w, level, m, QMOE_DTYPE_F32, x.data(), w->k, QMOE_DTYPE_F32,
                                 y.data(), w->n, 0, w->n, nullptr),
                  past_the_format)
            << "format " << w->format << " m " << m << ": " << qmoe_last_error_message();
        EXPECT_EQ(std::string(qmoe_last_error_message()).find("no GPU kernels"), std::string::npos)
            << "format " << w->format << ": " << qmoe_last_error_message();
      }
    }
  }
  std::vector<float> x(o.k), y(o.n);
  for (int unknown : {77, -1}) {
    qmoe_quant_matrix d = int3.desc;
    d.format = static_cast<qmoe_weight_format>(unknown);
    EXPECT_EQ(qmoe_cuda_gemm(&d, QMOE_ACCURACY_FAST, 1, QMOE_DTYPE_F32, x.data(), o.k,
                             QMOE_DTYPE_F32, y.data(), o.n, 0, o.n, nullptr),
              QMOE_STATUS_UNSUPPORTED_FORMAT)
        << "format " << unknown << ": " << qmoe_last_error_message();
  }
}

// A GPU expert set takes one format for all its projections: an MXFP4 set reaches the backend,
// a set mixing MXFP4 and NVFP4 experts (which the CPU runs) is UNSUPPORTED_FORMAT, whichever
// projection differs, resident or not.
TEST(CudaApiChecks, ExpertSetTakesOneFormat) {
  std::mt19937_64 rng(6);
  const std::unique_ptr<Fp4Experts> mx = make_fp4_experts(QMOE_WEIGHT_FORMAT_MXFP4, 3, 64, 32, rng);
  const std::unique_ptr<Fp4Experts> nv = make_fp4_experts(QMOE_WEIGHT_FORMAT_NVFP4, 3, 64, 32, rng);
  ASSERT_NE(mx->set, nullptr);
  ASSERT_NE(nv->set, nullptr);
  EXPECT_EQ(gpu_set_status(mx->set.get(), nullptr, 0),
            device_usable() ? QMOE_STATUS_OK : QMOE_STATUS_CUDA_UNAVAILABLE)
      << qmoe_last_error_message();
  qmoe_expert_set_desc desc;
  qmoe_expert_set_desc_init(&desc);
  desc.num_experts = 3;
  desc.hidden = 64;
  desc.intermediate = 32;
  desc.swiglu_fusion = QMOE_SWIGLU_INTERLEAVED;
  desc.fc1 = mx->fc1_desc.data();
  desc.fc2 = mx->fc2_desc.data();
  for (bool fc2 : {false, true}) {
    const HostSet mixed =
        host_set_replacing(desc, 2, fc2, fc2 ? &nv->fc2[2].desc : &nv->fc1[2].desc);
    ASSERT_TRUE(mixed);
    const uint32_t first_two[] = {0, 1};  // the odd expert not resident: refused all the same
    EXPECT_EQ(gpu_set_status(mixed.get(), nullptr, 0), QMOE_STATUS_UNSUPPORTED_FORMAT);
    EXPECT_NE(std::string(qmoe_last_error_message()).find(fc2 ? "expert 2 fc2" : "expert 2 fc1"),
              std::string::npos)
        << qmoe_last_error_message();
    EXPECT_EQ(gpu_set_status(mixed.get(), first_two, 2), QMOE_STATUS_UNSUPPORTED_FORMAT);
  }
}

// INT3 experts pass the GPU set's format checks (a set where a device is usable,
// CUDA_UNAVAILABLE without one); a set mixing INT3 and INT4 projections is UNSUPPORTED_FORMAT
// before any CUDA call, whichever projection differs, resident or not.
TEST(CudaApiChecks, ExpertSetTakesInt3ExpertsButNotMixedWithInt4) {
  std::mt19937_64 rng(7);
  const MoeOptions o = small_layer();
  const std::unique_ptr<MoeModel> int3 = make_moe_model(o, rng, make_int3_matrix);
  const std::unique_ptr<MoeModel> int4 = make_moe_model(o, rng);
  ASSERT_EQ(int3->fc1[0].desc.format, QMOE_WEIGHT_FORMAT_INT3);
  const HostSet host3 = make_host_set(int3->desc);
  ASSERT_TRUE(host3);
  EXPECT_EQ(gpu_set_status(host3.get(), nullptr, 0),
            device_usable() ? QMOE_STATUS_OK : QMOE_STATUS_CUDA_UNAVAILABLE)
      << qmoe_last_error_message();
  for (bool fc2 : {false, true}) {
    const HostSet mixed =
        host_set_replacing(int3->desc, 3, fc2, fc2 ? &int4->fc2[3].desc : &int4->fc1[3].desc);
    ASSERT_TRUE(mixed);
    EXPECT_EQ(gpu_set_status(mixed.get(), nullptr, 0), QMOE_STATUS_UNSUPPORTED_FORMAT)
        << qmoe_last_error_message();
    EXPECT_NE(std::string(qmoe_last_error_message()).find(fc2 ? "expert 3 fc2" : "expert 3 fc1"),
              std::string::npos)
        << qmoe_last_error_message();
    const uint32_t first_three[] = {0, 1, 2};  // the INT4 expert not resident: refused all the same
    EXPECT_EQ(gpu_set_status(mixed.get(), first_three, 3), QMOE_STATUS_UNSUPPORTED_FORMAT);
  }
}

}  // namespace
}  // namespace qmoe::testing
