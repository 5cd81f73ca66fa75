#include "lib/store/store_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/formats/grouped_plane.h"
#include "lib/formats/quant_matrix.h"
#include "lib/store/crc32c.h"
#include "lib/store/store_layout.h"

namespace qmoe {
namespace {

StoreProjection projection_of(const qmoe_quant_matrix& w) {
  StoreProjection p;
  p.format = static_cast<uint32_t>(w.format);
  p.block_size = w.block_size;
  p.scale_dtype = static_cast<uint32_t>(w.scale_dtype);
  p.flags =
      (w.zero_points != nullptr ? kStoreZeroPoints : 0u) | (w.bias != nullptr ? kStoreBias : 0u);
  p.bias_dtype = w.bias != nullptr ? static_cast<uint32_t>(w.bias_dtype) : 0u;
  return p;
}

const char* projection_difference(const StoreProjection& a, const StoreProjection& b) {
  if (a.format != b.format) return "format";
  if (a.block_size != b.block_size) return "block size";
  if (a.scale_dtype != b.scale_dtype) return "scale dtype";
  if ((a.flags & kStoreZeroPoints) != (b.flags & kStoreZeroPoints)) return "zero points";
  if (a.flags != b.flags || a.bias_dtype != b.bias_dtype) return "bias";
  return nullptr;
}

StoreShape shape_of(const ExpertSet& set) {
  StoreShape s;
  s.experts = set.num_experts;
  s.hidden = set.hidden;
  s.intermediate = set.intermediate;
  s.fusion = set.interleaved ? QMOE_SWIGLU_INTERLEAVED : QMOE_SWIGLU_CONCATENATED;
  s.alpha = set.alpha;
  s.beta = set.beta;
  s.limit = set.clamp ? set.limit : INFINITY;
  s.fc1 = projection_of(set.fc1[0].w);
  s.fc2 = projection_of(set.fc2[0].w);
  return s;
}

// A projection's planes into the record: the codes as they are, the scale and zero-point planes
// regrouped from whatever strides describe them (group_plane, the importers' and
// qmoe_group_plane's copy), the bias as it is.
qmoe_status fill_projection(const qmoe_quant_matrix& w, const ProjectionPlanes& planes,
                            unsigned char* record, const char* function) {
  std::memcpy(record + planes.codes, w.codes, planes.codes_bytes);
  const uint32_t blocks = w.k / w.block_size;
  if (const qmoe_status s = group_plane(
          function, w.scales, w.n, blocks, dtype_size(w.scale_dtype), w.scale_row_stride,
          w.scale_block_stride, w.scale_group_stride, record + planes.scales, planes.scales_bytes);
      s != QMOE_STATUS_OK) {
    return s;
  }
  if (w.zero_points != nullptr) {
    if (const qmoe_status s =
            group_plane(function, w.zero_points, w.n, blocks, 1, w.zero_point_row_stride,
                        w.zero_point_block_stride, w.zero_point_group_stride,
                        record + planes.zero_points, planes.zero_points_bytes);
        s != QMOE_STATUS_OK) {
      return s;
    }
  }
  if (w.bias != nullptr) std::memcpy(record + planes.bias, w.bias, planes.bias_bytes);
  return QMOE_STATUS_OK;
}

// write(2) until done; false with errno set on failure.
bool write_all(int fd, const unsigned char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The partial file: removed unless committed.
class PartialFile {
 public:
  explicit PartialFile(std::string path) : path_(std::move(path)) {}
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;
  ~PartialFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && created_) ::unlink(path_.c_str());
  }
  bool create() {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    created_ = fd_ >= 0;
    return created_;
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // fsync, close and rename over `target`; false with errno set on failure.
  bool commit(const char* target) {
    if (::fsync(fd_) != 0) return false;
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return false;
    if (::rename(path_.c_str(), target) != 0) return false;
    committed_ = true;
    return true;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool created_ = false, committed_ = false;
};

}  // namespace

qmoe_status write_expert_store(const char* path, const ExpertSet* const* layers,
                               uint32_t num_layers, const char* function) {
  StoreShape shape = shape_of(*layers[0]);
  shape.layers = num_layers;
  // Every layer and expert must share the first's shape: the file describes them once.
  for (uint32_t l = 0; l < num_layers; ++l) {
    const ExpertSet& set = *layers[l];
    StoreShape s = shape_of(set);
    s.layers = num_layers;
    if (s.experts != shape.experts || s.hidden != shape.hidden ||
        s.intermediate != shape.intermediate) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "layer %u has E, H, I = %u, %u, %u; layer 0 has %u, %u, %u", l, s.experts,
                  s.hidden, s.intermediate, shape.experts, shape.hidden, shape.intermediate);
    }
    if (s.fusion != shape.fusion || s.alpha != shape.alpha || s.beta != shape.beta ||
        !(s.limit == shape.limit)) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "layer %u's SwiGLU fusion or constants differ from layer 0's", l);
    }
    for (uint32_t e = 0; e < set.num_experts; ++e) {
      const char* fc1 = projection_difference(projection_of(set.fc1[e].w), shape.fc1);
      const char* fc2 = projection_difference(projection_of(set.fc2[e].w), shape.fc2);
      if (fc1 != nullptr || fc2 != nullptr) {
        return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                    "layer %u expert %u: its %s %s differs from layer 0 expert 0's (a store "
                    "holds one of each per projection)",
                    l, e, fc1 != nullptr ? "fc1" : "fc2", fc1 != nullptr ? fc1 : fc2);
      }
    }
  }
  RecordLayout layout;
  if (const qmoe_status st =
          check_store_shape(shape, QMOE_STATUS_INVALID_ARGUMENT, function, &layout);
      st != QMOE_STATUS_OK) {
    return st;
  }
  StoreHeader header;
  header.shape = shape;
  header.expert_bytes = layout.bytes;
  header.data_offset = kStoreDataOffset;
  header.file_bytes =
      kStoreDataOffset + uint64_t{num_layers} * shape.experts * uint64_t{layout.bytes};

  std::unique_ptr<unsigned char[]> record(new (std::nothrow) unsigned char[layout.bytes]);
  if (record == nullptr) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "cannot allocate a %zu-byte record buffer",
                layout.bytes);
  }
  PartialFile file(std::string(path) + ".partial");
  auto io_failure = [&](const char* what) {
    return fail(QMOE_STATUS_IO_ERROR, function, "%s '%s': %s", what, file.path().c_str(),
                std::strerror(errno));
  };
  if (!file.create()) return io_failure("cannot create");
  {
    unsigned char block[kStoreDataOffset] = {};
    encode_store_header(header, block);
    if (!write_all(file.fd(), block, sizeof block)) return io_failure("cannot write");
  }
  for (uint32_t l = 0; l < num_layers; ++l) {
    for (uint32_t e = 0; e < shape.experts; ++e) {
      unsigned char* r = record.get();
      std::memset(r, 0, layout.bytes);
      RecordHeader rh;
      rh.layer = l;
      rh.expert = e;
      rh.fc1_global_scale = layers[l]->fc1[e].w.global_scale;
      rh.fc2_global_scale = layers[l]->fc2[e].w.global_scale;
      // The sets were validated, so their planes regroup; a refusal is passed on all the same.
      if (const qmoe_status s = fill_projection(layers[l]->fc1[e].w, layout.fc1, r, function);
          s != QMOE_STATUS_OK) {
        return s;
      }
      if (const qmoe_status s = fill_projection(layers[l]->fc2[e].w, layout.fc2, r, function);
          s != QMOE_STATUS_OK) {
        return s;
      }
      // The CRC covers the global scales in the header's bytes [16, 24) and everything after.
      encode_record_header(rh, r);
      rh.crc = crc32c(r + 16, layout.bytes - 16);
      encode_record_header(rh, r);
      if (!write_all(file.fd(), r, layout.bytes)) return io_failure("cannot write");
    }
  }
  if (!file.commit(path)) return io_failure("cannot flush and rename");
  return QMOE_STATUS_OK;
}

}  // namespace qmoe
