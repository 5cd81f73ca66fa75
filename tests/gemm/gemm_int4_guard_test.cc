// Reads of the INT4 dequant-GEMM stay inside the caller's buffers, on every tier. Each input
// (the canonical codes, exactly qmoe_quant_matrix_codes_size bytes; the scale plane and the
// zero-point plane, exactly from their first element to their last; the bias, N elements; the X
// rows, M rows ldx apart) is copied into its own mapping so that it either ends exactly at the
// end of a readable page followed by an inaccessible one, or starts exactly at a page preceded
// by one: a load of one byte past the end, or before the start, faults. qmoe_gemm and
// qmoe_gemm_typed (FP16 X) then run over the full and a partial column range and must give the
// bits of the same call on ordinary heap copies (same context, so same tier), leaving Y outside
// the requested columns as it was. The copies are read-only, so a store into an input faults
// too. Software prefetches may point past a buffer by design (they never fault), so a fault here
// is a real load; the handler below names the buffer and the offset before the process dies.
// The INT3 kernels run through the same cases (Int3ReadsStayInsideEveryBuffer): their 96-byte
// tiles end where no INT4 tile does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#if defined(__unix__)
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#define QMOE_TEST_HAVE_GUARD_PAGES 1
#endif

#include "tests/activation_dtype_util.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/int3_reference.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {
namespace {

#if defined(QMOE_TEST_HAVE_GUARD_PAGES)

// ---------------------------------------------------------------------------------------------
// Guarded buffers and a fault report.
//
// convert_guard_test.cc has a GuardedPage helper, but it is private to that file (an unnamed
// namespace) and maps exactly one page, where a codes buffer or an X block can span several;
// sharing it would mean moving it into a header, so this file has its own multi-page version.
// ---------------------------------------------------------------------------------------------

enum class Placement {
  kEndsAtPageEnd,      // the last byte is the last readable one: catches reads past the end
  kStartsAtPageStart,  // the first byte is the first readable one: catches reads before it
};

const char* placement_name(Placement p) {
  return p == Placement::kEndsAtPageEnd ? "ends at a page end" : "starts at a page start";
}

// What the fault handler knows about each live guarded buffer. Written only outside the handler
// and before any call that could fault; the handler only reads it.
struct GuardedSpan {
  const char* name;
  uintptr_t map_begin, map_end;    // the whole mapping, guard pages included
  uintptr_t data_begin, data_end;  // the caller's bytes
};
constexpr int kMaxSpans = 16;
GuardedSpan g_spans[kMaxSpans];
volatile sig_atomic_t g_span_live[kMaxSpans];
// The call that is running, for the report.
char g_running[768];

// Async-signal-safe output: write(2) of fixed strings and hand-formatted numbers.
void write_text(const char* s) {
  size_t n = 0;
  while (s[n] != '\0') ++n;
  if (write(STDERR_FILENO, s, n) < 0) return;
}

void write_number(uintptr_t v, bool in_hex) {
  char digits[24];
  char* p = digits + sizeof(digits);
  *--p = '\0';
  const uintptr_t base = in_hex ? 16 : 10;
  do {
    *--p = "0123456789abcdef"[v % base];
    v /= base;
  } while (v != 0);
  if (in_hex) {
    *--p = 'x';
    *--p = '0';
  }
  write_text(p);
}

// Names the buffer and offset of the faulting address, then returns: SA_RESETHAND has restored
// the default action, so the access runs again and the process dies of the signal (the test
// fails; nothing can be recovered after a wild load).
void report_fault(int sig, siginfo_t* info, void*) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  write_text("\n*** gemm_int4_guard_test: ");
  write_text(sig == SIGSEGV ? "SIGSEGV" : "SIGBUS");
  write_text(" at ");
  write_number(addr, true);
  bool found = false;
  for (int i = 0; i < kMaxSpans; ++i) {
    if (!g_span_live[i]) continue;
    const GuardedSpan& s = g_spans[i];
    if (addr < s.map_begin || addr >= s.map_end) continue;
    found = true;
    write_text(": the ");
    write_text(s.name);
    write_text(" buffer (");
    write_number(s.data_end - s.data_begin, false);
    write_text(" bytes at ");
    write_number(s.data_begin, true);
    write_text(") ");
    if (addr >= s.data_end) {
      write_text("accessed ");
      write_number(addr - s.data_end, false);
      write_text(" bytes past its end (byte offset ");
      write_number(addr - s.data_begin, false);
      write_text(")");
    } else if (addr < s.data_begin) {
      write_text("accessed ");
      write_number(s.data_begin - addr, false);
      write_text(" bytes before its start");
    } else {
      write_text("written at byte offset ");
      write_number(addr - s.data_begin, false);
      write_text(" (inputs are read-only)");
    }
  }
  if (!found) write_text(": not in a guarded buffer");
  write_text("\n*** during: ");
  write_text(g_running);
  write_text("\n");
}

// Installs report_fault for SIGSEGV and SIGBUS for its lifetime.
class FaultReport {
 public:
  FaultReport() {
    struct sigaction sa {};
    sa.sa_sigaction = &report_fault;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv_);
    sigaction(SIGBUS, &sa, &old_bus_);
  }
  ~FaultReport() {
    sigaction(SIGSEGV, &old_segv_, nullptr);
    sigaction(SIGBUS, &old_bus_, nullptr);
  }
  FaultReport(const FaultReport&) = delete;
  FaultReport& operator=(const FaultReport&) = delete;

 private:
  struct sigaction old_segv_ {};
  struct sigaction old_bus_ {};
};

// A read-only copy of `bytes` bytes between two inaccessible pages, placed against one of them.
class GuardedBuffer {
 public:
  GuardedBuffer(const char* name, const void* src, size_t bytes, Placement where)
      : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    const size_t data_pages = (bytes + page_ - 1) / page_;
    map_bytes_ = (data_pages + 2) * page_;
    void* p = mmap(nullptr, map_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    unsigned char* base = static_cast<unsigned char*>(p);
    unsigned char* readable = base + page_;
    const size_t readable_bytes = data_pages * page_;
    if (mprotect(readable, readable_bytes, PROT_READ | PROT_WRITE) != 0) {
      munmap(base, map_bytes_);
      return;
    }
    data_ = where == Placement::kEndsAtPageEnd ? readable + readable_bytes - bytes : readable;
    // The slack beside the data is readable; 0xFF bytes there (NaN as FP16/BF16/FP32, code 15)
    // would show in the results if a kernel used them.
    std::memset(readable, 0xFF, readable_bytes);
    std::memcpy(data_, src, bytes);
    if (mprotect(readable, readable_bytes, PROT_READ) != 0) {
      munmap(base, map_bytes_);
      data_ = nullptr;
      return;
    }
    base_ = base;
    for (slot_ = 0; slot_ < kMaxSpans && g_span_live[slot_]; ++slot_) {
    }
    if (slot_ < kMaxSpans) {
      g_spans[slot_] = {
          name, reinterpret_cast<uintptr_t>(base), reinterpret_cast<uintptr_t>(base) + map_bytes_,
          reinterpret_cast<uintptr_t>(data_), reinterpret_cast<uintptr_t>(data_) + bytes};
      g_span_live[slot_] = 1;
    }
  }
  ~GuardedBuffer() {
    if (slot_ < kMaxSpans) g_span_live[slot_] = 0;
    if (base_ != nullptr) munmap(base_, map_bytes_);
  }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  bool ok() const { return base_ != nullptr; }
  const void* data() const { return data_; }

 private:
  size_t page_;
  size_t map_bytes_ = 0;
  unsigned char* base_ = nullptr;
  unsigned char* data_ = nullptr;
  int slot_ = kMaxSpans;
};

// ---------------------------------------------------------------------------------------------
// The check.
// ---------------------------------------------------------------------------------------------

constexpr unsigned char kPoisonByte = 0xA5;
constexpr size_t kYGuard = 16;  // poisoned elements before and after Y

const char* level_name(qmoe_accuracy a) {
  return a == QMOE_ACCURACY_EXACT ? "exact" : "fast";
}

// Elements from a plane's first element to its last (row N-1, block K/B - 1), inclusive
// (docs/formats.md): all a caller has to provide. In the grouped order this stops inside the
// last group when N % 8 != 0, before the padding rows the kernels must never read.
size_t plane_elements(const qmoe_quant_matrix& d, size_t row_stride, size_t block_stride,
                      size_t group_stride) {
  const uint32_t last = d.n - 1, blocks = d.k / d.block_size;
  const size_t row =
      group_stride == 0 ? last * row_stride : (last / 8) * group_stride + (last % 8) * row_stride;
  return row + (blocks - 1) * block_stride + 1;
}

// Guarded copies of a matrix's buffers, each exactly as long as the ABI says, and the
// description that points at them.
struct GuardedWeights {
  std::unique_ptr<GuardedBuffer> codes, scales, zero_points, bias;
  qmoe_quant_matrix desc{};
  bool ok = true;
};

GuardedWeights guard_weights(const Int4Matrix& w, Placement where) {
  GuardedWeights g;
  g.desc = w.desc;
  const qmoe_quant_matrix& d = w.desc;
  size_t code_bytes = 0;
  EXPECT_EQ(qmoe_quant_matrix_codes_size(d.format, d.n, d.k, &code_bytes), QMOE_STATUS_OK);
  EXPECT_EQ(code_bytes, w.codes.size());
  g.codes = std::make_unique<GuardedBuffer>("codes", d.codes, code_bytes, where);
  g.ok = g.ok && g.codes->ok();
  g.desc.codes = g.codes->data();

  const size_t scale_bytes =
      plane_elements(d, d.scale_row_stride, d.scale_block_stride, d.scale_group_stride) *
      element_size(d.scale_dtype);
  EXPECT_LE(scale_bytes, w.scales.size());
  g.scales = std::make_unique<GuardedBuffer>("scale plane", d.scales, scale_bytes, where);
  g.ok = g.ok && g.scales->ok();
  g.desc.scales = g.scales->data();

  if (d.zero_points != nullptr) {
    const size_t zero_bytes = plane_elements(d, d.zero_point_row_stride, d.zero_point_block_stride,
                                             d.zero_point_group_stride);
    EXPECT_LE(zero_bytes, w.zero_points.size());
    g.zero_points =
        std::make_unique<GuardedBuffer>("zero-point plane", d.zero_points, zero_bytes, where);
    g.ok = g.ok && g.zero_points->ok();
    g.desc.zero_points = static_cast<const uint8_t*>(g.zero_points->data());
  }
  if (d.bias != nullptr) {
    const size_t bias_bytes = size_t{d.n} * element_size(d.bias_dtype);
    EXPECT_EQ(bias_bytes, w.bias.size());
    g.bias = std::make_unique<GuardedBuffer>("bias", d.bias, bias_bytes, where);
    g.ok = g.ok && g.bias->ok();
    g.desc.bias = g.bias->data();
  }
  return g;
}

// Y: M rows ldy elements apart between kYGuard elements on each side, every byte poisoned.
struct YBuffer {
  qmoe_dtype dtype;
  uint32_t m;
  size_t ldy;
  std::vector<unsigned char> bytes;

  YBuffer(qmoe_dtype d, uint32_t rows, size_t ld)
      : dtype(d),
        m(rows),
        ldy(ld),
        bytes((2 * kYGuard + size_t{rows} * ld) * element_size(d), kPoisonByte) {}
  void* y() { return bytes.data() + kYGuard * element_size(dtype); }
};

// The first element of `y` outside columns [n_begin, n_end) of its M rows that is no longer
// poison, as "element E (row R, column C)"; "" when all are intact.
std::string first_changed_outside(const YBuffer& y, uint32_t n_begin, uint32_t n_end) {
  const size_t es = element_size(y.dtype), elements = y.bytes.size() / es;
  for (size_t e = 0; e < elements; ++e) {
    const bool inside = e >= kYGuard && e < kYGuard + size_t{y.m} * y.ldy;
    const size_t col = inside ? (e - kYGuard) % y.ldy : 0;
    if (inside && col >= n_begin && col < n_end) continue;
    for (size_t b = 0; b < es; ++b) {
      if (y.bytes[e * es + b] != kPoisonByte) {
        if (!inside) {
          return e < kYGuard ? "guard element " + std::to_string(kYGuard - e) + " before row 0"
                             : "guard element " + std::to_string(e - kYGuard - y.m * y.ldy) +
                                   " after the last row";
        }
        return "element " + std::to_string(e - kYGuard) + " (row " +
               std::to_string((e - kYGuard) / y.ldy) + ", column " + std::to_string(col) + ")";
      }
    }
  }
  return "";
}

std::string hex(const unsigned char* p, size_t bytes) {
  std::string s = "0x";
  for (size_t i = bytes; i-- > 0;) {  // little-endian value
    char b[3];
    std::snprintf(b, sizeof(b), "%02X", p[i]);
    s += b;
  }
  return s;
}

struct GuardCase {
  Int4Options w;
  uint32_t m;
  uint32_t n_begin, n_end;  // a partial column range; the full range always runs as well
  qmoe_weight_format format = QMOE_WEIGHT_FORMAT_INT4;
};

// One call: qmoe_gemm when X and Y are FP32, qmoe_gemm_typed otherwise.
qmoe_status call_gemm(qmoe_context* ctx, const qmoe_quant_matrix& w, qmoe_accuracy level,
                      uint32_t m, qmoe_dtype xd, const void* x, size_t ldx, YBuffer& y,
                      uint32_t n_begin, uint32_t n_end) {
  if (xd == QMOE_DTYPE_F32 && y.dtype == QMOE_DTYPE_F32) {
    return qmoe_gemm(ctx, &w, level, m, static_cast<const float*>(x), ldx,
                     static_cast<float*>(y.y()), y.ldy, n_begin, n_end);
  }
  return qmoe_gemm_typed(ctx, &w, level, m, xd, x, ldx, y.dtype, y.y(), y.ldy, n_begin, n_end);
}

// Runs case `c` with every input guarded at both placements, X with ldx = K and ldx > K, both
// accuracy levels, the full and the partial column range, and three call forms (FP32 X and Y;
// FP16 X into FP32 Y; FP16 X into FP16 Y). `replay` says how to rerun it (the test's seed).
// Returns false after the first failure it reports.
bool check_case(Isa isa, const GuardCase& c, uint64_t seed, const std::string& replay) {
  std::mt19937_64 rng(seed);
  const Int4Matrix w =
      c.format == QMOE_WEIGHT_FORMAT_INT3 ? make_int3_matrix(c.w, rng) : make_int4_matrix(c.w, rng);
  const uint32_t n = c.w.n, k = c.w.k, m = c.m;
  const std::vector<float> x_values = random_activations(m, k, rng);
  ContextPtr ctx = make_context(isa, 1);
  if (ctx == nullptr) return false;

  struct Range {
    uint32_t begin, end;
  };
  const Range ranges[] = {{0, n}, {c.n_begin, c.n_end}};
  struct Form {
    qmoe_dtype x, y;
  };
  const Form forms[] = {{QMOE_DTYPE_F32, QMOE_DTYPE_F32},
                        {QMOE_DTYPE_F16, QMOE_DTYPE_F32},
                        {QMOE_DTYPE_F16, QMOE_DTYPE_F16}};
  const size_t ldy = n + 3;  // a gap between rows, which must stay poisoned too

  for (size_t ldx : {size_t{k}, size_t{k} + 5}) {
    // X rows ldx apart; the gaps hold NaN, which would reach the output if a kernel read them.
    // The buffer ends with the last row's K-th element, so at a page end that row does too.
    const size_t x_elements = size_t{m - 1} * ldx + k;
    std::vector<float> x32(x_elements, std::nanf(""));
    for (uint32_t i = 0; i < m; ++i) {
      std::copy_n(x_values.data() + size_t{i} * k, k, x32.data() + i * ldx);
    }
    const std::vector<unsigned char> x16 =
        narrow(ctx.get(), QMOE_DTYPE_F16, x32.data(), x32.size());

    for (Placement where : {Placement::kEndsAtPageEnd, Placement::kStartsAtPageStart}) {
      const GuardedWeights gw = guard_weights(w, where);
      const GuardedBuffer gx32("X (FP32)", x32.data(), x32.size() * sizeof(float), where);
      const GuardedBuffer gx16("X (FP16)", x16.data(), x16.size(), where);
      if (!gw.ok || !gx32.ok() || !gx16.ok()) {
        ADD_FAILURE() << "mmap/mprotect failed";
        return false;
      }
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        for (const Range& r : ranges) {
          for (const Form& f : forms) {
            const std::string where_text =
                std::string(isa_name(isa)) + "/" + level_name(level) + " " + c.w.describe() +
                " m=" + std::to_string(m) + " ldx=" + std::to_string(ldx) + " x " +
                dtype_name(f.x) + " y " + dtype_name(f.y) + " cols [" + std::to_string(r.begin) +
                "," + std::to_string(r.end) + ") inputs " + placement_name(where) + " (" + replay +
                ")";
            const void* heap_x = f.x == QMOE_DTYPE_F32 ? static_cast<const void*>(x32.data())
                                                       : static_cast<const void*>(x16.data());
            const void* guarded_x = f.x == QMOE_DTYPE_F32 ? gx32.data() : gx16.data();

            YBuffer want(f.y, m, ldy), got(f.y, m, ldy);
            const qmoe_status heap_status =
                call_gemm(ctx.get(), w.desc, level, m, f.x, heap_x, ldx, want, r.begin, r.end);
            std::snprintf(g_running, sizeof(g_running), "%s", where_text.c_str());
            const qmoe_status guarded_status =
                call_gemm(ctx.get(), gw.desc, level, m, f.x, guarded_x, ldx, got, r.begin, r.end);
            std::snprintf(g_running, sizeof(g_running), "(no guarded call)");

            if (heap_status != QMOE_STATUS_OK || guarded_status != QMOE_STATUS_OK) {
              ADD_FAILURE() << where_text << ": status " << qmoe_status_string(heap_status)
                            << " on the heap copies, " << qmoe_status_string(guarded_status)
                            << " on the guarded ones: " << qmoe_last_error_message();
              return false;
            }
            for (const YBuffer* y : {&want, &got}) {
              const std::string changed = first_changed_outside(*y, r.begin, r.end);
              if (!changed.empty()) {
                ADD_FAILURE() << where_text << ": the call on the "
                              << (y == &want ? "heap" : "guarded") << " copies wrote Y " << changed
                              << ", outside the requested columns";
                return false;
              }
            }
            if (want.bytes != got.bytes) {
              const size_t es = element_size(f.y);
              size_t e = 0;
              while (std::memcmp(&want.bytes[e * es], &got.bytes[e * es], es) == 0) ++e;
              ADD_FAILURE() << where_text << ": Y element " << e - kYGuard << " (row "
                            << (e - kYGuard) / ldy << ", column " << (e - kYGuard) % ldy << ") is "
                            << hex(&got.bytes[e * es], es) << " from the guarded copies, "
                            << hex(&want.bytes[e * es], es) << " from the heap copies";
              return false;
            }
          }
        }
      }
    }
  }
  return true;
}

class GemmInt4Guard : public IsaTest {};

// Hand-picked cases: together they hold every N tail (1, 7, 13, 45), last groups that are full
// (N = 8, 24: the grouped and block-major planes are then read in place right up to their last
// element), K from one block to 384 (K % 32 == 16 with block 16: 16, 48, 80, 208), every block
// size, M = 1..5, every scale dtype and order, zero points in every order, and bias in every
// dtype; each with both levels, full and partial columns, FP32 and FP16 X.
std::vector<GuardCase> hand_picked_cases(qmoe_weight_format format) {
  using O = ScaleOrder;
  constexpr qmoe_dtype F32 = QMOE_DTYPE_F32, F16 = QMOE_DTYPE_F16, BF16 = QMOE_DTYPE_BF16;
  std::vector<GuardCase> cases = {
      // {n, k, block, scale dtype, scale order, zero points, their order, bias, its dtype}, m,
      // partial columns
      {{1, 16, 16, F16, O::kRowMajor, true, O::kRowMajor, true, F32}, 1, 0, 1},
      {{7, 48, 16, BF16, O::kBlockMajor, false, O::kRowMajor, true, F16}, 2, 2, 5},
      {{13, 32, 32, F32, O::kGrouped, true, O::kGrouped, false, F32}, 3, 8, 13},
      {{45, 256, 64, F16, O::kGrouped, true, O::kBlockMajor, true, BF16}, 5, 3, 41},
      {{45, 384, 128, BF16, O::kRowMajor, false, O::kRowMajor, true, F32}, 4, 40, 45},
      {{13, 208, 16, F32, O::kPaddedRowMajor, true, O::kPaddedRowMajor, true, F16}, 5, 1, 12},
      {{7, 128, 128, F32, O::kBlockMajor, true, O::kBlockMajor, false, F32}, 1, 6, 7},
      {{1, 96, 32, BF16, O::kGrouped, false, O::kRowMajor, true, BF16}, 4, 0, 1},
      {{45, 80, 16, F16, O::kBlockMajor, true, O::kGrouped, false, F32}, 3, 17, 30},
      {{13, 64, 64, F16, O::kRowMajor, true, O::kRowMajor, true, F32}, 2, 0, 7},
      {{7, 16, 16, F32, O::kGrouped, true, O::kGrouped, true, BF16}, 5, 3, 7},
      {{24, 192, 64, F16, O::kGrouped, true, O::kGrouped, true, F16}, 2, 16, 24},
      {{8, 32, 16, BF16, O::kBlockMajor, true, O::kBlockMajor, true, BF16}, 3, 4, 8},
      {{24, 96, 32, F32, O::kBlockMajor, true, O::kBlockMajor, false, F32}, 5, 9, 24},
      {{45, 160, 32, BF16, O::kPaddedRowMajor, true, O::kBlockMajor, true, F32}, 1, 44, 45},
  };
  for (GuardCase& c : cases) c.format = format;
  return cases;
}

TEST_P(GemmInt4Guard, ReadsStayInsideEveryBuffer) {
  const std::vector<GuardCase> cases = hand_picked_cases(QMOE_WEIGHT_FORMAT_INT4);
  const uint64_t seed = fresh_seed();
  FaultReport report;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string replay =
        "case " + std::to_string(i) + ", QMOE_TEST_SEED=" + std::to_string(seed);
    if (!check_case(GetParam(), cases[i], seed + i, replay)) return;
  }
}

// Random draws from the whole cross product (N 1..70, every block size, K up to 384, M 1..5,
// every dtype, order, zero-point and bias option, random partial columns), for what the table
// leaves out. QMOE_TEST_SEED replays a failure.
TEST_P(GemmInt4Guard, ReadsStayInsideEveryBufferRandomShapes) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const uint32_t tails[] = {1, 7, 13, 45, 8, 24};
  FaultReport report;
  for (int iteration = 0; iteration < 150; ++iteration) {
    GuardCase c{};
    Int4Options& o = c.w;
    o = random_int4_options(rng, 384);
    // Half the draws from the tails the table uses, half anywhere in 1..70.
    if (rng() % 2) o.n = tails[rng() % 6];
    c.m = static_cast<uint32_t>(1 + rng() % 5);
    const uint32_t a = static_cast<uint32_t>(rng() % o.n), b = static_cast<uint32_t>(rng() % o.n);
    c.n_begin = std::min(a, b);
    c.n_end = std::max(a, b) + 1;
    const std::string replay =
        "draw " + std::to_string(iteration) + ", QMOE_TEST_SEED=" + std::to_string(seed);
    if (!check_case(GetParam(), c, seed + 1000 + iteration, replay)) return;
  }
}

// The INT3 kernels (96-byte tiles) through the hand-picked cases and 50 random draws.
TEST_P(GemmInt4Guard, Int3ReadsStayInsideEveryBuffer) {
  const std::vector<GuardCase> cases = hand_picked_cases(QMOE_WEIGHT_FORMAT_INT3);
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  FaultReport report;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string replay =
        "INT3 case " + std::to_string(i) + ", QMOE_TEST_SEED=" + std::to_string(seed);
    if (!check_case(GetParam(), cases[i], seed + i, replay)) return;
  }
  for (int iteration = 0; iteration < 50; ++iteration) {
    GuardCase c{};
    c.format = QMOE_WEIGHT_FORMAT_INT3;
    c.w = random_int4_options(rng, 384);
    c.m = static_cast<uint32_t>(1 + rng() % 5);
    const uint32_t a = static_cast<uint32_t>(rng() % c.w.n),
                   b = static_cast<uint32_t>(rng() % c.w.n);
    c.n_begin = std::min(a, b);
    c.n_end = std::max(a, b) + 1;
    const std::string replay =
        "INT3 draw " + std::to_string(iteration) + ", QMOE_TEST_SEED=" + std::to_string(seed);
    if (!check_case(GetParam(), c, seed + 1000 + iteration, replay)) return;
  }
}

#else

class GemmInt4Guard : public IsaTest {};

TEST_P(GemmInt4Guard, ReadsStayInsideEveryBuffer) {
  GTEST_SKIP() << "guard pages need mmap/mprotect";
}

#endif

QMOE_INSTANTIATE_ISA_TEST_SUITE(GemmInt4Guard);

}  // namespace
}  // namespace qmoe::testing
