// Read-bandwidth kernel, portable tier: the XOR of every 64-bit little-endian word of
// [data, data + bytes). The result depends on every load, so none can be elided; the ABI layer
// uses it to measure how fast one core streams memory (qmoe_measure_read_bandwidth).
//
// Preconditions (checked by the caller): data is 64-byte aligned, bytes is a multiple of 64.
#include <cstring>

#include "lib/cpu/kernels.h"

namespace qmoe::scalar {

uint64_t read_bandwidth(const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  // One accumulator per word of a 64-byte line: eight independent XOR chains per line. The
  // compiler may widen these to the baseline vector width (SSE2 on x86-64); that is still the
  // portable tier. memcpy keeps the loads free of alignment and aliasing assumptions.
  uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t offset = 0; offset < bytes; offset += 64) {
    for (int j = 0; j < 8; ++j) {
      uint64_t word;
      std::memcpy(&word, p + offset + 8 * j, sizeof(word));
      acc[j] ^= word;
    }
  }
  const uint64_t x = (acc[0] ^ acc[1]) ^ (acc[2] ^ acc[3]) ^ (acc[4] ^ acc[5]) ^ (acc[6] ^ acc[7]);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  // XOR commutes with a byte swap: swapping the one result equals swapping every word.
  return __builtin_bswap64(x);
#else
  return x;
#endif
}

}  // namespace qmoe::scalar
