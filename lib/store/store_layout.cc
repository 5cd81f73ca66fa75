#include "lib/store/store_layout.h"

#include <cmath>
#include <cstring>

#include "lib/error.h"
#include "lib/formats/format_traits.h"
#include "lib/formats/grouped_plane.h"
#include "lib/formats/quant_matrix.h"
#include "lib/store/crc32c.h"

namespace qmoe {
namespace {

size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_f32(unsigned char* p, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  put_u32(p, bits);
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
float get_f32(const unsigned char* p) {
  const uint32_t bits = get_u32(p);
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

bool is_bias_dtype(uint32_t d) {
  return d == QMOE_DTYPE_F32 || d == QMOE_DTYPE_F16 || d == QMOE_DTYPE_BF16;
}

// One projection's rules and planes; `offset` is where its first plane may start, and is
// advanced past its last.
qmoe_status check_projection(const StoreProjection& p, const char* name, uint32_t n, uint32_t k,
                             qmoe_status bad, const char* function, size_t* offset,
                             ProjectionPlanes* planes) {
  const FormatTraits* traits = find_format(static_cast<int32_t>(p.format));
  if (traits == nullptr) {
    return fail(QMOE_STATUS_UNSUPPORTED_FORMAT, function,
                "%s format %u is not a weight format this build has", name, p.format);
  }
  if (!format_accepts_block_size(*traits, p.block_size) || k % p.block_size != 0) {
    return fail(bad, function, "%s block size %u is not one %s takes for k = %u", name,
                p.block_size, traits->name, k);
  }
  if (!format_accepts_scale_dtype(*traits, static_cast<int32_t>(p.scale_dtype))) {
    return fail(bad, function, "%s scale dtype %u is not one %s takes", name, p.scale_dtype,
                traits->name);
  }
  if ((p.flags & ~(kStoreZeroPoints | kStoreBias)) != 0) {
    return fail(bad, function, "%s flags 0x%x have unknown bits", name, p.flags);
  }
  if ((p.flags & kStoreZeroPoints) != 0 && !traits->zero_points) {
    return fail(bad, function, "%s has zero points, which %s does not take", name, traits->name);
  }
  const bool bias = (p.flags & kStoreBias) != 0;
  if (bias ? !is_bias_dtype(p.bias_dtype) : p.bias_dtype != 0) {
    return fail(bad, function, "%s bias dtype %u does not fit its flags 0x%x", name, p.bias_dtype,
                p.flags);
  }
  const uint32_t blocks = k / p.block_size;
  const size_t grouped = grouped_plane_elements(n, blocks);
  planes->n = n;
  planes->k = k;
  planes->codes_bytes = codes_size(*traits, n, k);
  planes->scales_bytes = grouped * dtype_size(static_cast<qmoe_dtype>(p.scale_dtype));
  planes->zero_points_bytes = (p.flags & kStoreZeroPoints) != 0 ? grouped : 0;
  planes->bias_bytes = bias ? size_t{n} * dtype_size(static_cast<qmoe_dtype>(p.bias_dtype)) : 0;
  // n and k are at most 2^31 (checked by the caller): every size and sum below is under 2^62.
  size_t at = align_up(*offset, kPlaneAlign);
  planes->codes = at;
  at = align_up(at + planes->codes_bytes, kPlaneAlign);
  planes->scales = at;
  at = align_up(at + planes->scales_bytes, kPlaneAlign);
  planes->zero_points = at;
  at = align_up(at + planes->zero_points_bytes, kPlaneAlign);
  planes->bias = at;
  *offset = at + planes->bias_bytes;
  return QMOE_STATUS_OK;
}

}  // namespace

qmoe_status check_store_shape(const StoreShape& s, qmoe_status bad, const char* function,
                              RecordLayout* layout) {
  if (s.layers == 0 || s.experts == 0) {
    return fail(bad, function, "layers = %u and experts = %u must be >= 1", s.layers, s.experts);
  }
  if (s.hidden == 0 || s.intermediate == 0 || s.hidden > QMOE_MAX_MATRIX_DIM ||
      s.intermediate > QMOE_MAX_MATRIX_DIM / 2) {
    return fail(bad, function, "hidden = %u and intermediate = %u: need 1 <= H, 2 * I <= 2^31",
                s.hidden, s.intermediate);
  }
  if (s.fusion != QMOE_SWIGLU_INTERLEAVED && s.fusion != QMOE_SWIGLU_CONCATENATED) {
    return fail(bad, function, "SwiGLU fusion %u is not a qmoe_swiglu_fusion", s.fusion);
  }
  if (!std::isfinite(s.alpha) || !std::isfinite(s.beta) || std::isnan(s.limit) || s.limit <= 0.0f) {
    return fail(bad, function,
                "SwiGLU alpha = %g and beta = %g must be finite and limit = %g > 0 (or +inf)",
                s.alpha, s.beta, s.limit);
  }
  size_t offset = kRecordHeaderBytes;
  if (const qmoe_status st = check_projection(s.fc1, "fc1", 2 * s.intermediate, s.hidden, bad,
                                              function, &offset, &layout->fc1);
      st != QMOE_STATUS_OK) {
    return st;
  }
  if (const qmoe_status st = check_projection(s.fc2, "fc2", s.hidden, s.intermediate, bad, function,
                                              &offset, &layout->fc2);
      st != QMOE_STATUS_OK) {
    return st;
  }
  layout->bytes = align_up(offset, kStoreAlign);
  return QMOE_STATUS_OK;
}

void encode_store_header(const StoreHeader& h, unsigned char out[kStoreHeaderBytes]) {
  std::memset(out, 0, kStoreHeaderBytes);
  std::memcpy(out, kStoreMagic, 8);
  put_u32(out + 8, kStoreVersion);
  const StoreShape& s = h.shape;
  put_u32(out + 16, s.layers);
  put_u32(out + 20, s.experts);
  put_u32(out + 24, s.hidden);
  put_u32(out + 28, s.intermediate);
  put_u32(out + 32, s.fusion);
  put_f32(out + 36, s.alpha);
  put_f32(out + 40, s.beta);
  put_f32(out + 44, s.limit);
  const StoreProjection* projections[2] = {&s.fc1, &s.fc2};
  for (int i = 0; i < 2; ++i) {
    unsigned char* p = out + 48 + 24 * i;
    put_u32(p, projections[i]->format);
    put_u32(p + 4, projections[i]->block_size);
    put_u32(p + 8, projections[i]->scale_dtype);
    put_u32(p + 12, projections[i]->flags);
    put_u32(p + 16, projections[i]->bias_dtype);
  }
  put_u64(out + 96, h.expert_bytes);
  put_u64(out + 104, h.data_offset);
  put_u64(out + 112, h.file_bytes);
  put_u32(out + 12, crc32c(out + 16, kStoreHeaderBytes - 16));
}

qmoe_status decode_store_header(const unsigned char in[kStoreHeaderBytes], uint64_t file_bytes,
                                const char* path, const char* function, StoreHeader* h,
                                RecordLayout* layout) {
  if (std::memcmp(in, kStoreMagic, 8) != 0) {
    return fail(QMOE_STATUS_CORRUPT_DATA, function, "'%s' is not an expert store (magic)", path);
  }
  const uint32_t version = get_u32(in + 8);
  if (version > kStoreVersion || version == 0) {
    return fail(version == 0 ? QMOE_STATUS_CORRUPT_DATA : QMOE_STATUS_UNSUPPORTED_FORMAT, function,
                "'%s' is an expert store of version %u; this library reads version %u", path,
                version, kStoreVersion);
  }
  const uint32_t crc = get_u32(in + 12), computed = crc32c(in + 16, kStoreHeaderBytes - 16);
  if (crc != computed) {
    return fail(QMOE_STATUS_CORRUPT_DATA, function,
                "'%s': header CRC-32C is 0x%08x, the bytes give 0x%08x", path, crc, computed);
  }
  StoreShape& s = h->shape;
  s.layers = get_u32(in + 16);
  s.experts = get_u32(in + 20);
  s.hidden = get_u32(in + 24);
  s.intermediate = get_u32(in + 28);
  s.fusion = get_u32(in + 32);
  s.alpha = get_f32(in + 36);
  s.beta = get_f32(in + 40);
  s.limit = get_f32(in + 44);
  StoreProjection* projections[2] = {&s.fc1, &s.fc2};
  for (int i = 0; i < 2; ++i) {
    const unsigned char* p = in + 48 + 24 * i;
    projections[i]->format = get_u32(p);
    projections[i]->block_size = get_u32(p + 4);
    projections[i]->scale_dtype = get_u32(p + 8);
    projections[i]->flags = get_u32(p + 12);
    projections[i]->bias_dtype = get_u32(p + 16);
    if (get_u32(p + 20) != 0) {
      return fail(QMOE_STATUS_CORRUPT_DATA, function, "'%s': fc%d's reserved word is not zero",
                  path, i + 1);
    }
  }
  if (get_u64(in + 120) != 0) {
    return fail(QMOE_STATUS_CORRUPT_DATA, function, "'%s': the header's reserved word is not zero",
                path);
  }
  h->expert_bytes = get_u64(in + 96);
  h->data_offset = get_u64(in + 104);
  h->file_bytes = get_u64(in + 112);
  if (const qmoe_status st = check_store_shape(s, QMOE_STATUS_CORRUPT_DATA, function, layout);
      st != QMOE_STATUS_OK) {
    return st;
  }
  if (h->expert_bytes != layout->bytes) {
    return fail(QMOE_STATUS_CORRUPT_DATA, function,
                "'%s': expert_bytes is %llu; the shape's record takes %zu", path,
                static_cast<unsigned long long>(h->expert_bytes), layout->bytes);
  }
  if (h->data_offset != kStoreDataOffset) {
    return fail(QMOE_STATUS_CORRUPT_DATA, function, "'%s': data_offset is %llu, not %llu", path,
                static_cast<unsigned long long>(h->data_offset),
                static_cast<unsigned long long>(kStoreDataOffset));
  }
  uint64_t records = 0, record_bytes = 0, expected = 0;
  if (__builtin_mul_overflow(uint64_t{s.layers}, uint64_t{s.experts}, &records) ||
      __builtin_mul_overflow(records, h->expert_bytes, &record_bytes) ||
      __builtin_add_overflow(record_bytes, h->data_offset, &expected) ||
      expected != h->file_bytes) {
    return fail(QMOE_STATUS_CORRUPT_DATA, function,
                "'%s': file_bytes is %llu; %u layers of %u experts of %llu bytes after %llu take "
                "another size",
                path, static_cast<unsigned long long>(h->file_bytes), s.layers, s.experts,
                static_cast<unsigned long long>(h->expert_bytes),
                static_cast<unsigned long long>(h->data_offset));
  }
  if (file_bytes != h->file_bytes) {
    return fail(QMOE_STATUS_CORRUPT_DATA, function,
                "'%s' is %llu bytes; its header says %llu (truncated or appended to)", path,
                static_cast<unsigned long long>(file_bytes),
                static_cast<unsigned long long>(h->file_bytes));
  }
  return QMOE_STATUS_OK;
}

void encode_record_header(const RecordHeader& h, unsigned char out[kRecordHeaderBytes]) {
  std::memset(out, 0, kRecordHeaderBytes);
  std::memcpy(out, kRecordMagic, 4);
  put_u32(out + 4, h.layer);
  put_u32(out + 8, h.expert);
  put_u32(out + 12, h.crc);
  put_f32(out + 16, h.fc1_global_scale);
  put_f32(out + 20, h.fc2_global_scale);
}

bool decode_record_header(const unsigned char in[kRecordHeaderBytes], RecordHeader* h) {
  if (std::memcmp(in, kRecordMagic, 4) != 0) return false;
  h->layer = get_u32(in + 4);
  h->expert = get_u32(in + 8);
  h->crc = get_u32(in + 12);
  h->fc1_global_scale = get_f32(in + 16);
  h->fc2_global_scale = get_f32(in + 20);
  return true;
}

qmoe_quant_matrix describe_record_projection(const unsigned char* record,
                                             const StoreProjection& projection,
                                             const ProjectionPlanes& planes, float global_scale) {
  qmoe_quant_matrix w{};
  w.struct_size = sizeof w;
  w.format = static_cast<qmoe_weight_format>(projection.format);
  w.n = planes.n;
  w.k = planes.k;
  w.block_size = projection.block_size;
  w.codes = record + planes.codes;
  w.scale_dtype = static_cast<qmoe_dtype>(projection.scale_dtype);
  w.scales = record + planes.scales;
  const size_t blocks = planes.k / projection.block_size;
  // The grouped order (docs/formats.md): (r, b) at (r / 8) * 8 * blocks + b * 8 + r % 8.
  w.scale_row_stride = 1;
  w.scale_block_stride = 8;
  w.scale_group_stride = 8 * blocks;
  if ((projection.flags & kStoreZeroPoints) != 0) {
    w.zero_points = record + planes.zero_points;
    w.zero_point_row_stride = 1;
    w.zero_point_block_stride = 8;
    w.zero_point_group_stride = 8 * blocks;
  }
  if ((projection.flags & kStoreBias) != 0) {
    w.bias_dtype = static_cast<qmoe_dtype>(projection.bias_dtype);
    w.bias = record + planes.bias;
  } else {
    w.bias_dtype = QMOE_DTYPE_F32;
  }
  w.global_scale = global_scale;
  return w;
}

}  // namespace qmoe
