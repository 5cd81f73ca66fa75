#include "tier_names.h"

#include <cstring>

namespace {

// Past the values qmoe.h reserves for tiers (x86 4-15, Arm 16-31, others 32-47).
constexpr int kTierValueEnd = 48;

}  // namespace

std::vector<qmoe_isa> known_tiers() {
  std::vector<qmoe_isa> tiers;
  for (int value = QMOE_ISA_SCALAR; value < kTierValueEnd; ++value) {
    const auto isa = static_cast<qmoe_isa>(value);
    if (std::strcmp(qmoe_isa_name(isa), "unknown") != 0) tiers.push_back(isa);
  }
  return tiers;
}

std::string tier_name_list(const char* separator) {
  std::string out;
  for (qmoe_isa isa : known_tiers()) {
    if (!out.empty()) out += separator;
    out += qmoe_isa_name(isa);
  }
  return out;
}

bool parse_tier_name(const char* name, qmoe_isa* isa) {
  return qmoe_isa_from_name(name, isa) == QMOE_STATUS_OK;
}
