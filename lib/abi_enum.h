// Reading enum fields of caller-supplied structs. A C caller can store any int in a field of
// enum type; in C++ loading a value outside the enum's range through the enum type is
// undefined (UBSan reports it), so fields are read as their 32-bit representation and
// validated before any enum-typed load.
#ifndef QMOE_LIB_ABI_ENUM_H_
#define QMOE_LIB_ABI_ENUM_H_

#include <cstdint>
#include <cstring>

namespace qmoe {

template <typename Enum>
int32_t enum_bits(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "public enums are 32-bit");
  int32_t bits;
  std::memcpy(&bits, &field, sizeof bits);
  return bits;
}

}  // namespace qmoe

#endif  // QMOE_LIB_ABI_ENUM_H_
