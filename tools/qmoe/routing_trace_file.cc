#include "routing_trace_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstring>

namespace {

// "QMRT": the bytes 51 4D 52 54 at offset 0.
constexpr unsigned char kMagic[4] = {'Q', 'M', 'R', 'T'};
constexpr size_t kIdBytes = 4;
// Ids move between the file and the trace through a buffer of this many, so that neither
// reading nor writing depends on the host's byte order or holds a second copy of the trace.
constexpr size_t kIdsPerChunk = 16384;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
// Sets *error to the one-line message every failure gives: `path`, then the printf-formatted
// rest. Returns false, for the caller to return.
bool fail(std::string* error, const std::string& path, const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  *error = path + ": " + text;
  return false;
}

void put_u32(uint32_t value, unsigned char* at) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<unsigned char>(value >> (8 * i));
}

void put_u64(uint64_t value, unsigned char* at) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<unsigned char>(value >> (8 * i));
}

uint32_t get_u32(const unsigned char* at) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= uint32_t{at[i]} << (8 * i);
  return value;
}

uint64_t get_u64(const unsigned char* at) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= uint64_t{at[i]} << (8 * i);
  return value;
}

// Two's complement both ways, whatever the host's conversion rules.
int32_t id_of(uint32_t bits) {
  int32_t id = 0;
  std::memcpy(&id, &bits, sizeof id);
  return id;
}

uint32_t bits_of(int32_t id) {
  uint32_t bits = 0;
  std::memcpy(&bits, &id, sizeof bits);
  return bits;
}

bool multiply(uint64_t a, uint64_t b, uint64_t* product) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  *product = a * b;
  return true;
}

// One step's ids in bytes, into *bytes; false when it overflows 64 bits. Checked apart from the
// steps, so that a header of zero steps cannot hide a step too large to index.
bool step_bytes(const RoutingTraceHeader& header, uint64_t* bytes) {
  uint64_t size = kIdBytes;
  if (!multiply(size, header.layers, &size) || !multiply(size, header.tokens, &size) ||
      !multiply(size, header.top_k, &size)) {
    return false;
  }
  *bytes = size;
  return true;
}

// What is wrong with the header's fields, as the rest of a message after the path, or "" when
// nothing is; *file_bytes gets the file size it implies.
std::string header_problem(const RoutingTraceHeader& header, uint64_t* file_bytes) {
  const struct {
    const char* name;
    uint32_t value;
  } counts[] = {{"layers", header.layers},
                {"experts", header.experts},
                {"top_k", header.top_k},
                {"tokens", header.tokens}};
  char text[400];
  for (const auto& count : counts) {
    if (count.value == 0) {
      std::snprintf(text, sizeof text, "%s is 0; it must be at least 1", count.name);
      return text;
    }
  }
  if (header.top_k > header.experts) {
    std::snprintf(text, sizeof text, "top_k is %u, above experts (%u)", header.top_k,
                  header.experts);
    return text;
  }
  if (!routing_trace_file_bytes(header, file_bytes)) {
    std::snprintf(text, sizeof text,
                  "the size its header implies (32 + steps %" PRIu64
                  " x layers %u x tokens %u x top_k %u x 4 bytes) overflows 64 bits",
                  header.steps, header.layers, header.tokens, header.top_k);
    return text;
  }
  return "";
}

// Where id `index` of a trace of `header`'s shape sits, for a message.
std::string id_position(const RoutingTraceHeader& header, uint64_t index) {
  const uint64_t per_layer = uint64_t{header.tokens} * header.top_k;
  const uint64_t per_step = per_layer * header.layers;
  char text[200];
  std::snprintf(text, sizeof text,
                "step %" PRIu64 ", layer %" PRIu64 ", token %" PRIu64 ", slot %" PRIu64
                " (byte %" PRIu64 ")",
                index / per_step, index % per_step / per_layer, index % per_layer / header.top_k,
                index % header.top_k, kRoutingTraceHeaderBytes + kIdBytes * index);
  return text;
}

bool id_in_range(int32_t id, uint32_t experts) {
  return id >= -1 && (id < 0 || static_cast<uint32_t>(id) < experts);
}

// Id `index`'s complaint, as the rest of a message after the path.
std::string bad_id(const RoutingTraceHeader& header, uint64_t index, int32_t id) {
  char text[300];
  std::snprintf(text, sizeof text, "expert id %" PRId32 " at %s is outside [-1, %u)", id,
                id_position(header, index).c_str(), header.experts);
  return text;
}

}  // namespace

bool routing_trace_file_bytes(const RoutingTraceHeader& header, uint64_t* bytes) {
  uint64_t ids_bytes = 0;
  if (!step_bytes(header, &ids_bytes) || !multiply(ids_bytes, header.steps, &ids_bytes) ||
      ids_bytes > UINT64_MAX - kRoutingTraceHeaderBytes) {
    return false;
  }
  *bytes = kRoutingTraceHeaderBytes + ids_bytes;
  return true;
}

bool RoutingTraceReader::open(const std::string& path, std::string* error) {
  path_ = path;
  header_ = RoutingTraceHeader{};
  file_.reset(std::fopen(path.c_str(), "rb"));
  const std::string problem =
      file_ ? check_header() : std::string("cannot open it: ") + std::strerror(errno);
  if (problem.empty()) return true;
  header_ = RoutingTraceHeader{};
  file_.reset();
  return fail(error, path, "%s", problem.c_str());
}

std::string RoutingTraceReader::check_header() {
  // The size comes from the open file itself, so that it is the size of what is read.
  struct stat status;
  if (fstat(fileno(file_.get()), &status) != 0) {
    return std::string("cannot read its size: ") + std::strerror(errno);
  }
  if (!S_ISREG(status.st_mode)) {
    return "not a regular file (the header's counts are checked against the file's size)";
  }
  const uint64_t size = static_cast<uint64_t>(status.st_size);
  char text[400];
  if (size < kRoutingTraceHeaderBytes) {
    std::snprintf(text, sizeof text,
                  "file size is %" PRIu64 " bytes, shorter than the %" PRIu64 "-byte header", size,
                  kRoutingTraceHeaderBytes);
    return text;
  }
  unsigned char bytes[kRoutingTraceHeaderBytes];
  if (std::fread(bytes, 1, sizeof bytes, file_.get()) != sizeof bytes) {
    return std::string("reading its header failed: ") +
           (std::ferror(file_.get()) ? std::strerror(errno) : "the file ended");
  }
  if (std::memcmp(bytes, kMagic, sizeof kMagic) != 0) {
    std::snprintf(text, sizeof text,
                  "magic is %02X %02X %02X %02X, not 51 4D 52 54 (\"QMRT\"): not a qmoe routing "
                  "trace",
                  bytes[0], bytes[1], bytes[2], bytes[3]);
    return text;
  }
  if (const uint32_t version = get_u32(bytes + 4); version != kRoutingTraceVersion) {
    std::snprintf(text, sizeof text, "version is %u; this qmoe reads version %u", version,
                  kRoutingTraceVersion);
    return text;
  }
  header_.layers = get_u32(bytes + 8);
  header_.experts = get_u32(bytes + 12);
  header_.top_k = get_u32(bytes + 16);
  header_.tokens = get_u32(bytes + 20);
  header_.steps = get_u64(bytes + 24);
  uint64_t expected = 0;
  if (std::string problem = header_problem(header_, &expected); !problem.empty()) return problem;
  if (size != expected) {
    std::snprintf(text, sizeof text,
                  "file size is %" PRIu64 " bytes, not the %" PRIu64
                  " its header implies (32 + steps %" PRIu64
                  " x layers %u x tokens %u x top_k %u "
                  "x 4)",
                  size, expected, header_.steps, header_.layers, header_.tokens, header_.top_k);
    return text;
  }
  return "";
}

bool RoutingTraceReader::read_steps(uint64_t steps, RoutingTrace* trace, std::string* error) {
  *trace = RoutingTrace{};
  if (!file_) {
    return fail(error, path_, "no trace file is open");
  }
  if (steps > header_.steps) {
    return fail(error, path_, "has %" PRIu64 " steps, fewer than the %" PRIu64 " asked for",
                header_.steps, steps);
  }
  // open() checked that the whole file's size fits 64 bits, and each step's alone, so these
  // products do not overflow; size_t is checked for hosts where it is narrower.
  const uint64_t per_layer = uint64_t{header_.tokens} * header_.top_k;
  const uint64_t per_step = per_layer * header_.layers;
  const uint64_t count = per_step * steps;
  if (count > SIZE_MAX / kIdBytes) {
    return fail(error, path_, "its %" PRIu64 " ids do not fit this host's address space", count);
  }
  if (std::fseek(file_.get(), static_cast<long>(kRoutingTraceHeaderBytes), SEEK_SET) != 0) {
    return fail(error, path_, "cannot seek past the header: %s", std::strerror(errno));
  }
  RoutingTrace read;
  read.per_layer = static_cast<size_t>(per_layer);
  read.per_step = static_cast<size_t>(per_step);
  read.ids.resize(static_cast<size_t>(count));
  unsigned char chunk[kIdsPerChunk * kIdBytes];
  for (uint64_t done = 0; done < count;) {
    const size_t ids = static_cast<size_t>(std::min<uint64_t>(kIdsPerChunk, count - done));
    if (std::fread(chunk, kIdBytes, ids, file_.get()) != ids) {
      const uint64_t at = kRoutingTraceHeaderBytes + kIdBytes * done;
      if (std::ferror(file_.get())) {
        return fail(error, path_, "reading the ids from byte %" PRIu64 " failed: %s", at,
                    std::strerror(errno));
      }
      return fail(error, path_, "ended before byte %" PRIu64 " (it shrank after opening)",
                  at + kIdBytes * ids);
    }
    for (size_t i = 0; i < ids; ++i) {
      const int32_t id = id_of(get_u32(chunk + kIdBytes * i));
      if (!id_in_range(id, header_.experts)) {
        return fail(error, path_, "%s", bad_id(header_, done + i, id).c_str());
      }
      read.ids[static_cast<size_t>(done) + i] = id;
    }
    done += ids;
  }
  *trace = std::move(read);
  return true;
}

bool write_routing_trace(const std::string& path, const RoutingTraceHeader& header,
                         const RoutingTrace& trace, std::string* error) {
  uint64_t file_bytes = 0;
  if (const std::string problem = header_problem(header, &file_bytes); !problem.empty()) {
    return fail(error, path, "not written: %s", problem.c_str());
  }
  const uint64_t per_layer = uint64_t{header.tokens} * header.top_k;
  const uint64_t per_step = per_layer * header.layers;
  if (trace.per_layer != per_layer || trace.per_step != per_step ||
      trace.ids.size() != per_step * header.steps) {
    return fail(error, path,
                "not written: the trace (%zu ids, %zu a layer, %zu a step) is not %" PRIu64
                " steps of %u layers x %u tokens x top_k %u",
                trace.ids.size(), trace.per_layer, trace.per_step, header.steps, header.layers,
                header.tokens, header.top_k);
  }
  // A file the reader would refuse is not written at all.
  for (size_t i = 0; i < trace.ids.size(); ++i) {
    if (!id_in_range(trace.ids[i], header.experts)) {
      return fail(error, path, "not written: %s", bad_id(header, i, trace.ids[i]).c_str());
    }
  }
  std::unique_ptr<std::FILE, TraceFileCloser> file(std::fopen(path.c_str(), "wb"));
  if (!file) {
    return fail(error, path, "cannot create it: %s", std::strerror(errno));
  }
  unsigned char head[kRoutingTraceHeaderBytes];
  std::memcpy(head, kMagic, sizeof kMagic);
  put_u32(kRoutingTraceVersion, head + 4);
  put_u32(header.layers, head + 8);
  put_u32(header.experts, head + 12);
  put_u32(header.top_k, head + 16);
  put_u32(header.tokens, head + 20);
  put_u64(header.steps, head + 24);
  bool written = std::fwrite(head, 1, sizeof head, file.get()) == sizeof head;
  unsigned char chunk[kIdsPerChunk * kIdBytes];
  for (size_t done = 0; written && done < trace.ids.size();) {
    const size_t ids = std::min(kIdsPerChunk, trace.ids.size() - done);
    for (size_t i = 0; i < ids; ++i) put_u32(bits_of(trace.ids[done + i]), chunk + kIdBytes * i);
    written = std::fwrite(chunk, kIdBytes, ids, file.get()) == ids;
    done += ids;
  }
  // A full disk often shows only when the buffer is flushed, at the close.
  const int write_errno = errno;
  const bool closed = std::fclose(file.release()) == 0;
  if (!written || !closed) {
    return fail(error, path, "writing %" PRIu64 " bytes failed: %s", file_bytes,
                std::strerror(written ? errno : write_errno));
  }
  return true;
}
