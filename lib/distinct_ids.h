// The check of an expert id list that names a set of experts (a residency): every id below the
// expert count, none twice. Shared by the expert cache's and the CUDA expert set's ABI.
#ifndef QMOE_LIB_DISTINCT_IDS_H_
#define QMOE_LIB_DISTINCT_IDS_H_

#include <cstdint>
#include <new>
#include <vector>

#include "lib/error.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// OK when ids[0..count) are each below `limit` and pairwise distinct; INVALID_ARGUMENT naming
/// `function`, "<name>[i]" and the value otherwise; OUT_OF_MEMORY when the limit's flags cannot
/// be allocated. ids may be NULL only with count 0.
inline qmoe_status check_distinct_ids(const uint32_t* ids, uint32_t count, uint32_t limit,
                                      const char* name, const char* function) {
  std::vector<uint8_t> seen;
  try {
    seen.assign(limit, 0);
  } catch (const std::bad_alloc&) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating %u flags failed", limit);
  }
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t e = ids[i];
    if (e >= limit) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s[%u] = %u is not below %u", name, i, e,
                  limit);
    }
    if (seen[e] != 0) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s[%u] = %u is given twice", name, i, e);
    }
    seen[e] = 1;
  }
  return QMOE_STATUS_OK;
}

}  // namespace qmoe

#endif  // QMOE_LIB_DISTINCT_IDS_H_
