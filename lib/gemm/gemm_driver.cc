#include "lib/gemm/gemm_driver.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "lib/formats/quant_matrix.h"
#include "lib/gemm/activation_dtype.h"
#include "lib/gemm/stream_tuning.h"

namespace qmoe {

qmoe_status make_gemm_plan(const qmoe_quant_matrix* in, const char* function, GemmPlan* plan) {
  GemmPlan p{};
  if (qmoe_status s = validate_quant_matrix(in, function, &p.w); s != QMOE_STATUS_OK) return s;
  // validate_quant_matrix admits INT4 only; a new format sets its own constants here.
  p.chunks = chunk_count(p.w.k);
  const size_t padded_k = size_t{p.chunks} * kChunkCodes;
  p.panel_blocks = static_cast<uint32_t>((padded_k + p.w.block_size - 1) / p.w.block_size);
  // Direct plane access needs 8 consecutive rows per block in the caller's planes, and no
  // half-filled last chunk (whose missing block must read as scale 0).
  const bool scales_direct = p.w.scale_row_stride == 1;
  const bool zeros_direct = p.w.zero_points == nullptr || p.w.zero_point_row_stride == 1;
  p.direct_planes = scales_direct && zeros_direct && padded_k == p.w.k;
  *plan = p;
  return QMOE_STATUS_OK;
}

namespace {

// The next group's scale (or zero-point) run, prefetched into L2 while this group streams its
// codes. In the grouped order (docs/formats.md) a group's scales are one run beside its codes,
// read at 16 bytes per 128-byte chunk: a second stream whose lines the in-kernel next-line
// prefetch requests only a few chunks ahead. Measured on the device host (fast M = 1, one
// thread, cold, 3 rounds against the AVX-512 read of the same pages in the same process): the
// kernel's loads and prefetches with no arithmetic took 1.07x the read's time, and without the
// scale loads 0.90x (for 89% of the bytes), so the separate scale stream cost about 7%.
struct GroupRunPrefetch {
  const unsigned char* plane = nullptr;  // nullptr: nothing to prefetch
  size_t group_stride = 0;               // elements, as in qmoe_quant_matrix
  size_t element_bytes = 0;
  size_t run_bytes = 0;      // one group's run
  uint32_t full_groups = 0;  // groups of 8 rows inside the plane

  // Group g's run, when g < g_end and the group is full (a last partial group goes through a
  // panel, and its run may end past the caller's plane). always_inline for the reason
  // lib/cpu/common/int4_prefetch.h gives (GCC once deleted a prefetch-only function's calls); the
  // ctest build.gemm_driver_emits_scale_run_prefetch checks the machine code.
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
  p.plane = static_cast<const unsigned char*>(plane);
  p.group_stride = group_stride;
  p.element_bytes = element_bytes;
  p.run_bytes = size_t{plan.panel_blocks} * kGroupRows * element_bytes;
  p.full_groups = plan.w.n / kGroupRows;
  return p;
}

// Group panel scratch: fp32 scales, then zero points, then 16-bit staging, [block][8] each.
size_t panel_elements(const GemmPlan& plan) {
  return size_t{plan.panel_blocks} * kGroupRows;
}

}  // namespace

size_t gemm_row_scratch_bytes(const GemmPlan& plan) {
  // Every group full and read in place (run_gemm_rows): no panel, so no scratch. At a large K
  // the panels are big (56 bytes per block of 8 rows, per task), and reserving them for planes
  // that never need them once made such calls fail with QMOE_STATUS_OUT_OF_MEMORY.
  if (plan.direct_planes && plan.w.n % kGroupRows == 0) return 0;
  const size_t n = panel_elements(plan);
  return align64(n * sizeof(float)) + align64(n) + align64(n * sizeof(uint16_t));
}

size_t activation_rows_bytes(qmoe_accuracy accuracy, uint32_t k, size_t capacity) {
  const size_t chunks = chunk_count(k);
  const size_t stride = chunks * kChunkCodes;
  if (accuracy == QMOE_ACCURACY_EXACT) return align64(capacity * stride * sizeof(float));
  return align64(capacity * stride) + 2 * align64(capacity * chunks * sizeof(float));
}

ActivationRows carve_activation_rows(qmoe_accuracy accuracy, uint32_t k, size_t capacity,
                                     unsigned char* storage) {
  ActivationRows r{};
  r.accuracy = accuracy;
  r.k = k;
  r.chunks = chunk_count(k);
  r.stride = size_t{r.chunks} * kChunkCodes;
  if (accuracy == QMOE_ACCURACY_EXACT) {
    r.x = reinterpret_cast<float*>(storage);
  } else {
    r.q = reinterpret_cast<int8_t*>(storage);
    storage += align64(capacity * r.stride);
    r.scale = reinterpret_cast<float*>(storage);
    storage += align64(capacity * r.chunks * sizeof(float));
    r.sum_q = reinterpret_cast<float*>(storage);
  }
  return r;
}

ActivationView direct_activation_view(const float* x, size_t ldx, uint32_t k) {
  ActivationView v{};
  v.accuracy = QMOE_ACCURACY_EXACT;
  v.k = k;
  v.chunks = k / kChunkCodes;
  v.x = x;
  v.x_stride = ldx;
  return v;
}

ActivationView view_of(const ActivationRows& rows) {
  ActivationView v{};
  v.accuracy = rows.accuracy;
  v.k = rows.k;
  v.chunks = rows.chunks;
  v.x = rows.x;
  v.x_stride = rows.stride;
  v.q = rows.q;
  v.scale = rows.scale;
  v.sum_q = rows.sum_q;
  v.q_stride = rows.stride;
  return v;
}

void prepare_activation_rows(const KernelTable& kernels, const ActivationRows& rows, size_t first,
                             uint32_t m, const float* x, size_t ldx) {
  for (uint32_t i = 0; i < m; ++i) {
    const size_t r = first + i;
    const float* src = x + i * ldx;
    if (rows.accuracy == QMOE_ACCURACY_EXACT) {
      // Kernels read whole chunks: the row with a zero tail.
      float* dst = rows.x + r * rows.stride;
      std::memcpy(dst, src, rows.k * sizeof(float));
      std::memset(dst + rows.k, 0, (rows.stride - rows.k) * sizeof(float));
    } else {
      kernels.quantize_activations_q8.fn(src, rows.k, rows.q + r * rows.stride,
                                         rows.scale + r * rows.chunks,
                                         rows.sum_q + r * rows.chunks);
    }
  }
}

void prepare_activation_rows_typed(const KernelTable& kernels, const ActivationRows& rows,
                                   size_t first, uint32_t m, qmoe_dtype dtype, const void* x,
                                   size_t ldx) {
  if (dtype == QMOE_DTYPE_F32) {
    prepare_activation_rows(kernels, rows, first, m, static_cast<const float*>(x), ldx);
    return;
  }
  float values[kChunkCodes];
  for (uint32_t i = 0; i < m; ++i) {
    for (uint32_t c = 0; c < rows.chunks; ++c) {
      const uint32_t k0 = c * kChunkCodes, len = std::min(kChunkCodes, rows.k - k0);
      widen_activations(kernels, dtype, activation_at(x, dtype, i * ldx + k0), values, len);
      prepare_activation_chunk(kernels, rows, first + i, c, values, len);
    }
  }
}

void prepare_activation_chunk(const KernelTable& kernels, const ActivationRows& rows, size_t row,
                              uint32_t chunk, const float* values, uint32_t len) {
  const size_t k0 = size_t{chunk} * kChunkCodes;
  if (rows.accuracy == QMOE_ACCURACY_EXACT) {
    float* dst = rows.x + row * rows.stride + k0;
    std::memcpy(dst, values, len * sizeof(float));
    std::memset(dst + len, 0, (kChunkCodes - len) * sizeof(float));
  } else {
    // The quantizer works per chunk (docs/formats.md), so one chunk at a time gives the same
    // q, scale and sum as the whole row at once.
    kernels.quantize_activations_q8.fn(values, len, rows.q + row * rows.stride + k0,
                                       rows.scale + row * rows.chunks + chunk,
                                       rows.sum_q + row * rows.chunks + chunk);
  }
}

void copy_activation_row(const ActivationView& src, size_t src_row, const ActivationRows& dst,
                         size_t dst_row) {
  if (dst.accuracy == QMOE_ACCURACY_EXACT) {
    std::memcpy(dst.x + dst_row * dst.stride, src.x + src_row * src.x_stride,
                dst.stride * sizeof(float));
  } else {
    std::memcpy(dst.q + dst_row * dst.stride, src.q + src_row * src.q_stride, dst.stride);
    std::memcpy(dst.scale + dst_row * dst.chunks, src.scale + src_row * src.chunks,
                dst.chunks * sizeof(float));
    std::memcpy(dst.sum_q + dst_row * dst.chunks, src.sum_q + src_row * src.chunks,
                dst.chunks * sizeof(float));
  }
}

void run_gemm_rows(const GemmPlan& plan, const KernelTable& kernels, const ActivationView& acts,
                   size_t first, uint32_t m, float* y, size_t ldy, uint32_t n_begin, uint32_t n_end,
                   unsigned char* scratch) {
  const qmoe_quant_matrix& w = plan.w;
  // One argument block for the whole run, updated in place per group. (Copying a fresh block
  // per group made the compiler assemble it with scalar stores and read it back with 16-byte
  // loads: store-forwarding stalls that were half the time of a K = 32 call on Zen 3.)
  Int4GroupArgs a{};
  a.chunks = plan.chunks;
  a.block_size = w.block_size;
  a.m = m;
  a.ldy = m > 1 ? ldy : 0;
  a.prefetch_l2_bytes = int4_l2_prefetch_bytes();
  GemmInt4GroupFn kernel;
  if (acts.accuracy == QMOE_ACCURACY_EXACT) {
    kernel = kernels.gemm_int4_exact.fn;
    a.x = acts.x + first * acts.x_stride;
    a.ldx = m > 1 ? acts.x_stride : 0;
  } else {
    kernel = kernels.gemm_int4_fast.fn;
    a.xq = Q8Activations{acts.q + first * acts.q_stride, acts.scale + first * acts.chunks,
                         acts.sum_q + first * acts.chunks, acts.q_stride, acts.chunks};
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
    a.codes = static_cast<const uint8_t*>(w.codes) + size_t{g} * plan.chunks * kChunkBytes;
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
      build_group_panels(w, kernels, n0, rows, plan.panel_blocks, panel_scales, panel_staging,
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
