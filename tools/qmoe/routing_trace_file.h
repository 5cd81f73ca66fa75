// Routing trace files (`qmoe cache --trace`, `--write-trace`; docs/formats.md, "Routing
// traces"): the expert ids a model's router chose, step by step, as a runtime records them, so
// that `qmoe cache` replays real routing instead of a synthetic draw. Little-endian: a 32-byte
// header, then steps x layers x tokens x top_k int32 ids, step-major, each in [-1, experts).
//
// Reading fills the RoutingTrace that draw_routing fills (run_routing.h), so the replay is the
// same code for both; its weights stay empty, since a file stores no weights (the cache needs
// the ids only). A hostile file costs no more memory than its own size: the header is checked
// against the file's size before anything is allocated, and every id read is checked.
#ifndef QMOE_TOOLS_QMOE_ROUTING_TRACE_FILE_H_
#define QMOE_TOOLS_QMOE_ROUTING_TRACE_FILE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "run_routing.h"

constexpr uint32_t kRoutingTraceVersion = 1;
constexpr uint64_t kRoutingTraceHeaderBytes = 32;

// The header's fields after the magic and the version.
struct RoutingTraceHeader {
  uint32_t layers = 0, experts = 0, top_k = 0;
  uint32_t tokens = 0;  // per step: the most a step routes; fewer are padded with id -1
  uint64_t steps = 0;
};

// The file size the header implies, header included, into *bytes; false when it overflows
// 64 bits.
bool routing_trace_file_bytes(const RoutingTraceHeader& header, uint64_t* bytes);

struct TraceFileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

// Reads a trace file in two stages, so that a caller can weigh the header (shape, steps, the
// memory the ids will take) before any id is read or allocated.
class RoutingTraceReader {
 public:
  // Opens `path` and checks its header (magic, version, no zero count, top_k <= experts, a size
  // that fits 64 bits) and that the file is exactly as long as the header says. False, with a
  // one-line message naming the file, the field and its value in *error, when not.
  bool open(const std::string& path, std::string* error);

  // After a successful open.
  const RoutingTraceHeader& header() const { return header_; }

  // The first `steps` steps (at most header().steps) into *trace: ids, per_layer and per_step
  // set, weights empty. Checks each id read (the steps after the first `steps` are not read).
  // False, *trace emptied, with the message in *error, for an id outside [-1, experts) (its
  // step, layer, token, slot and byte offset named) or a failed read.
  bool read_steps(uint64_t steps, RoutingTrace* trace, std::string* error);

 private:
  // open()'s checks of the open file: what is wrong, as the rest of a message after the path,
  // or "" (header_ then holds the header's fields).
  std::string check_header();

  std::string path_;
  std::unique_ptr<std::FILE, TraceFileCloser> file_;
  RoutingTraceHeader header_;
};

// Writes `trace` (ids only) to `path` as a trace file of `header`'s shape. The trace must be
// that shape: per_layer = tokens * top_k, per_step = layers * per_layer, header.steps steps of
// ids, each in [-1, experts). False, with a message in *error, when it is not (nothing is
// written) or the file cannot be written (what was written is refused by the reader: its size is
// not the header's).
bool write_routing_trace(const std::string& path, const RoutingTraceHeader& header,
                         const RoutingTrace& trace, std::string* error);

#endif  // QMOE_TOOLS_QMOE_ROUTING_TRACE_FILE_H_
