#include "lib/store/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <nmmintrin.h>
#define QMOE_CRC32C_SSE42 1
#endif

namespace qmoe {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected Castagnoli

// Slicing-by-8 tables: table[0] is the byte-at-a-time table, table[j][b] the CRC of byte b
// followed by j zero bytes.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? kPolynomial : 0u);
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (size_t j = 1; j < 8; ++j) t[j][b] = (t[j - 1][b] >> 8) ^ t[0][t[j - 1][b] & 0xFF];
    }
  }
};

const Tables& tables() {
  static const Tables instance;
  return instance;
}

// Both versions work on the running state (the CRC before its final XOR).
uint32_t update_portable(uint32_t state, const unsigned char* p, size_t n) {
  const auto& t = tables().t;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);  // little-endian hosts only (x86-64, AArch64 LE)
    std::memcpy(&hi, p + 4, 4);
    lo ^= state;
    state = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
            t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) state = (state >> 8) ^ t[0][(state ^ *p++) & 0xFF];
  return state;
}

#ifdef QMOE_CRC32C_SSE42
// The crc32 instruction has a latency of 3 cycles and a throughput of 1, so one dependency
// chain runs at a third of its rate. Blocks of 3 x kStream bytes run as three chains (the
// second and third from a zero register), joined by linearity: the register after A B C from
// s is shift(shift(sA) ^ sB) ^ sC, where shift feeds kStream zero bytes, a linear map of the
// 32-bit register precomputed as 4 byte tables (shift2 is shift applied twice).
constexpr size_t kStream = 8192;

// Feeding `n` zero bytes to register `state`.
uint32_t feed_zeros(uint32_t state, size_t n) {
  const auto& t0 = tables().t[0];
  for (size_t i = 0; i < n; ++i) state = (state >> 8) ^ t0[state & 0xFF];
  return state;
}

struct ShiftTables {
  std::array<std::array<uint32_t, 256>, 4> once{}, twice{};
  ShiftTables() {
    uint32_t basis1[32], basis2[32];
    for (int bit = 0; bit < 32; ++bit) {
      basis1[bit] = feed_zeros(1u << bit, kStream);
      basis2[bit] = feed_zeros(basis1[bit], kStream);
    }
    for (int j = 0; j < 4; ++j) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t a = 0, c = 0;
        for (int i = 0; i < 8; ++i) {
          if ((b >> i) & 1u) {
            a ^= basis1[8 * j + i];
            c ^= basis2[8 * j + i];
          }
        }
        once[j][b] = a;
        twice[j][b] = c;
      }
    }
  }
};

uint32_t apply(const std::array<std::array<uint32_t, 256>, 4>& t, uint32_t x) {
  return t[0][x & 0xFF] ^ t[1][(x >> 8) & 0xFF] ^ t[2][(x >> 16) & 0xFF] ^ t[3][x >> 24];
}

__attribute__((target("sse4.2"))) uint32_t update_sse42(uint32_t state, const unsigned char* p,
                                                        size_t n) {
  if (n >= 3 * kStream) {
    static const ShiftTables shifts;
    while (n >= 3 * kStream) {
      uint64_t a = state, b = 0, c = 0;
      for (size_t i = 0; i < kStream; i += 8) {
        uint64_t va, vb, vc;
        std::memcpy(&va, p + i, 8);
        std::memcpy(&vb, p + kStream + i, 8);
        std::memcpy(&vc, p + 2 * kStream + i, 8);
        a = _mm_crc32_u64(a, va);
        b = _mm_crc32_u64(b, vb);
        c = _mm_crc32_u64(c, vc);
      }
      state = apply(shifts.twice, static_cast<uint32_t>(a)) ^
              apply(shifts.once, static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(c);
      p += 3 * kStream;
      n -= 3 * kStream;
    }
  }
  uint64_t s = state;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    s = _mm_crc32_u64(s, v);
    p += 8;
    n -= 8;
  }
  uint32_t s32 = static_cast<uint32_t>(s);
  while (n-- > 0) s32 = _mm_crc32_u8(s32, *p++);
  return s32;
}

bool host_has_sse42() {
  // A checksum helper outside the kernel tiers: GCC's and Clang's own CPUID probe is enough.
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c_portable(const void* data, size_t bytes, uint32_t crc) {
  return ~update_portable(~crc, static_cast<const unsigned char*>(data), bytes);
}

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
#ifdef QMOE_CRC32C_SSE42
  if (host_has_sse42()) return ~update_sse42(~crc, static_cast<const unsigned char*>(data), bytes);
#endif
  return crc32c_portable(data, bytes, crc);
}

}  // namespace qmoe
