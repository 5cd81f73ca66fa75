#include "tier_names.h"

#include <cstring>

namespace {

// The enum's last enumerator. qmoe.h reserves values up to 47 for tiers, but C++ cannot form
// a qmoe_isa past its last enumerator (the enum has no fixed underlying type: the cast is
// undefined, and the ASan+UBSan suite's enum check stopped `qmoe info` on value 4). A tier the
// library adds comes with its enumerator in qmoe.h, and with it this bound.
constexpr int kLastTier = QMOE_ISA_AVX512;

}  // namespace

std::vector<qmoe_isa> known_tiers() {
  std::vector<qmoe_isa> tiers;
  for (int value = QMOE_ISA_SCALAR; value <= kLastTier; ++value) {
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
