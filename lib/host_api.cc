// The host ABI: tier and feature names, and qmoe_get_host_info (our probe's features and tiers,
// cpuinfo's topology and caches).
#include <cpuinfo.h>

#include <cstdio>
#include <cstring>

#include "lib/cpu_features.h"
#include "lib/dispatch.h"
#include "lib/error.h"
#include "lib/struct_size.h"

extern "C" {

QMOE_API const char* qmoe_isa_name(qmoe_isa isa) {
  switch (isa) {
    case QMOE_ISA_DEFAULT:
      return "default";
    case QMOE_ISA_SCALAR:
      return "scalar";
    case QMOE_ISA_AVX2:
      return "avx2";
    case QMOE_ISA_AVX512:
      return "avx512";
  }
  return "unknown";
}

QMOE_API qmoe_status qmoe_isa_from_name(const char* name, qmoe_isa* isa) {
  if (isa == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "isa out-pointer is NULL");
  if (name == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "name is NULL");
  qmoe::Isa tier;
  if (!qmoe::parse_isa_name(name, &tier)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "'%.32s' is not a tier name (scalar, avx2, avx512)",
              name);
  }
  *isa = static_cast<qmoe_isa>(tier);
  return QMOE_STATUS_OK;
}

QMOE_API const char* qmoe_cpu_feature_name(uint32_t feature_bit) {
  switch (feature_bit) {
    case QMOE_CPU_FEATURE_AVX:
      return "avx";
    case QMOE_CPU_FEATURE_AVX2:
      return "avx2";
    case QMOE_CPU_FEATURE_FMA:
      return "fma";
    case QMOE_CPU_FEATURE_F16C:
      return "f16c";
    case QMOE_CPU_FEATURE_AVX512F:
      return "avx512f";
    case QMOE_CPU_FEATURE_AVX512BW:
      return "avx512bw";
    case QMOE_CPU_FEATURE_AVX512DQ:
      return "avx512dq";
    case QMOE_CPU_FEATURE_AVX512VL:
      return "avx512vl";
    case QMOE_CPU_FEATURE_AVX512VNNI:
      return "avx512vnni";
    case QMOE_CPU_FEATURE_AVX512BF16:
      return "avx512bf16";
    case QMOE_CPU_FEATURE_AVXVNNI:
      return "avxvnni";
    case QMOE_CPU_FEATURE_AVX512VBMI:
      return "avx512vbmi";
    case QMOE_CPU_FEATURE_GFNI:
      return "gfni";
    default:
      return nullptr;
  }
}

QMOE_API qmoe_status qmoe_get_host_info(qmoe_host_info* info) {
  using namespace qmoe;
  if (info == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "info is NULL");
  const size_t caller_size = info->struct_size;
  using H = qmoe_host_info;
  static constexpr FieldSpan kFields[] = {
      QMOE_FIELD(H, logical_processors), QMOE_FIELD(H, physical_cores),
      QMOE_FIELD(H, l1d_cache_bytes),    QMOE_FIELD(H, l2_cache_bytes),
      QMOE_FIELD(H, l3_cache_bytes),     QMOE_FIELD(H, l3_cache_instances)};
  if (!struct_size_ok(caller_size, offsetof(H, logical_processors), kFields)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "info->struct_size is %zu, not the size of any version of the struct; set it to "
              "sizeof(qmoe_host_info) (%zu)",
              caller_size, sizeof(qmoe_host_info));
  }
  qmoe_host_info out{};
  out.struct_size = caller_size;
  const CpuFeatures& features = host_cpu_features();
  std::snprintf(out.cpu_brand, sizeof(out.cpu_brand), "%s", features.brand);
  out.cpu_features = features.bits;
  out.best_supported_isa = static_cast<qmoe_isa>(best_supported_isa());
  out.default_isa = static_cast<qmoe_isa>(default_isa());
  std::snprintf(out.max_isa_env, sizeof(out.max_isa_env), "%s", max_isa_env_value());
  std::snprintf(out.default_isa_reason, sizeof(out.default_isa_reason), "%s", default_isa_reason());
  if (cpuinfo_initialize()) {
    out.logical_processors = cpuinfo_get_processors_count();
    out.physical_cores = cpuinfo_get_cores_count();
    if (const cpuinfo_cache* l1d = cpuinfo_get_l1d_cache(0)) out.l1d_cache_bytes = l1d->size;
    if (const cpuinfo_cache* l2 = cpuinfo_get_l2_cache(0)) out.l2_cache_bytes = l2->size;
    if (cpuinfo_get_l3_caches_count() > 0) {
      out.l3_cache_bytes = cpuinfo_get_l3_cache(0)->size;
      out.l3_cache_instances = cpuinfo_get_l3_caches_count();
    }
  }
  // Copy back only what the caller's struct has room for.
  std::memcpy(info, &out, caller_size < sizeof(out) ? caller_size : sizeof(out));
  return QMOE_STATUS_OK;
}

}  // extern "C"
