#include "lib/formats/format_traits.h"

#include "lib/formats/quant_matrix.h"
#include "lib/formats/tiles.h"

namespace qmoe {
namespace {

constexpr const FormatTraits* kFormats[] = {
#define QMOE_FORMAT(token, value, traits) &traits,
#include "lib/formats/format_list.inc"
#undef QMOE_FORMAT
};

constexpr qmoe_weight_format kFormatValues[] = {
#define QMOE_FORMAT(token, value, traits) value,
#include "lib/formats/format_list.inc"
#undef QMOE_FORMAT
};

constexpr bool values_in_order() {
  for (size_t i = 0; i < sizeof(kFormatValues) / sizeof(kFormatValues[0]); ++i) {
    if (i > 0 && kFormatValues[i] <= kFormatValues[i - 1]) return false;
    if (format_slot(kFormatValues[i]) != i) return false;
  }
  return true;
}
static_assert(values_in_order(),
              "format_list.inc lists its formats in ascending value order, each once: "
              "format_slot() indexes the kernel tables by the row's position");

}  // namespace

uint32_t tile_bytes(const FormatTraits& format) {
  return kGroupRows * format.tile_row_bytes;
}

const FormatTraits* find_format(int32_t format) {
  for (const FormatTraits* traits : kFormats) {
    if (static_cast<int32_t>(traits->format) == format) return traits;
  }
  return nullptr;
}

uint32_t format_count() {
  return sizeof(kFormats) / sizeof(kFormats[0]);
}

const FormatTraits& format_at(uint32_t i) {
  return *kFormats[i];
}

bool format_accepts_block_size(const FormatTraits& format, uint32_t block_size) {
  return block_size != 0 && (block_size & (block_size - 1)) == 0 && block_size < (1u << 31) &&
         (format.block_sizes & block_size) != 0;
}

bool format_accepts_scale_dtype(const FormatTraits& format, int32_t scale_dtype) {
  return scale_dtype > 0 && scale_dtype < 32 && (format.scale_dtypes >> scale_dtype & 1u) != 0;
}

size_t codes_size(const FormatTraits& format, uint32_t n, uint32_t k) {
  return size_t{row_groups(n)} * chunk_count(k) * tile_bytes(format);
}

}  // namespace qmoe
