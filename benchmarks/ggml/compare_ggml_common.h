// compare_ggml_common.h: what compare_ggml.cc (the GEMV rows, main) and
// compare_ggml_moe.cc (the MoE chain) share: the two formats as ggml blocks, their import
// into libqmoe, the ggml backend and buffers, agreement, timing and the result rows.
#ifndef QMOE_BENCHMARKS_GGML_COMPARE_GGML_COMMON_H_
#define QMOE_BENCHMARKS_GGML_COMPARE_GGML_COMMON_H_

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "qmoe/qmoe.h"

namespace qmoe_ggml {

// --- Options, errors, randomness ------------------------------------------------------------

struct Options {
  std::vector<int> threads;  // empty: 1 and every core
  int rounds = 7;            // gemv blocks per side
  int moe_rounds = 5;        // moe blocks per side
  int moe_tokens = 8;        // tokens per moe block
  int layers = 16;           // moe chain depth
  // Layers with weights of their own (0: all): layer l of the chain uses layer l % distinct's,
  // so a 48-layer chain fits in the memory of 16. A token reads 8 of a layer's 128 experts (21 MB
  // in INT4); between two uses of a layer's weights the other distinct - 1 layers read (distinct
  // - 1) times that, well over the last-level cache, so every use reads from DRAM all the same.
  int distinct = 0;
  bool gemv = true;
  bool moe = true;
  bool moe_mxfp4 = true;  // also run the chain on MXFP4 bytes
  bool ggml_huge_pages = true;
  bool quick = false;
  std::string json_path;
};

[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "compare_ggml: %s\n", what.c_str());
  std::exit(1);
}

inline void check(qmoe_status status, const char* what) {
  if (status != QMOE_STATUS_OK) die(std::string(what) + " failed: " + qmoe_status_string(status));
}

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Let the other side's spinning workers (libgomp's, pthreadpool's) go to sleep before a block.
inline void settle() {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// Advise the whole 2 MiB pages inside [p, p + bytes) for transparent huge pages, before the
// first write: what qmoe_alloc_weight_memory does for libqmoe's side.
inline void advise_huge_pages(void* p, size_t bytes) {
  const uintptr_t huge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + huge - 1) & ~(huge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(huge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// --- The two formats, as ggml blocks ---------------------------------------------------------

struct Format {
  const char* name;       // "q4_0" / "mxfp4"
  const char* qmoe_name;  // what libqmoe calls the same bytes
  ggml_type type;
  qmoe_weight_format qmoe_format;
  qmoe_dtype scale_dtype;
  size_t block_bytes;  // 18 / 17
  size_t scale_bytes;  // 2 / 1
};

inline const Format kQ4_0{"q4_0", "int4", GGML_TYPE_Q4_0, QMOE_WEIGHT_FORMAT_INT4, QMOE_DTYPE_F16,
                          18,     2};
inline const Format kMxfp4{
    "mxfp4", "mxfp4", GGML_TYPE_MXFP4, QMOE_WEIGHT_FORMAT_MXFP4, QMOE_DTYPE_E8M0, 17, 1};

inline size_t row_bytes(const Format& f, uint32_t k) {
  return size_t{k} / 32 * f.block_bytes;
}

// Random rows of ggml blocks of weight-like magnitude: Q4_0 d = +-2^-8 .. 2^-5 (random FP16
// mantissa), MXFP4 e = 118 .. 123 (the repository's benchmarks' ranges); random code bytes.
inline void fill_blocks(const Format& f, size_t blocks, uint64_t seed, uint8_t* dst) {
  for (size_t b = 0; b < blocks; ++b, dst += f.block_bytes) {
    const uint64_t r = splitmix64(seed);
    if (f.type == GGML_TYPE_Q4_0) {
      const uint16_t d = static_cast<uint16_t>(((r >> 16) & 1) << 15 | (7 + (r >> 8) % 4) << 10 |
                                               (r >> 20) % 1024);
      std::memcpy(dst, &d, 2);
    } else {
      dst[0] = static_cast<uint8_t>(118 + r % 6);
    }
    uint8_t* qs = dst + f.scale_bytes;
    const uint64_t a = splitmix64(seed), c = splitmix64(seed);
    std::memcpy(qs, &a, 8);
    std::memcpy(qs + 8, &c, 8);
  }
}

// Row n of ggml blocks dequantized, FP64 (for the reference).
inline void dequantize_row(const Format& f, const uint8_t* row, uint32_t k, double* out) {
  static const double kE2M1[16] = {0,    0.5,  1,  1.5,  2,  3,  4,  6,
                                   -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (uint32_t b = 0; b < k / 32; ++b, row += f.block_bytes) {
    const uint8_t* qs = row + f.scale_bytes;
    for (int j = 0; j < 32; ++j) {
      const int code = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
      double w;
      if (f.type == GGML_TYPE_Q4_0) {
        uint16_t d;
        std::memcpy(&d, row, 2);
        w = (code - 8) * static_cast<double>(ggml_fp16_to_fp32(d));
      } else {
        w = kE2M1[code] * std::ldexp(1.0, row[0] - 127);
      }
      out[b * 32 + j] = w;
    }
  }
}

// --- libqmoe's copy of the same bytes --------------------------------------------------------

// Imports n rows of ggml blocks into canonical codes plus an [n, K/32] scale plane (rows
// [row0, row0 + n) of an N-row matrix whose codes and plane are given); row0 % 8 == 0.
inline void import_rows(const Format& f, const uint8_t* src, uint32_t row0, uint32_t n, uint32_t k,
                        uint8_t* codes, size_t codes_bytes, uint8_t* plane) {
  const size_t blocks = k / 32;
  const size_t group_bytes = blocks * 128;  // one 8-row group of canonical codes
  uint8_t* dst = codes + size_t{row0} / 8 * group_bytes;
  const size_t dst_bytes = codes_bytes - size_t{row0} / 8 * group_bytes;
  uint8_t* scales = plane + size_t{row0} * blocks * f.scale_bytes;
  if (f.type == GGML_TYPE_Q4_0) {
    check(qmoe_import_int4_q4_0(src, n, k, dst, dst_bytes, reinterpret_cast<uint16_t*>(scales),
                                blocks, 1),
          "qmoe_import_int4_q4_0");
  } else {
    check(qmoe_import_mxfp4_ggml(src, n, k, dst, dst_bytes, scales, blocks, 1),
          "qmoe_import_mxfp4_ggml");
  }
}

inline size_t align64(size_t v) {
  return (v + 63) / 64 * 64;
}

// Bytes of one matrix in libqmoe's layout: codes, then the grouped scale plane.
inline size_t qmoe_matrix_bytes(const Format& f, uint32_t n, uint32_t k) {
  size_t codes = 0;
  check(qmoe_quant_matrix_codes_size(f.qmoe_format, n, k, &codes), "qmoe_quant_matrix_codes_size");
  return align64(codes) + align64(qmoe_grouped_plane_elements(n, k / 32) * f.scale_bytes);
}

// Imports an N x K matrix given as ggml rows (in up to two parts: FC1's gate and up tensors)
// into `slot` (qmoe_matrix_bytes of it) and describes it.
inline qmoe_quant_matrix import_matrix(const Format& f, uint32_t n, uint32_t k,
                                       const uint8_t* part0, uint32_t rows0, const uint8_t* part1,
                                       uint8_t* slot) {
  size_t codes_bytes = 0;
  check(qmoe_quant_matrix_codes_size(f.qmoe_format, n, k, &codes_bytes), "codes_size");
  const uint32_t blocks = k / 32;
  std::vector<uint8_t> plane(size_t{n} * blocks * f.scale_bytes);
  import_rows(f, part0, 0, rows0, k, slot, codes_bytes, plane.data());
  if (rows0 < n) import_rows(f, part1, rows0, n - rows0, k, slot, codes_bytes, plane.data());
  uint8_t* grouped = slot + align64(codes_bytes);
  const size_t grouped_bytes = qmoe_grouped_plane_elements(n, blocks) * f.scale_bytes;
  check(qmoe_group_plane(plane.data(), n, blocks, f.scale_bytes, blocks, 1, grouped, grouped_bytes),
        "qmoe_group_plane");
  qmoe_quant_matrix w{};
  w.struct_size = sizeof(w);
  w.format = f.qmoe_format;
  w.n = n;
  w.k = k;
  w.block_size = 32;
  w.codes = slot;
  w.scale_dtype = f.scale_dtype;
  w.scales = grouped;
  w.scale_row_stride = 1;
  w.scale_block_stride = 8;
  w.scale_group_stride = size_t{8} * blocks;
  return w;
}

struct WeightMemory {
  void* p = nullptr;
  explicit WeightMemory(size_t bytes) { check(qmoe_alloc_weight_memory(bytes, &p), "alloc"); }
  ~WeightMemory() { qmoe_free_weight_memory(p); }
  WeightMemory(const WeightMemory&) = delete;
  WeightMemory& operator=(const WeightMemory&) = delete;
  uint8_t* bytes() const { return static_cast<uint8_t*>(p); }
};

struct QmoeContext {
  qmoe_context* ctx = nullptr;
  explicit QmoeContext(int threads) {
    qmoe_context_options o;
    qmoe_context_options_init(&o);
    o.num_threads = static_cast<uint32_t>(threads);
    check(qmoe_context_create(&o, &ctx), "qmoe_context_create");
  }
  ~QmoeContext() { qmoe_context_destroy(ctx); }
  QmoeContext(const QmoeContext&) = delete;
  QmoeContext& operator=(const QmoeContext&) = delete;
};

// --- ggml -------------------------------------------------------------------------------------

struct Ggml {
  ggml_backend_t backend = nullptr;
  ggml_backend_buffer_type_t plain = nullptr;
  ggml_backend_buffer_type_t repack = nullptr;  // CPU_REPACK, when this ggml has it
  bool huge_pages = true;

  explicit Ggml(bool huge) : huge_pages(huge) {
    backend = ggml_backend_cpu_init();
    if (backend == nullptr) die("ggml_backend_cpu_init failed");
    plain = ggml_backend_cpu_buffer_type();
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    auto get_extra =
        reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(ggml_backend_reg_get_proc_address(
            ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts"));
    for (ggml_backend_buffer_type_t* b = get_extra ? get_extra(dev) : nullptr; b && *b; ++b) {
      if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) repack = *b;
    }
  }
  ~Ggml() { ggml_backend_free(backend); }
  Ggml(const Ggml&) = delete;
  Ggml& operator=(const Ggml&) = delete;

  void set_threads(int n) { ggml_backend_cpu_set_n_threads(backend, n); }
  void compute(ggml_cgraph* g) {
    if (ggml_backend_graph_compute(backend, g) != GGML_STATUS_SUCCESS) die("graph compute");
  }
};

inline ggml_context* new_meta_context(size_t tensors, size_t graph_nodes, size_t graphs) {
  ggml_init_params p{};
  p.mem_size = tensors * ggml_tensor_overhead() +
               graphs * ggml_graph_overhead_custom(graph_nodes, false) + 1024;
  p.no_alloc = true;
  ggml_context* c = ggml_init(p);
  if (c == nullptr) die("ggml_init failed");
  return c;
}

// Allocates every tensor of `ctx` in one buffer of `buft`, advising it for huge pages before
// anything is written. Returns nullptr (and leaves nothing allocated) when `buft` is a repack
// type that does not repack ggml_type of the first tensor on this CPU.
inline ggml_backend_buffer_t alloc_weights(Ggml& g, ggml_context* ctx,
                                           ggml_backend_buffer_type_t buft) {
  ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
  if (buf == nullptr) die("allocating ggml weights failed");
  if (buft == g.repack) {
    for (ggml_tensor* t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
      if (t->extra == nullptr) {  // no repacked kernel for this type and shape here
        ggml_backend_buffer_free(buf);
        return nullptr;
      }
    }
  }
  if (g.huge_pages) {
    advise_huge_pages(ggml_backend_buffer_get_base(buf), ggml_backend_buffer_get_size(buf));
  }
  return buf;
}

// --- Agreement --------------------------------------------------------------------------------

// max |a - b| / max |b|
inline double rel_err(const float* a, const double* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return den > 0 ? num / den : num;
}

inline double rel_err(const float* a, const float* b, size_t n) {
  std::vector<double> d(b, b + n);
  return rel_err(a, d.data(), n);
}

// --- Results ----------------------------------------------------------------------------------

struct Row {
  std::string bench;  // "gemv" / "moe"
  std::string format;
  std::string shape;
  std::string ggml_buffer;  // "plain" / "repack"
  int m = 1;
  int threads = 1;
  double qmoe_us = 0, ggml_us = 0;
  double err_vs_ggml = 0;  // max |qmoe - ggml| / max |ggml|
  double err_qmoe_ref = -1, err_ggml_ref = -1;
  int layers = 0;
  int distinct = 0;  // layers with weights of their own
};

inline std::vector<Row> g_rows;  // every measured row, for the JSON

inline void print_row(const Row& r) {
  std::printf(
      "%-5s %-6s %-12s %-6s m=%d t=%d  qmoe %10.1f us  ggml %10.1f us  ratio %.3f  "
      "err(qmoe,ggml) %.2e",
      r.bench.c_str(), r.format.c_str(), r.shape.c_str(), r.ggml_buffer.c_str(), r.m, r.threads,
      r.qmoe_us, r.ggml_us, r.qmoe_us / r.ggml_us, r.err_vs_ggml);
  if (r.err_qmoe_ref >= 0) {
    std::printf("  vs fp64: qmoe %.2e ggml %.2e", r.err_qmoe_ref, r.err_ggml_ref);
  }
  std::printf("\n");
  std::fflush(stdout);
}

// Times the sides alternately: `rounds` blocks each (which side goes first alternates), every
// block `calls` timed calls after two untimed ones; returns each side's median call in
// microseconds. The median of single calls, not a block's mean, so that a call another
// process preempted on this shared host does not move the figure.
template <typename A, typename B>
std::pair<double, double> time_pair(int rounds, int calls, A&& a, B&& b) {
  std::vector<double> ta, tb;
  for (int r = 0; r < rounds; ++r) {
    for (int side = 0; side < 2; ++side) {
      const bool run_a = (r % 2 == 0) == (side == 0);
      settle();
      for (int i = 0; i < 2; ++i) run_a ? a() : b();
      for (int i = 0; i < calls; ++i) {
        const double t0 = now_seconds();
        run_a ? a() : b();
        (run_a ? ta : tb).push_back((now_seconds() - t0) * 1e6);
      }
    }
  }
  return {median(ta), median(tb)};
}

/// Qwen3-30B-A3B's MoE geometry: experts, routing slots, hidden and expert width.
constexpr uint32_t kExperts = 128, kTop = 8, kHidden = 2048, kInter = 768;

/// The MoE chain rows of one format (compare_ggml_moe.cc).
void run_moe(const Options& o, Ggml& g, const Format& f);

}  // namespace qmoe_ggml

#endif  // QMOE_BENCHMARKS_GGML_COMPARE_GGML_COMMON_H_
