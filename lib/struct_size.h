// Checking the struct_size of a caller's versioned ABI struct (qmoe_context_options,
// qmoe_quant_matrix, qmoe_expert_set_desc, qmoe_moe_params, qmoe_host_info).
//
// libqmoe copies min(struct_size, sizeof) bytes of such a struct and gives every field past
// the copy its default, so a caller compiled against an older, shorter version keeps working.
// A size that ends inside a field would copy only part of it (half a function pointer, say)
// and leave the rest zero: no version of the struct ever had that size, so it is refused.
#ifndef QMOE_LIB_STRUCT_SIZE_H_
#define QMOE_LIB_STRUCT_SIZE_H_

#include <cstddef>

namespace qmoe {

/// Where one field of an ABI struct lies.
struct FieldSpan {
  size_t offset, size;
};

#define QMOE_FIELD(Type, field)                                       \
  ::qmoe::FieldSpan {                                                 \
    offsetof(Type, field), sizeof(static_cast<Type*>(nullptr)->field) \
  }

/// The most any struct_size may claim (a larger one is a caller's error, not a newer version).
inline constexpr size_t kMaxStructSize = size_t{1} << 16;

/// Whether `size` is one a version of the struct could have: at least `required`, at most
/// kMaxStructSize, and not ending strictly inside any of `fields`.
template <size_t kFields>
bool struct_size_ok(size_t size, size_t required, const FieldSpan (&fields)[kFields]) {
  if (size < required || size > kMaxStructSize) return false;
  for (const FieldSpan& f : fields) {
    if (size > f.offset && size < f.offset + f.size) return false;
  }
  return true;
}

/// struct_size_ok for a struct with one version so far: from `required` to kMaxStructSize.
inline bool struct_size_ok(size_t size, size_t required) {
  return size >= required && size <= kMaxStructSize;
}

}  // namespace qmoe

#endif  // QMOE_LIB_STRUCT_SIZE_H_
