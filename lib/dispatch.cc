#include "lib/dispatch.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <strings.h>

#include "lib/cpu/kernel_tables.h"
#include "lib/cpu_features.h"

namespace qmoe {
namespace {

int index_of(Isa isa) {
  return static_cast<int>(isa) - static_cast<int>(Isa::kScalar);
}

constexpr Isa kTiers[kIsaCount] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

// Whether the build has the tier's own (non-extension) ISA.
bool tier_built(Isa isa) {
  for (uint32_t i = 0; i < kCpuIsaCount; ++i) {
    const CpuIsaInfo& info = cpu_isa_info(static_cast<CpuIsa>(i));
    if (info.tier == isa && info.feature == 0) return true;
  }
  return false;
}

// Take every entry the upper table provides.
void overlay(KernelTable& dst, const KernelTable& upper) {
#define QMOE_OVERLAY_(member, type) \
  if (upper.member.fn != nullptr) dst.member = upper.member;
  QMOE_CPU_OPS(QMOE_OVERLAY_)
#undef QMOE_OVERLAY_
  for (uint32_t f = 0; f < kFormatSlots; ++f) {
    for (uint32_t a = 0; a < kAccuracySlots; ++a) {
      if (upper.gemm[f][a].fn != nullptr) dst.gemm[f][a] = upper.gemm[f][a];
    }
  }
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
    for (uint32_t i = 0; i < kCpuIsaCount; ++i) {
      const CpuIsaInfo& layer = cpu_isa_info(static_cast<CpuIsa>(i));
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

uint32_t built_tier_count() {
  uint32_t count = 0;
  for (Isa tier : kTiers) count += tier_built(tier);
  return count;
}

Isa built_tier_at(uint32_t i) {
  for (Isa tier : kTiers) {
    if (tier_built(tier) && i-- == 0) return tier;
  }
  return Isa::kScalar;
}

}  // namespace qmoe
