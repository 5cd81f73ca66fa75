#include "lib/gemm/gemm_rows.h"

#include <algorithm>

#include "lib/dispatch.h"
#include "lib/formats/quant_matrix.h"
#include "lib/gemm/group_panels.h"
#include "lib/gemm/stream_tuning.h"
#include "lib/memory_ranges.h"

namespace qmoe {
namespace {

// The next group's scale (or zero-point) run, prefetched into L2 while this group streams its
// codes. In the grouped order (docs/formats.md) a group's scales are one run beside its codes,
// read at 16 bytes per 128-byte chunk: a second stream whose lines the in-kernel next-line
// prefetch requests only a few chunks ahead; left to it, that second stream costs a measurable
// share of a one-thread M = 1 call (docs/results/2026-12-01-int4-gemm-limits.md).
//
// Only short runs are prefetched so: at most kMaxPrefetchedRunBytes, K <= 4096 with FP16 scales
// per 32. A longer run, all of it requested at the group's start (56 lines at K = 7168, 112 at
// K = 14336), made a cold one-thread call slower than no run prefetch at all (the burst likely
// delays the code stream's own misses), while the hardware and the in-kernel next-line prefetches
// keep up with a long sequential run (docs/results/2026-12-04-zen4-long-k-scale-runs.md).
constexpr size_t kMaxPrefetchedRunBytes = 2048;

struct GroupRunPrefetch {
  const unsigned char* plane = nullptr;  // nullptr: nothing to prefetch
  size_t group_stride = 0;               // elements, as in qmoe_quant_matrix
  size_t element_bytes = 0;
  size_t run_bytes = 0;      // one group's run
  uint32_t full_groups = 0;  // groups of 8 rows inside the plane

  // Group g's run, when g < g_end and the group is full (a last partial group goes through a
  // panel, and its run may end past the caller's plane). always_inline for the reason
  // lib/cpu/common/int4_prefetch.h gives (GCC once deleted a prefetch-only function's calls); the
  // ctest build.gemm_rows_emit_scale_run_prefetch checks the machine code.
  __attribute__((always_inline)) void prefetch(uint32_t g, uint32_t g_end) const {
    if (plane == nullptr || g >= g_end || g >= full_groups) return;
    // Where run_gemm_rows reads the group's planes from (row stride 1).
    const unsigned char* run =
        plane + plane_row_offset(g * kGroupRows, 1, group_stride) * element_bytes;
    for (size_t off = 0; off < run_bytes; off += 64) __builtin_prefetch(run + off, 0, 2);
  }
};

// Only planes read in place in the grouped order (block stride 8, a group stride) have runs;
// [K/B, N] planes spread a group over N-strided lines, and [N, K/B] ones go through panels.
GroupRunPrefetch group_run_prefetch(const GemmPlan& plan, const void* plane, size_t block_stride,
                                    size_t group_stride, size_t element_bytes) {
  GroupRunPrefetch p;
  if (!plan.direct_planes || block_stride != kGroupRows || group_stride == 0) return p;
  const size_t run_bytes = size_t{plan.panel_blocks} * kGroupRows * element_bytes;
  if (run_bytes > kMaxPrefetchedRunBytes) return p;
  p.plane = static_cast<const unsigned char*>(plane);
  p.group_stride = group_stride;
  p.element_bytes = element_bytes;
  p.run_bytes = run_bytes;
  p.full_groups = plan.w.n / kGroupRows;
  return p;
}

}  // namespace

void run_gemm_rows(const GemmPlan& plan, const KernelTable& kernels, const ActivationView& acts,
                   size_t first, uint32_t m, float* y, size_t ldy, uint32_t n_begin, uint32_t n_end,
                   unsigned char* scratch) {
  const qmoe_quant_matrix& w = plan.w;
  // One argument block for the whole run, updated in place per group. (A fresh block per group
  // is built with scalar stores and read back with wider loads, which cannot be store-forwarded
  // and stall; docs/results/2026-11-30-int4-gemm-limits.md has the measurements.)
  GemmGroupArgs a{};
  a.chunks = plan.chunks;
  a.block_size = w.block_size;
  a.m = m;
  a.ldy = m > 1 ? ldy : 0;
  a.prefetch_l2_bytes = int4_l2_prefetch_bytes();
  a.global_scale = w.global_scale == 0.0f ? 1.0f : w.global_scale;  // validated: 0 is "none"
  const GemmGroupFn kernel = gemm_kernel(kernels, w.format, acts.accuracy).fn;
  if (acts.accuracy == QMOE_ACCURACY_EXACT) {
    a.x = acts.x + first * acts.x_stride;
    a.ldx = m > 1 ? acts.x_stride : 0;
  } else {
    a.xq = Q8Activations{acts.q + first * acts.q_stride,
                         acts.scale + first * acts.chunks,
                         acts.sum_q + first * acts.chunks,
                         acts.q_stride,
                         acts.chunks,
                         acts.e2m1_start + first * acts.chunks * 2};
  }

  const size_t panel = panel_elements(plan);
  auto* panel_scales = reinterpret_cast<float*>(scratch);
  uint8_t* panel_zeros = scratch + align64(panel * sizeof(float));
  auto* panel_staging = reinterpret_cast<uint16_t*>(panel_zeros + align64(panel));

  float bias[kGroupRows];
  const size_t scale_bytes = dtype_size(w.scale_dtype);
  const uint32_t g_begin = n_begin / kGroupRows;
  const uint32_t g_end = row_groups(n_end);
  const GroupRunPrefetch scale_runs =
      group_run_prefetch(plan, w.scales, w.scale_block_stride, w.scale_group_stride, scale_bytes);
  const GroupRunPrefetch zero_runs =
      w.zero_points != nullptr ? group_run_prefetch(plan, w.zero_points, w.zero_point_block_stride,
                                                    w.zero_point_group_stride, 1)
                               : GroupRunPrefetch{};
  scale_runs.prefetch(g_begin, g_end);
  zero_runs.prefetch(g_begin, g_end);
  for (uint32_t g = g_begin; g < g_end; ++g) {
    scale_runs.prefetch(g + 1, g_end);
    zero_runs.prefetch(g + 1, g_end);
    const uint32_t n0 = g * kGroupRows;
    const uint32_t rows = std::min(kGroupRows, w.n - n0);
    a.codes = static_cast<const uint8_t*>(w.codes) + size_t{g} * plan.chunks * plan.tile_bytes;
    a.row_begin = n_begin > n0 ? n_begin - n0 : 0;
    a.row_end = std::min(n_end - n0, kGroupRows);
    a.y = y + n0;
    a.scale_dtype = w.scale_dtype;
    if (plan.direct_planes && rows == kGroupRows) {
      a.scales = static_cast<const unsigned char*>(w.scales) +
                 plane_row_offset(n0, 1, w.scale_group_stride) * scale_bytes;
      a.scale_block_stride = w.scale_block_stride;
      a.zero_points = w.zero_points != nullptr
                          ? w.zero_points + plane_row_offset(n0, 1, w.zero_point_group_stride)
                          : nullptr;
      a.zero_point_block_stride = w.zero_point_block_stride;
    } else {
      uint8_t* zeros = w.zero_points != nullptr ? panel_zeros : nullptr;
      build_group_panels(plan, kernels, n0, rows, plan.panel_blocks, panel_scales, panel_staging,
                         zeros);
      a.scale_dtype = QMOE_DTYPE_F32;
      a.scales = panel_scales;
      a.scale_block_stride = kGroupRows;
      a.zero_points = zeros;
      a.zero_point_block_stride = kGroupRows;
    }
    if (w.bias != nullptr) {
      load_bias(w, kernels, n0, rows, bias);
      a.bias = bias;
    }
    kernel(a);
  }
}

}  // namespace qmoe
