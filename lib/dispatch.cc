#include "lib/dispatch.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <strings.h>

#include "lib/cpu_features.h"

namespace qmoe {
namespace {

int index_of(Isa isa) {
  return static_cast<int>(isa) - static_cast<int>(Isa::kScalar);
}

constexpr Isa kTiers[kIsaCount] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

// The per-ISA tables a tier is assembled from, lowest first: a tier overlays every layer of
// its own tier or below whose extension feature (0: none) the host has. Non-x86 builds have
// the scalar layer alone.
struct Layer {
  Isa tier;
  uint32_t feature;
  const KernelTable* table;
};

constexpr Layer kLayers[] = {
    {Isa::kScalar, 0, &kScalarKernelTable},
#if defined(QMOE_HAVE_X86_TIERS)
    {Isa::kAvx2, 0, &kAvx2KernelTable},
    {Isa::kAvx2, QMOE_CPU_FEATURE_AVXVNNI, &kAvxVnniKernelTable},
    {Isa::kAvx512, 0, &kAvx512KernelTable},
    {Isa::kAvx512, QMOE_CPU_FEATURE_AVX512VNNI, &kAvx512VnniKernelTable},
#endif
};

// Whether the build has the tier's own (non-extension) table.
bool tier_built(Isa isa) {
  for (const Layer& layer : kLayers) {
    if (layer.tier == isa && layer.feature == 0) return true;
  }
  return false;
}

// Take every entry the upper table provides.
void overlay(KernelTable& dst, const KernelTable& upper) {
#define QMOE_OVERLAY_(slot, member, type) \
  if (upper.member.fn != nullptr) dst.member = upper.member;
  QMOE_KERNEL_TABLE_ENTRIES(QMOE_OVERLAY_)
#undef QMOE_OVERLAY_
}

struct DispatchState {
  KernelTable tables[kIsaCount] = {};
  bool available[kIsaCount] = {};
  std::string unavailable_reason[kIsaCount];
  Isa best = Isa::kScalar;
  Isa process_default = Isa::kScalar;
  char max_isa_env[16] = {};
  std::string default_reason;
};

std::string missing_features(uint32_t required, uint32_t have) {
  std::string out;
  for (uint32_t b = 1; b != 0; b <<= 1) {
    if ((required & b) && !(have & b)) {
      if (!out.empty()) out += ", ";
      out += qmoe_cpu_feature_name(b);
    }
  }
  return out;
}

DispatchState build_state() {
  DispatchState s;
  const uint32_t have = host_cpu_features().bits;
  for (Isa tier : kTiers) {
    const int t = index_of(tier);
    if (!tier_built(tier)) {
      s.unavailable_reason[t] = "not built for this architecture";
      continue;
    }
    if (!isa_runs_on(tier, have)) {
      s.unavailable_reason[t] = "host lacks " + missing_features(isa_required_features(tier), have);
      continue;
    }
    for (const Layer& layer : kLayers) {
      if (index_of(layer.tier) > t) break;
      if ((have & layer.feature) == layer.feature) overlay(s.tables[t], *layer.table);
    }
    s.available[t] = true;
    s.best = tier;
  }

  // QMOE_MAX_ISA caps the process default; read exactly once, here.
  s.process_default = s.best;
  if (const char* env = std::getenv("QMOE_MAX_ISA"); env != nullptr && *env != '\0') {
    std::snprintf(s.max_isa_env, sizeof(s.max_isa_env), "%s", env);
    Isa cap;
    if (!parse_isa_name(env, &cap)) {
      s.default_reason = std::string("QMOE_MAX_ISA='") + s.max_isa_env +
                         "' is not scalar, avx2 or avx512; ignored";
    } else if (index_of(cap) < index_of(s.best)) {
      s.process_default = cap;
      s.default_reason = std::string("capped by QMOE_MAX_ISA=") + s.max_isa_env;
    }
  }
  return s;
}

const DispatchState& state() {
  static const DispatchState s = build_state();
  return s;
}

bool valid_isa(Isa isa) {
  return index_of(isa) >= 0 && index_of(isa) < kIsaCount;
}

const char* const kSlotNames[] = {
#define QMOE_SLOT_NAME_(slot, member, type) #member,
    QMOE_KERNEL_TABLE_ENTRIES(QMOE_SLOT_NAME_)
#undef QMOE_SLOT_NAME_
};

// The X-macro order must be the public slot order: slot k is the k-th entry.
constexpr qmoe_kernel_slot kSlotOrder[] = {
#define QMOE_SLOT_VALUE_(slot, member, type) slot,
    QMOE_KERNEL_TABLE_ENTRIES(QMOE_SLOT_VALUE_)
#undef QMOE_SLOT_VALUE_
};
constexpr bool slots_in_order() {
  for (size_t i = 0; i < sizeof(kSlotOrder) / sizeof(kSlotOrder[0]); ++i) {
    if (static_cast<size_t>(kSlotOrder[i]) != i) return false;
  }
  return true;
}
static_assert(slots_in_order(), "QMOE_KERNEL_TABLE_ENTRIES must list slots in enum order");

}  // namespace

const KernelTable* kernel_table_for_isa(Isa isa) {
  if (!valid_isa(isa)) return nullptr;
  const DispatchState& s = state();
  return s.available[index_of(isa)] ? &s.tables[index_of(isa)] : nullptr;
}

const char* isa_unavailable_reason(Isa isa) {
  if (!valid_isa(isa)) return "unknown tier";
  const DispatchState& s = state();
  return s.available[index_of(isa)] ? nullptr : s.unavailable_reason[index_of(isa)].c_str();
}

Isa best_supported_isa() {
  return state().best;
}
Isa default_isa() {
  return state().process_default;
}
const char* max_isa_env_value() {
  return state().max_isa_env;
}
const char* default_isa_reason() {
  return state().default_reason.c_str();
}

bool parse_isa_name(const char* text, Isa* isa) {
  if (text == nullptr) return false;
  for (Isa tier : kTiers) {
    if (strcasecmp(text, isa_name(tier)) == 0) {
      *isa = tier;
      return true;
    }
  }
  return false;
}

const char* isa_name(Isa isa) {
  return qmoe_isa_name(static_cast<qmoe_isa>(isa));
}

uint32_t kernel_slot_count() {
  return sizeof(kSlotNames) / sizeof(kSlotNames[0]);
}

const char* kernel_slot_name(qmoe_kernel_slot slot) {
  const auto i = static_cast<uint32_t>(slot);
  return i < kernel_slot_count() ? kSlotNames[i] : nullptr;
}

const char* kernel_name(const KernelTable& table, qmoe_kernel_slot slot) {
  switch (slot) {
#define QMOE_SLOT_CASE_(slot_value, member, type) \
  case slot_value:                                \
    return table.member.name;
    QMOE_KERNEL_TABLE_ENTRIES(QMOE_SLOT_CASE_)
#undef QMOE_SLOT_CASE_
  }
  return nullptr;
}

}  // namespace qmoe

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
    default:
      return nullptr;
  }
}

QMOE_API uint32_t qmoe_kernel_slot_count(void) {
  return qmoe::kernel_slot_count();
}

QMOE_API const char* qmoe_kernel_slot_name(qmoe_kernel_slot slot) {
  return qmoe::kernel_slot_name(slot);
}

}  // extern "C"
