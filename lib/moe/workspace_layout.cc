#include "lib/moe/workspace_layout.h"

#include <atomic>

#include "lib/formats/quant_matrix.h"
#include "lib/formats/tiles.h"
#include "lib/gemm/activation_rows.h"
#include "lib/gemm/task_split.h"
#include "lib/memory_ranges.h"

namespace qmoe {

bool make_moe_layout(const ExpertSet& s, qmoe_accuracy accuracy, uint32_t m, uint32_t k,
                     uint32_t threads, MoeLayout* out) {
  const size_t routes = size_t{m} * k;
  const size_t h = s.hidden, i = s.intermediate;
  // Bound every per-route piece (padded rows, both levels) before multiplying.
  const size_t per_route = 4 * ((h + 32) * 2 + 2 * i + (i + 32) + 2 * (h / 32 + i / 32 + 2)) + 64;
  if (routes > INT32_MAX || routes > (SIZE_MAX / 4) / per_route ||
      s.num_experts > (SIZE_MAX / 64) / 16 || size_t{m} > (SIZE_MAX / 8) / s.num_experts ||
      (s.row_scratch_bytes != 0 &&
       max_parallel_tasks(threads) > (SIZE_MAX / 4) / s.row_scratch_bytes)) {
    return false;
  }
  MoeLayout l{};
  size_t at = 0;
  // The bounds above keep each piece's product in size_t; their sum is checked as it grows
  // (each piece is at most a quarter or half of SIZE_MAX, not their total).
  bool fits = true;
  const auto take = [&at, &fits](size_t bytes) {
    const size_t offset = at;
    if (bytes > SIZE_MAX - 64 - at) {
      fits = false;
    } else {
      at += align64(bytes);
    }
    return offset;
  };
  l.counts = take(size_t{s.num_experts} * sizeof(uint32_t));
  l.offsets = take((size_t{s.num_experts} + 1) * sizeof(uint32_t));
  l.active = take(size_t{s.num_experts} * sizeof(uint32_t));
  l.route_token = take(routes * sizeof(uint32_t));
  l.slot_route = take(routes * sizeof(int32_t));
  l.ids = take(routes * sizeof(int32_t));
  l.weights = take(routes * sizeof(float));
  // 16-bit router logits widened for the routing (FP32 ones are read in place); reserved
  // whatever the dtype, as the X rows below are.
  l.logits = take(size_t{m} * s.num_experts * sizeof(float));
  l.direct_tokens = accuracy == QMOE_ACCURACY_EXACT && s.hidden % kChunkCodes == 0;
  // Reserved even when FP32 rows could be read in place: a 16-bit X is always prepared, and
  // qmoe_moe_workspace_size does not depend on the activation dtype.
  l.tokens = take(activation_rows_bytes(accuracy, s.hidden, m));
  // Rows of experts whose tokens are not consecutive: at M > 1 any expert's, at M = 1 an expert
  // that a token lists twice (its routes are token 0 twice).
  l.gathered = take(activation_rows_bytes(accuracy, s.hidden, routes));
  l.h1 = take(routes * 2 * i * sizeof(float));
  l.a2 = take(activation_rows_bytes(accuracy, s.intermediate, routes));
  l.y2 = take(routes * h * sizeof(float));
  // FC2's completion count per group of 8 outputs (lib/moe/executor.cc: the combine).
  l.group_done = take(size_t{row_groups(h)} * sizeof(std::atomic<uint32_t>));
  l.row_scratch = take(max_parallel_tasks(threads) * s.row_scratch_bytes);
  if (!fits) return false;
  l.total = at;
  *out = l;
  return true;
}

}  // namespace qmoe
