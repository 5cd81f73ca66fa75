// The tier names `qmoe` accepts for --isa: the library's own (qmoe_isa_name,
// qmoe_isa_from_name) for every tier qmoe.h's enum has.
#ifndef QMOE_TOOLS_QMOE_TIER_NAMES_H_
#define QMOE_TOOLS_QMOE_TIER_NAMES_H_

#include <string>
#include <vector>

#include "qmoe/qmoe.h"

// Every tier the public enum names, lowest value first (the build may lack some).
std::vector<qmoe_isa> known_tiers();

// "scalar|avx2|avx512": the names of known_tiers() joined by `separator`.
std::string tier_name_list(const char* separator);

// The tier `name` names; false for anything else.
bool parse_tier_name(const char* name, qmoe_isa* isa);

#endif  // QMOE_TOOLS_QMOE_TIER_NAMES_H_
