// The CUDA ABI (include/qmoe/qmoe_cuda.h): host-side argument checks, then the CUDA backend
// (lib/cuda_backend.h), or QMOE_STATUS_CUDA_UNAVAILABLE in a build without one.
//
// Handles: as with contexts (lib/context_api.cc), a qmoe_cuda_expert_set is a shell {magic,
// backend object} that is never returned to the allocator, so a destroyed handle is rejected.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <new>
#include <vector>

#include "lib/abi_enum.h"
#include "lib/cuda_backend.h"
#include "lib/cuda_handles.h"
#include "lib/cuda_moe_params.h"
#include "lib/distinct_ids.h"
#include "lib/error.h"
#include "lib/formats/quant_matrix.h"
#include "lib/gemm/activation_dtype.h"
#include "lib/handle_pool.h"
#include "lib/moe/expert_set.h"
#include "lib/struct_size.h"
#include "qmoe/qmoe_cuda.h"

struct qmoe_cuda_expert_set {
  std::atomic<uint64_t> magic{0};
  // Written only while the shell is not live (see qmoe_context in lib/context_api.cc).
  void* set = nullptr;       // the backend's object
  uint32_t num_experts = 0;  // E, for the forward's checks
  uint32_t hidden = 0;       // H
  // For the residency update's checks: the slots, and the shape, SwiGLU and format a host set
  // must have to fill them (as describe_host_set gives them).
  uint32_t num_slots = 0;
  uint32_t intermediate = 0;
  bool interleaved = false;
  float alpha = 0.0f, beta = 0.0f, limit = 0.0f;
  qmoe_weight_format format = QMOE_WEIGHT_FORMAT_INT4;
};

namespace qmoe {
namespace {

constexpr uint64_t kLiveMagic = 0x716d6f652d677075ull;  // "qmoe-gpu"
constexpr uint64_t kDeadMagic = 0x716d6f652d676464ull;  // "qmoe-gdd"
constexpr size_t kWorkspaceAlignment = 256;

qmoe_status resolve(const qmoe_cuda_expert_set* handle, const char* function) {
  return check_handle(handle, &qmoe_cuda_expert_set::set, kLiveMagic, kDeadMagic,
                      QMOE_STATUS_INVALID_ARGUMENT, function, "set", "qmoe CUDA expert set");
}

bool same_bits(float a, float b) {
  uint32_t x = 0, y = 0;
  std::memcpy(&x, &a, sizeof x);
  std::memcpy(&y, &b, sizeof y);
  return x == y;
}

bool valid_accuracy(int32_t a) {
  return a == QMOE_ACCURACY_EXACT || a == QMOE_ACCURACY_FAST;
}

// The formats the GPU kernels read: INT4, INT3, MXFP4 and NVFP4 (lib/cuda/decode_formats.cuh
// lists their decode policies; this host file has no CUDA headers).
qmoe_status check_gpu_format(const qmoe_quant_matrix& w, const char* function, const char* what) {
  if (w.format != QMOE_WEIGHT_FORMAT_INT4 && w.format != QMOE_WEIGHT_FORMAT_INT3 &&
      w.format != QMOE_WEIGHT_FORMAT_MXFP4 && w.format != QMOE_WEIGHT_FORMAT_NVFP4) {
    return fail(QMOE_STATUS_UNSUPPORTED_FORMAT, function,
                "%s: format %d has no GPU kernels (INT4, INT3, MXFP4 and NVFP4 have)", what,
                static_cast<int>(w.format));
  }
  return QMOE_STATUS_OK;
}

// Distinct ids in [0, e_count).
// The MoE layer's kernels are compiled per format and launched once per layer call: every
// expert's FC1 and FC2 must have one format. All E are checked, resident or not, so that any
// expert may later take a slot.
qmoe_status check_gpu_set_format(const std::vector<qmoe_quant_matrix>& fc1,
                                 const std::vector<qmoe_quant_matrix>& fc2, const char* function) {
  const qmoe_weight_format format = fc1[0].format;
  for (size_t e = 0; e < fc1.size(); ++e) {
    const bool fc1_other = fc1[e].format != format;
    if (fc1_other || fc2[e].format != format) {
      return fail(QMOE_STATUS_UNSUPPORTED_FORMAT, function,
                  "expert %zu %s is format %d, expert 0's fc1 format %d: a GPU expert set takes "
                  "one format for every projection (a mixed set runs on the CPU)",
                  e, fc1_other ? "fc1" : "fc2",
                  static_cast<int>(fc1_other ? fc1[e].format : fc2[e].format),
                  static_cast<int>(format));
    }
  }
  return QMOE_STATUS_OK;
}

// A host set's experts as the upload reads them (every format checked for GPU kernels, and one
// format for the whole set), with the set's shape; upload's device, residency and copy mode are
// the caller's to fill.
qmoe_status describe_host_set(const ExpertSet& host, const char* function,
                              std::vector<qmoe_quant_matrix>* fc1,
                              std::vector<qmoe_quant_matrix>* fc2, CudaExpertUpload* upload) {
  const uint32_t e_count = host.num_experts;
  try {
    fc1->resize(e_count);
    fc2->resize(e_count);
  } catch (const std::bad_alloc&) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating %u descriptions failed", e_count);
  }
  for (uint32_t e = 0; e < e_count; ++e) {
    (*fc1)[e] = host.fc1[e].w;
    (*fc2)[e] = host.fc2[e].w;
    if (qmoe_status s = check_gpu_format((*fc1)[e], function, "an expert's fc1");
        s != QMOE_STATUS_OK) {
      return s;
    }
    if (qmoe_status s = check_gpu_format((*fc2)[e], function, "an expert's fc2");
        s != QMOE_STATUS_OK) {
      return s;
    }
  }
  if (qmoe_status s = check_gpu_set_format(*fc1, *fc2, function); s != QMOE_STATUS_OK) return s;
  *upload = CudaExpertUpload{};
  upload->num_experts = e_count;
  upload->hidden = host.hidden;
  upload->intermediate = host.intermediate;
  upload->interleaved = host.interleaved;
  upload->alpha = host.alpha;
  upload->beta = host.beta;
  upload->limit = host.clamp ? host.limit : INFINITY;
  upload->fc1 = fc1->data();
  upload->fc2 = fc2->data();
  return QMOE_STATUS_OK;
}

const FieldSpan kExpertSetDescFields[] = {
    QMOE_FIELD(qmoe_cuda_expert_set_desc, num_slots),
};

qmoe_status create(const qmoe_cuda_expert_set_desc* desc_in, qmoe_cuda_expert_set** set,
                   const char* function) {
  if (set == nullptr)
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "set out-pointer is NULL");
  *set = nullptr;
  if (desc_in == nullptr) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "desc is NULL");
  // The first version ended at copy_mode; fields past the caller's struct take their defaults.
  if (!struct_size_ok(desc_in->struct_size, offsetof(qmoe_cuda_expert_set_desc, num_slots),
                      kExpertSetDescFields)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "desc->struct_size is %zu, not the size of any version of the struct; set it to "
                "sizeof(qmoe_cuda_expert_set_desc) (%zu)",
                desc_in->struct_size, sizeof(qmoe_cuda_expert_set_desc));
  }
  qmoe_cuda_expert_set_desc desc_copy;
  qmoe_cuda_expert_set_desc_init(&desc_copy);
  std::memcpy(&desc_copy, desc_in, std::min(desc_in->struct_size, sizeof desc_copy));
  const qmoe_cuda_expert_set_desc* desc = &desc_copy;
  const ExpertSet* host = nullptr;
  if (qmoe_status s = resolve_expert_set(desc->experts, function, &host); s != QMOE_STATUS_OK) {
    return s;
  }
  if (desc->device < 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "device %d is negative", desc->device);
  }
  const int32_t mode = enum_bits(desc->copy_mode);
  if (mode != QMOE_CUDA_COPY_BATCHED && mode != QMOE_CUDA_COPY_LOOP) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "copy_mode %d is not a qmoe_cuda_copy_mode",
                mode);
  }
  const uint32_t e_count = host->num_experts;
  const uint32_t resident_count = desc->resident != nullptr ? desc->num_resident : e_count;
  const uint32_t slots = desc->num_slots != 0 ? desc->num_slots : resident_count;
  if (desc->resident != nullptr) {
    if (desc->num_resident > e_count || (desc->num_resident == 0 && desc->num_slots == 0)) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "num_resident = %u must be in [1, %u] (0 only with num_slots set)",
                  desc->num_resident, e_count);
    }
    if (qmoe_status s =
            check_distinct_ids(desc->resident, desc->num_resident, e_count, "resident", function);
        s != QMOE_STATUS_OK) {
      return s;
    }
  }
  if (slots < resident_count || slots > e_count) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "num_slots = %u must be in [%u, %u] (the resident experts to E)", desc->num_slots,
                resident_count, e_count);
  }
  std::vector<qmoe_quant_matrix> fc1, fc2;
  CudaExpertUpload upload{};
  if (qmoe_status s = describe_host_set(*host, function, &fc1, &fc2, &upload);
      s != QMOE_STATUS_OK) {
    return s;
  }
  const CudaBackend* backend = cuda_backend_or_fail(function);
  if (backend == nullptr) return QMOE_STATUS_CUDA_UNAVAILABLE;
  upload.device = desc->device;
  upload.resident = desc->resident;
  upload.num_resident = resident_count;
  upload.num_slots = slots;
  upload.batched = mode == QMOE_CUDA_COPY_BATCHED;
  void* impl = nullptr;
  if (qmoe_status s = backend->create_expert_set(function, upload, &impl); s != QMOE_STATUS_OK) {
    return s;
  }
  qmoe_cuda_expert_set* shell = HandlePool<qmoe_cuda_expert_set>::acquire();
  if (shell == nullptr) {
    backend->destroy_expert_set(impl);
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the set handle failed");
  }
  shell->set = impl;
  shell->num_experts = e_count;
  shell->hidden = host->hidden;
  shell->num_slots = slots;
  shell->intermediate = upload.intermediate;
  shell->interleaved = upload.interleaved;
  shell->alpha = upload.alpha;
  shell->beta = upload.beta;
  shell->limit = upload.limit;
  shell->format = upload.fc1[0].format;  // one per set (describe_host_set)
  shell->magic.store(kLiveMagic, std::memory_order_release);
  *set = shell;
  return QMOE_STATUS_OK;
}

// The checks of qmoe_gemm_typed that need no device memory.
qmoe_status check_gemm(const qmoe_quant_matrix* weights, qmoe_accuracy accuracy, uint32_t m,
                       qmoe_dtype x_dtype, const void* x, size_t ldx, qmoe_dtype y_dtype,
                       const void* y, size_t ldy, uint32_t n_begin, uint32_t n_end,
                       const char* function, qmoe_quant_matrix* w) {
  if (qmoe_status s = validate_quant_matrix(weights, function, w); s != QMOE_STATUS_OK) return s;
  if (qmoe_status s = check_gpu_format(*w, function, "weights"); s != QMOE_STATUS_OK) return s;
  if (!valid_accuracy(enum_bits(accuracy))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "accuracy %d is not a qmoe_accuracy",
                enum_bits(accuracy));
  }
  if (!is_activation_dtype(static_cast<qmoe_dtype>(enum_bits(x_dtype))) ||
      !is_activation_dtype(static_cast<qmoe_dtype>(enum_bits(y_dtype)))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "x_dtype %d or y_dtype %d is not F32, F16 or BF16", enum_bits(x_dtype),
                enum_bits(y_dtype));
  }
  if (m == 0) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "m is 0");
  if (x == nullptr || y == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s is NULL", x == nullptr ? "x" : "y");
  }
  if (n_begin >= n_end || n_end > w->n) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "column range [%u, %u) is empty or outside [0, %u)", n_begin, n_end, w->n);
  }
  if (m > 1 && (ldx < w->k || ldy < n_end)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "ldx = %zu must be >= k = %u and ldy = %zu >= n_end = %u", ldx, w->k, ldy, n_end);
  }
  if (reinterpret_cast<uintptr_t>(w->codes) % 16 != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "weights->codes is not 16-byte aligned");
  }
  return QMOE_STATUS_OK;
}

qmoe_status check_moe(const qmoe_cuda_expert_set* set, const qmoe_cuda_moe_params* params,
                      const char* function, qmoe_cuda_moe_params* p) {
  if (qmoe_status s = resolve(set, function); s != QMOE_STATUS_OK) return s;
  if (qmoe_status s = read_moe_params(params, function, p); s != QMOE_STATUS_OK) return s;
  if (p->m_capacity == 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "params->m_capacity is 0");
  }
  if (qmoe_status s = check_tokens_per_expert_hint(*p, function); s != QMOE_STATUS_OK) return s;
  if (p->k == 0 || p->k > set->num_experts) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "params->k = %u must be in [1, %u]", p->k,
                set->num_experts);
  }
  if (p->m == nullptr || p->x == nullptr || p->y == nullptr || p->workspace == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "params->%s is NULL",
                p->m == nullptr   ? "m"
                : p->x == nullptr ? "x"
                : p->y == nullptr ? "y"
                                  : "workspace");
  }
  if (qmoe_status s = check_one_routing(*p, function); s != QMOE_STATUS_OK) return s;
  if (p->m_capacity > 1 && (p->ldx < set->hidden || p->ldy < set->hidden)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "ldx = %zu and ldy = %zu must be >= hidden = %u", p->ldx, p->ldy, set->hidden);
  }
  if (reinterpret_cast<uintptr_t>(p->workspace) % kWorkspaceAlignment != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "params->workspace is not 256-byte aligned");
  }
  return QMOE_STATUS_OK;
}

// A residency update's host-side checks (update_residency and begin_residency_update take the
// same arguments) and the upload they lead to; the upload points into fc1 and fc2.
struct ResidencyUpload {
  std::vector<qmoe_quant_matrix> fc1, fc2;
  CudaExpertUpload upload{};
};

qmoe_status check_residency_update(const qmoe_cuda_expert_set* set, const qmoe_expert_set* experts,
                                   const uint32_t* resident, uint32_t num_resident,
                                   const char* function, ResidencyUpload* out) {
  if (qmoe_status s = resolve(set, function); s != QMOE_STATUS_OK) return s;
  const ExpertSet* host = nullptr;
  if (qmoe_status s = resolve_expert_set(experts, function, &host); s != QMOE_STATUS_OK) return s;
  if (host->num_experts != set->num_experts || host->hidden != set->hidden) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "the host set has E = %u and H = %u, the set %u and %u", host->num_experts,
                host->hidden, set->num_experts, set->hidden);
  }
  if (num_resident > set->num_slots) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "num_resident = %u exceeds the set's %u slots", num_resident, set->num_slots);
  }
  if (resident == nullptr && num_resident != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "resident is NULL with num_resident = %u",
                num_resident);
  }
  if (qmoe_status s =
          check_distinct_ids(resident, num_resident, set->num_experts, "resident", function);
      s != QMOE_STATUS_OK) {
    return s;
  }
  CudaExpertUpload& upload = out->upload;
  if (qmoe_status s = describe_host_set(*host, function, &out->fc1, &out->fc2, &upload);
      s != QMOE_STATUS_OK) {
    return s;
  }
  if (upload.intermediate != set->intermediate || upload.interleaved != set->interleaved ||
      !same_bits(upload.alpha, set->alpha) || !same_bits(upload.beta, set->beta) ||
      !same_bits(upload.limit, set->limit)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "the host set's intermediate size or SwiGLU differs from the set's (I %u)",
                set->intermediate);
  }
  // The layer's kernels are chosen for the set's one format.
  if (upload.fc1[0].format != set->format) {
    return fail(QMOE_STATUS_UNSUPPORTED_FORMAT, function,
                "the host set's experts are format %d, the GPU set's %d",
                static_cast<int>(upload.fc1[0].format), static_cast<int>(set->format));
  }
  // A non-null pointer for an empty list, so the upload never means "every expert".
  static const uint32_t kNone = 0;
  upload.resident = resident != nullptr ? resident : &kNone;
  upload.num_resident = num_resident;
  upload.num_slots = set->num_slots;
  upload.batched = true;
  return QMOE_STATUS_OK;
}

}  // namespace

qmoe_status resolve_cuda_expert_set(const qmoe_cuda_expert_set* handle, const char* function,
                                    CudaExpertSetView* view) {
  if (qmoe_status s = resolve(handle, function); s != QMOE_STATUS_OK) return s;
  view->impl = handle->set;
  view->num_experts = handle->num_experts;
  view->hidden = handle->hidden;
  return QMOE_STATUS_OK;
}

}  // namespace qmoe

extern "C" {

QMOE_API qmoe_status qmoe_cuda_get_device_count(int* device_count) {
  if (device_count == nullptr) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "device_count out-pointer is NULL");
  }
  const qmoe::CudaBackend* backend = qmoe::cuda_backend_or_fail(__func__);
  if (backend == nullptr) return QMOE_STATUS_CUDA_UNAVAILABLE;
  return backend->get_device_count(__func__, device_count);
}

QMOE_API qmoe_status qmoe_cuda_gemm(const qmoe_quant_matrix* weights, qmoe_accuracy accuracy,
                                    uint32_t m, qmoe_dtype x_dtype, const void* x, size_t ldx,
                                    qmoe_dtype y_dtype, void* y, size_t ldy, uint32_t n_begin,
                                    uint32_t n_end, qmoe_cuda_stream stream) {
  using namespace qmoe;
  qmoe_quant_matrix w;
  if (qmoe_status s = check_gemm(weights, accuracy, m, x_dtype, x, ldx, y_dtype, y, ldy, n_begin,
                                 n_end, __func__, &w);
      s != QMOE_STATUS_OK) {
    return s;
  }
  const CudaBackend* backend = cuda_backend_or_fail(__func__);
  if (backend == nullptr) return QMOE_STATUS_CUDA_UNAVAILABLE;
  const CudaGemmCall call{&w,      accuracy, m,   x_dtype, x,     ldx,
                          y_dtype, y,        ldy, n_begin, n_end, stream};
  return backend->gemm(__func__, call);
}

QMOE_API void qmoe_cuda_expert_set_desc_init(qmoe_cuda_expert_set_desc* desc) {
  if (desc == nullptr) return;
  *desc = qmoe_cuda_expert_set_desc{};
  desc->struct_size = sizeof(qmoe_cuda_expert_set_desc);
  desc->copy_mode = QMOE_CUDA_COPY_BATCHED;
}

QMOE_API qmoe_status qmoe_cuda_expert_set_create(const qmoe_cuda_expert_set_desc* desc,
                                                 qmoe_cuda_expert_set** set) {
  return qmoe::create(desc, set, __func__);
}

QMOE_API qmoe_status qmoe_cuda_expert_set_destroy(qmoe_cuda_expert_set* set) {
  using namespace qmoe;
  if (set == nullptr) return QMOE_STATUS_OK;
  if (qmoe_status s = resolve(set, __func__); s != QMOE_STATUS_OK) return s;
  if (!HandlePool<qmoe_cuda_expert_set>::claim_for_destroy(set, kLiveMagic, kDeadMagic)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "set was destroyed");
  }
  // A live set exists only when the backend made it.
  cuda_backend()->destroy_expert_set(set->set);
  HandlePool<qmoe_cuda_expert_set>::release(set);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_cuda_expert_set_residency(const qmoe_cuda_expert_set* set,
                                                    const int32_t** device_map) {
  using namespace qmoe;
  if (qmoe_status s = resolve(set, __func__); s != QMOE_STATUS_OK) return s;
  if (device_map == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "device_map is NULL");
  *device_map = cuda_backend()->residency(set->set);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_cuda_expert_set_update_residency(
    qmoe_cuda_expert_set* set, const qmoe_expert_set* experts, const uint32_t* resident,
    uint32_t num_resident, qmoe_cuda_stream stream, uint32_t* experts_copied) {
  using namespace qmoe;
  ResidencyUpload u;
  if (qmoe_status s = check_residency_update(set, experts, resident, num_resident, __func__, &u);
      s != QMOE_STATUS_OK) {
    return s;
  }
  uint32_t copied = 0;
  if (qmoe_status s =
          cuda_backend()->update_residency(__func__, set->set, u.upload, stream, &copied);
      s != QMOE_STATUS_OK) {
    return s;
  }
  if (experts_copied != nullptr) *experts_copied = copied;
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_cuda_expert_set_begin_residency_update(
    qmoe_cuda_expert_set* set, const qmoe_expert_set* experts, const uint32_t* resident,
    uint32_t num_resident, qmoe_cuda_stream stream, qmoe_cuda_stream copy_stream,
    uint32_t* experts_copied) {
  using namespace qmoe;
  ResidencyUpload u;
  if (qmoe_status s = check_residency_update(set, experts, resident, num_resident, __func__, &u);
      s != QMOE_STATUS_OK) {
    return s;
  }
  uint32_t copied = 0;
  if (qmoe_status s = cuda_backend()->begin_residency_update(__func__, set->set, u.upload, stream,
                                                             copy_stream, &copied);
      s != QMOE_STATUS_OK) {
    return s;
  }
  if (experts_copied != nullptr) *experts_copied = copied;
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_cuda_expert_set_finish_residency_update(qmoe_cuda_expert_set* set,
                                                                  qmoe_cuda_stream stream, int wait,
                                                                  int* finished) {
  using namespace qmoe;
  if (qmoe_status s = resolve(set, __func__); s != QMOE_STATUS_OK) return s;
  if (finished == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "finished is NULL");
  bool done = false;
  if (qmoe_status s =
          cuda_backend()->finish_residency_update(__func__, set->set, stream, wait != 0, &done);
      s != QMOE_STATUS_OK) {
    return s;
  }
  *finished = done ? 1 : 0;
  return QMOE_STATUS_OK;
}

QMOE_API void qmoe_cuda_moe_params_init(qmoe_cuda_moe_params* params) {
  if (params == nullptr) return;
  *params = qmoe_cuda_moe_params{};
  params->struct_size = sizeof(qmoe_cuda_moe_params);
  params->accuracy = QMOE_ACCURACY_FAST;
  params->dtype = QMOE_DTYPE_F32;
  params->renormalize = 1;
}

QMOE_API qmoe_status qmoe_cuda_moe_workspace_size(const qmoe_cuda_expert_set* set,
                                                  qmoe_accuracy accuracy, uint32_t m_capacity,
                                                  uint32_t k, size_t* bytes) {
  using namespace qmoe;
  if (qmoe_status s = resolve(set, __func__); s != QMOE_STATUS_OK) return s;
  if (bytes == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "bytes out-pointer is NULL");
  if (!valid_accuracy(enum_bits(accuracy))) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "accuracy %d is not a qmoe_accuracy",
              enum_bits(accuracy));
  }
  if (m_capacity == 0 || k == 0 || k > set->num_experts) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "m_capacity = %u must be >= 1 and k = %u in [1, %u]",
              m_capacity, k, set->num_experts);
  }
  const size_t size = cuda_backend()->moe_workspace_size(set->set, m_capacity, k);
  if (size == 0) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "m_capacity = %u, k = %u: beyond what the layer's kernels take", m_capacity, k);
  }
  *bytes = size;
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_cuda_moe_forward(const qmoe_cuda_expert_set* set,
                                           const qmoe_cuda_moe_params* params,
                                           qmoe_cuda_stream stream) {
  using namespace qmoe;
  qmoe_cuda_moe_params p;
  if (qmoe_status s = check_moe(set, params, __func__, &p); s != QMOE_STATUS_OK) return s;
  const size_t need = cuda_backend()->moe_workspace_size(set->set, p.m_capacity, p.k);
  if (need == 0 || p.workspace_bytes < need) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "workspace_bytes = %zu, qmoe_cuda_moe_workspace_size gives %zu", p.workspace_bytes,
              need);
  }
  const CudaMoeCall call = moe_call_of(p, stream);
  return cuda_backend()->moe_forward(__func__, set->set, call);
}

QMOE_API qmoe_status qmoe_cuda_moe_check(const void* workspace, qmoe_cuda_stream stream) {
  using namespace qmoe;
  if (workspace == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "workspace is NULL");
  const CudaBackend* backend = cuda_backend_or_fail(__func__);
  if (backend == nullptr) return QMOE_STATUS_CUDA_UNAVAILABLE;
  return backend->moe_check(__func__, workspace, stream);
}

}  // extern "C"
