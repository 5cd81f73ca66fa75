// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF),
// the checksum of expert store files (docs/formats.md). CRC-32C("123456789") = 0xE3069283.
#ifndef QMOE_LIB_STORE_CRC32C_H_
#define QMOE_LIB_STORE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace qmoe {

/// CRC-32C of `bytes` bytes at `data`, continuing from `crc` (the value a previous call
/// returned; 0 to start): crc32c(b, crc32c(a)) == crc32c(a followed by b). The SSE4.2 crc32
/// instruction where the host has it, else tables.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

/// The table version alone, for tests to compare the two.
uint32_t crc32c_portable(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace qmoe

#endif  // QMOE_LIB_STORE_CRC32C_H_
