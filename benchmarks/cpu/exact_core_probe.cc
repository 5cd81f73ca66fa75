// qmoe_exact_core_probe: the ceiling of the AVX2 exact kernel at M = 1 on this core. Per 8
// weights the kernel (lib/cpu/avx2/gemm_int4_exact_8x32_avx2.cc) runs one vpshufb (code byte to the
// top of an int32 lane), one vcvtdq2ps and one FMA: 32 such triples per 128-byte chunk of codes
// (8 rows x 32 k). This loop runs only those triples, over 8 KiB of codes in L1, into eight
// independent accumulators, and reports cycles per chunk against a clock it measures with a
// chain of dependent vaddps (3 cycles each on the AVX2 cores this project targets). No exact
// kernel of this form can beat it, whatever else it does per chunk;
// docs/results/2026-11-30-int4-gemm-limits.md puts it beside the kernel's own warm time
// (`qmoe_gemm_latency --accuracy exact`) and the read roof.
//
//   qmoe_exact_core_probe [--rounds R]
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kChunks = 64;  // 8 KiB of codes: L1-resident
constexpr int kChunkBytes = 128;

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Cycles per second from a chain of dependent vaddps (latency 3 on Zen 2-4 and on Intel cores
// from Skylake on: 4 per iteration, 12 cycles).
__attribute__((target("avx2"))) double measure_hz() {
  __m256 a = _mm256_set1_ps(1.0f);
  const __m256 b = _mm256_set1_ps(1e-9f);
  const long iterations = 20000000;
  const double t0 = seconds_now();
  for (long i = 0; i < iterations; ++i) {
    a = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a, b), b), b), b);
    asm volatile("" : "+x"(a));  // keeps the chain: no reassociation, no hoisting
  }
  const double t1 = seconds_now();
  volatile float sink = _mm256_cvtss_f32(a);
  (void)sink;
  return 12.0 * iterations / (t1 - t0);
}

// Selector q: bytes 4q..4q+3 of each 128-bit lane into the top byte of dwords 0..3 (the
// kernel's byte_to_dword_selector(q, 3)).
__attribute__((target("avx2"))) __m256i top_byte_selector(int q) {
  alignas(32) int8_t s[32];
  for (int i = 0; i < 32; ++i)
    s[i] = (i & 3) == 3 ? static_cast<int8_t>(4 * q + ((i & 15) >> 2)) : -128;
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(s));
}

// A result the caller must see, so that no loop is optimised away; returned as a float, since
// callers without AVX enabled cannot take an __m256.
__attribute__((target("avx2"))) float first_lane(__m256 v) {
  return _mm256_cvtss_f32(v);
}

// The triple alone: 32 per chunk into eight independent accumulators.
__attribute__((target("avx2,fma"))) float triples(const uint8_t* codes, const float* x,
                                                  int passes) {
  const __m256i s0 = top_byte_selector(0), s1 = top_byte_selector(1), s2 = top_byte_selector(2),
                s3 = top_byte_selector(3);
  const __m256 x0 = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x));
  const __m256 x1 = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x + 4));
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int pass = 0; pass < passes; ++pass) {
    for (int c = 0; c < kChunks; ++c) {
      for (int v = 0; v < 4; ++v) {  // 4 loads of 32 bytes; 8 triples each
        const __m256i n =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + c * kChunkBytes + 32 * v));
        const __m256i sel[4] = {s0, s1, s2, s3};
        for (int j = 0; j < 8; ++j) {
          const __m256 w = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(n, sel[j & 3]));
          acc[j] = _mm256_fmadd_ps(w, (j & 1) ? x1 : x0, acc[j]);
        }
      }
    }
  }
  __m256 sum = acc[0];
  for (int j = 1; j < 8; ++j) sum = _mm256_add_ps(sum, acc[j]);
  return first_lane(sum);
}

template <typename Loop>
double best_seconds_per_chunk(Loop&& loop, int passes, int rounds) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = seconds_now();
    volatile float sink = loop(passes);
    const double t1 = seconds_now();
    (void)sink;
    const double per_chunk = (t1 - t0) / (static_cast<double>(passes) * kChunks);
    if (per_chunk < best) best = per_chunk;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: qmoe_exact_core_probe [--rounds R]\n");
      return 2;
    }
  }
  if (rounds < 1) rounds = 1;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("qmoe_exact_core_probe: this CPU has no AVX2 and FMA; nothing to measure\n");
    return 0;
  }
  std::vector<uint8_t> codes(kChunks * kChunkBytes);
  std::vector<float> x(32 * kChunks);
  for (size_t i = 0; i < codes.size(); ++i)
    codes[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(static_cast<int>(i % 201) - 100) / 37.0f;

  const int passes = 20000;  // 1.28 M chunks, about 12 ms a round
  for (int r = 0; r < rounds; ++r) {
    const double hz = measure_hz();
    const double triple = best_seconds_per_chunk(
        [&](int n) { return triples(codes.data(), x.data(), n); }, passes, 3);
    std::printf("clock %.2f GHz | 32 triples: %.1f cycles per chunk, %.1f GB/s of codes\n",
                hz / 1e9, triple * hz, kChunkBytes / triple / 1e9);
  }
  return 0;
}
