// An open expert store file: its checked header and positioned reads of its records
// (qmoe_expert_store_open / _read). Immutable after open, so any threads may read at once.
#ifndef QMOE_LIB_STORE_STORE_FILE_H_
#define QMOE_LIB_STORE_STORE_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "lib/store/store_layout.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// What a record holds instead of the expected (layer, expert), as text for a message.
struct RecordMismatch {
  char text[64] = {};
};

class StoreFile {
 public:
  StoreFile() = default;
  ~StoreFile();
  StoreFile(const StoreFile&) = delete;
  StoreFile& operator=(const StoreFile&) = delete;

  /// Opens `path` and checks its header (decode_store_header); messages name `function`.
  qmoe_status open(const char* path, const char* function);

  const StoreHeader& header() const { return header_; }
  const RecordLayout& layout() const { return layout_; }
  const std::string& path() const { return path_; }

  /// Reads the record of (layer, expert), both in range, into `dst` (expert_bytes), checks its
  /// header against them, and with `verify` its CRC-32C. IO_ERROR or CORRUPT_DATA otherwise.
  qmoe_status read_record(uint32_t layer, uint32_t expert, bool verify, unsigned char* dst,
                          const char* function) const;

  /// The whole file mapped read-only (MAP_SHARED: the page cache's own pages), made at open;
  /// null when mmap failed (*map_error then has the OS's reason). Shared: a set made over it
  /// holds a reference, so it is unmapped when the store and every such set are gone.
  const std::shared_ptr<const unsigned char>& mapping() const { return mapping_; }
  const char* map_error() const { return map_error_; }

  /// The record of (layer, expert) in the mapping (which must exist), and the record's bytes.
  const unsigned char* mapped_record(uint32_t layer, uint32_t expert) const {
    return mapping_.get() + record_offset(layer, expert);
  }
  uint64_t record_offset(uint32_t layer, uint32_t expert) const {
    return header_.data_offset +
           (uint64_t{layer} * header_.shape.experts + expert) * header_.expert_bytes;
  }

  /// Asks the OS to read the record's pages of the mapping (MADV_WILLNEED; advice, no failure).
  void prefetch_record(uint32_t layer, uint32_t expert) const;
  /// *in_memory = whether every page of the record is in the page cache (mincore); IO_ERROR
  /// naming `function` when mincore fails. Both need the mapping.
  qmoe_status record_in_memory(uint32_t layer, uint32_t expert, bool* in_memory,
                               const char* function) const;

  /// Whether the record at `record` (its first 64 bytes) belongs to (layer, expert), its header
  /// in *header; *why names what it holds instead when not.
  bool record_matches(const unsigned char* record, uint32_t layer, uint32_t expert,
                      RecordHeader* header, RecordMismatch* why) const;

 private:
  int fd_ = -1;
  std::string path_;
  StoreHeader header_;
  RecordLayout layout_;
  std::shared_ptr<const unsigned char> mapping_;
  char map_error_[96] = {};
};

}  // namespace qmoe

#endif  // QMOE_LIB_STORE_STORE_FILE_H_
