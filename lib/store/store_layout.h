// The expert store file's byte layout (docs/formats.md, "Expert store files"): the header, the
// record header, and where each plane sits in a record. Pure functions over bytes and shapes;
// the reader (store_file) and the writer (store_writer) share them, so the two cannot disagree.
//
// All integers and floats are little-endian. The file: a 4096-byte header block (the first 128
// bytes meaningful, the rest zero), then L * E records of expert_bytes each, layer-major
// (layer l's expert e at data_offset + (l * E + e) * expert_bytes).
#ifndef QMOE_LIB_STORE_STORE_LAYOUT_H_
#define QMOE_LIB_STORE_STORE_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "qmoe/qmoe.h"

namespace qmoe {

inline constexpr unsigned char kStoreMagic[8] = {'Q', 'M', 'O', 'E', 'S', 'T', 'O', 'R'};
inline constexpr uint32_t kStoreVersion = 1;
inline constexpr size_t kStoreHeaderBytes = 128;    // the header's meaningful bytes
inline constexpr uint64_t kStoreDataOffset = 4096;  // records start here (version 1)
inline constexpr size_t kStoreAlign = 4096;         // expert_bytes is a multiple of this
inline constexpr size_t kRecordHeaderBytes = 64;
inline constexpr size_t kPlaneAlign = 64;  // each plane starts at a multiple of this in a record
inline constexpr unsigned char kRecordMagic[4] = {'Q', 'R', 'E', 'C'};

// Bits of StoreProjection::flags.
inline constexpr uint32_t kStoreZeroPoints = 1u;  // a zero-point plane follows the scales
inline constexpr uint32_t kStoreBias = 2u;        // a bias follows (the zero points)

/// What every expert's FC1 (or FC2) shares: 24 bytes in the header (format, block size, scale
/// dtype, flags, bias dtype, a zero word).
struct StoreProjection {
  uint32_t format = 0;       // qmoe_weight_format value
  uint32_t block_size = 0;   // k of one scale
  uint32_t scale_dtype = 0;  // qmoe_dtype value
  uint32_t flags = 0;        // kStoreZeroPoints | kStoreBias
  uint32_t bias_dtype = 0;   // qmoe_dtype value with kStoreBias, else 0
};

struct StoreShape {
  uint32_t layers = 0, experts = 0, hidden = 0, intermediate = 0;
  uint32_t fusion = 0;  // qmoe_swiglu_fusion value
  float alpha = 0.0f, beta = 0.0f, limit = 0.0f;
  StoreProjection fc1, fc2;  // FC1 is [2I, H], FC2 [H, I]
};

/// One projection's planes in a record: byte offsets from the record's start and byte sizes
/// (zero_points_bytes and bias_bytes 0 without them).
struct ProjectionPlanes {
  size_t codes = 0, scales = 0, zero_points = 0, bias = 0;
  size_t codes_bytes = 0, scales_bytes = 0, zero_points_bytes = 0, bias_bytes = 0;
  uint32_t n = 0, k = 0;
};

/// Where everything of a record sits: after the 64-byte record header, FC1's codes, scales,
/// zero points and bias, then FC2's, each at the next multiple of 64; `bytes` (expert_bytes)
/// the end rounded up to 4096. Padding is zero.
struct RecordLayout {
  ProjectionPlanes fc1, fc2;
  size_t bytes = 0;
};

/// OK when `shape` is one the library runs (the formats' block sizes, scale types and planes,
/// dimensions, SwiGLU constants as qmoe_expert_set_create takes them, at least one layer and
/// expert), its record layout in *layout; otherwise `bad` (the writer passes INVALID_ARGUMENT,
/// the reader CORRUPT_DATA) or UNSUPPORTED_FORMAT for a format this build lacks, with a message
/// naming `function` and the field.
qmoe_status check_store_shape(const StoreShape& shape, qmoe_status bad, const char* function,
                              RecordLayout* layout);

struct StoreHeader {
  StoreShape shape;
  uint64_t expert_bytes = 0, data_offset = 0, file_bytes = 0;
};

/// The 128 header bytes, its CRC-32C at byte 12 over bytes [16, 128).
void encode_store_header(const StoreHeader& header, unsigned char out[kStoreHeaderBytes]);

/// Decodes and checks header bytes read from a file of `file_bytes`: magic, version (newer:
/// UNSUPPORTED_FORMAT), CRC, the shape (check_store_shape), expert_bytes against the shape's
/// layout, data_offset, file_bytes against the shape and against the file. CORRUPT_DATA
/// otherwise, naming `path` and the field.
qmoe_status decode_store_header(const unsigned char in[kStoreHeaderBytes], uint64_t file_bytes,
                                const char* path, const char* function, StoreHeader* header,
                                RecordLayout* layout);

/// A record's first 64 bytes: magic "QREC", layer, expert, CRC-32C of the record's bytes
/// [16, expert_bytes), the FC1 and FC2 global scales (FP32; 0 for none), then zeros.
struct RecordHeader {
  uint32_t layer = 0, expert = 0, crc = 0;
  float fc1_global_scale = 0.0f, fc2_global_scale = 0.0f;
};
void encode_record_header(const RecordHeader& header, unsigned char out[kRecordHeaderBytes]);
/// False when the magic is wrong (the rest is then unspecified).
bool decode_record_header(const unsigned char in[kRecordHeaderBytes], RecordHeader* header);

/// The description of one projection of a record at `record` (planes as in `planes`; scales and
/// zero points in the grouped order: row stride 1, block stride 8, group stride 8 * blocks).
qmoe_quant_matrix describe_record_projection(const unsigned char* record,
                                             const StoreProjection& projection,
                                             const ProjectionPlanes& planes, float global_scale);

}  // namespace qmoe

#endif  // QMOE_LIB_STORE_STORE_LAYOUT_H_
