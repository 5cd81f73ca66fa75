#include "lib/store/store_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "lib/error.h"
#include "lib/store/crc32c.h"

namespace qmoe {
namespace {

// pread(2) until `n` bytes are in or the file ends: the bytes read, or -1 with errno set.
ssize_t pread_full(int fd, unsigned char* p, size_t n, uint64_t offset) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

size_t page_bytes() {
  static const size_t bytes = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return bytes;
}

// The pages holding bytes [offset, offset + bytes) of the mapping, as [first, end) offsets:
// records are 4096-aligned, pages may be larger (64 KiB on some AArch64 kernels).
struct PageRange {
  uint64_t first, end;
};
PageRange page_range(uint64_t offset, uint64_t bytes) {
  const uint64_t page = page_bytes();
  return {offset / page * page, (offset + bytes + page - 1) / page * page};
}

}  // namespace

StoreFile::~StoreFile() {
  if (fd_ >= 0) ::close(fd_);
}

qmoe_status StoreFile::open(const char* path, const char* function) {
  path_ = path;
  fd_ = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    return fail(QMOE_STATUS_IO_ERROR, function, "cannot open '%s': %s", path, std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    return fail(QMOE_STATUS_IO_ERROR, function, "cannot stat '%s': %s", path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return fail(QMOE_STATUS_IO_ERROR, function, "'%s' is not a regular file", path);
  }
  unsigned char bytes[kStoreHeaderBytes];
  const ssize_t got = pread_full(fd_, bytes, sizeof bytes, 0);
  if (got < 0) {
    return fail(QMOE_STATUS_IO_ERROR, function, "cannot read '%s': %s", path, std::strerror(errno));
  }
  if (static_cast<size_t>(got) < sizeof bytes) {
    return fail(QMOE_STATUS_CORRUPT_DATA, function,
                "'%s' is %zd bytes, shorter than an expert store's header", path, got);
  }
  if (const qmoe_status s = decode_store_header(bytes, static_cast<uint64_t>(st.st_size), path,
                                                function, &header_, &layout_);
      s != QMOE_STATUS_OK) {
    return s;
  }
  // Address space only: pages come from the page cache when first touched. A failure here is
  // not the file's fault, and reads work without the mapping: map_layer reports it.
  const size_t bytes_mapped = static_cast<size_t>(header_.file_bytes);
  void* p = ::mmap(nullptr, bytes_mapped, PROT_READ, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    std::snprintf(map_error_, sizeof map_error_, "%s", std::strerror(errno));
  } else {
    mapping_.reset(static_cast<const unsigned char*>(p), [bytes_mapped](const unsigned char* m) {
      ::munmap(const_cast<unsigned char*>(m), bytes_mapped);
    });
  }
  return QMOE_STATUS_OK;
}

bool StoreFile::record_matches(const unsigned char* record, uint32_t layer, uint32_t expert,
                               RecordHeader* h, RecordMismatch* why) const {
  if (!decode_record_header(record, h)) {
    std::snprintf(why->text, sizeof why->text, "no record (its magic is wrong)");
    return false;
  }
  if (h->layer != layer || h->expert != expert) {
    std::snprintf(why->text, sizeof why->text, "expert %u of layer %u", h->expert, h->layer);
    return false;
  }
  return true;
}

qmoe_status StoreFile::read_record(uint32_t layer, uint32_t expert, bool verify, unsigned char* dst,
                                   const char* function) const {
  const uint64_t bytes = header_.expert_bytes;
  const uint64_t offset = record_offset(layer, expert);
  const ssize_t got = pread_full(fd_, dst, bytes, offset);
  if (got < 0) {
    return fail(QMOE_STATUS_IO_ERROR, function, "cannot read layer %u expert %u of '%s': %s", layer,
                expert, path_.c_str(), std::strerror(errno));
  }
  if (static_cast<uint64_t>(got) < bytes) {
    return fail(QMOE_STATUS_IO_ERROR, function,
                "'%s' ended inside layer %u expert %u (the file shrank after open)", path_.c_str(),
                layer, expert);
  }
  RecordHeader h;
  RecordMismatch why;
  if (!record_matches(dst, layer, expert, &h, &why)) {
    return fail(QMOE_STATUS_CORRUPT_DATA, function,
                "'%s': the record of layer %u expert %u holds %s", path_.c_str(), layer, expert,
                why.text);
  }
  if (verify) {
    const uint32_t computed = crc32c(dst + 16, bytes - 16);
    if (computed != h.crc) {
      return fail(QMOE_STATUS_CORRUPT_DATA, function,
                  "'%s': layer %u expert %u's CRC-32C is 0x%08x, its bytes give 0x%08x",
                  path_.c_str(), layer, expert, h.crc, computed);
    }
  }
  return QMOE_STATUS_OK;
}

void StoreFile::prefetch_record(uint32_t layer, uint32_t expert) const {
  const PageRange r = page_range(record_offset(layer, expert), header_.expert_bytes);
  // Advice: the kernel starts reading and returns; failing advice changes nothing.
  (void)::madvise(const_cast<unsigned char*>(mapping_.get()) + r.first, r.end - r.first,
                  MADV_WILLNEED);
}

qmoe_status StoreFile::record_in_memory(uint32_t layer, uint32_t expert, bool* in_memory,
                                        const char* function) const {
  const PageRange r = page_range(record_offset(layer, expert), header_.expert_bytes);
  const uint64_t page = page_bytes();
  unsigned char vec[256];
  bool all = true;
  for (uint64_t at = r.first; at < r.end && all; at += sizeof vec * page) {
    const uint64_t pages = std::min<uint64_t>((r.end - at) / page, sizeof vec);
    if (::mincore(const_cast<unsigned char*>(mapping_.get()) + at, pages * page, vec) != 0) {
      return fail(QMOE_STATUS_IO_ERROR, function, "mincore on layer %u expert %u: %s", layer,
                  expert, std::strerror(errno));
    }
    for (uint64_t p = 0; p < pages; ++p) all = all && (vec[p] & 1u) != 0;
  }
  *in_memory = all;
  return QMOE_STATUS_OK;
}

}  // namespace qmoe
