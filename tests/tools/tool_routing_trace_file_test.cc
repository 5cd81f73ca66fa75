// `qmoe cache --trace`'s file format (tools/qmoe/routing_trace_file.h, docs/formats.md
// "Routing traces"): the documented example byte for byte, round trips, and every refusal, each
// with its one-line message; hostile headers (every truncation, 2^40 steps, sizes that overflow)
// refused before anything is allocated.
#include "tools/qmoe/routing_trace_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// docs/formats.md's example: 2 layers of 4 experts, top-2, at most 2 tokens a step, 2 steps;
// step 1 routes one token, so its token 1 is padding in both layers.
const std::vector<uint8_t> kDocumentedExample = {
    0x51, 0x4D, 0x52, 0x54, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
    0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
};

RoutingTraceHeader documented_header() {
  RoutingTraceHeader header;
  header.layers = 2;
  header.experts = 4;
  header.top_k = 2;
  header.tokens = 2;
  header.steps = 2;
  return header;
}

RoutingTrace documented_trace() {
  RoutingTrace trace;
  trace.per_layer = 4;
  trace.per_step = 8;
  trace.ids = {3, 1, 0,  3,  2, 0, 1,  2,    // step 0: layer 0, then layer 1
               1, 3, -1, -1, 0, 2, -1, -1};  // step 1: token 1 is padding
  return trace;
}

// Little-endian bytes of a header with these fields, for hand-built files.
std::vector<uint8_t> header_bytes(const char magic[4], uint32_t version,
                                  const RoutingTraceHeader& h) {
  std::vector<uint8_t> bytes(magic, magic + 4);
  for (uint32_t field : {version, h.layers, h.experts, h.top_k, h.tokens}) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(field >> (8 * i)));
  }
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(h.steps >> (8 * i)));
  return bytes;
}

class RoutingTraceFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "qmoe_trace_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  std::string put(const std::string& name, const std::vector<uint8_t>& bytes) const {
    const std::string file = path(name);
    std::ofstream(file, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    return file;
  }

  static std::vector<uint8_t> contents(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in),
                                std::istreambuf_iterator<char>());
  }

  // The message open() refuses `bytes` with ("" when it takes them).
  std::string open_error(const std::vector<uint8_t>& bytes, const std::string& name = "bad.qmrt") {
    RoutingTraceReader reader;
    std::string error;
    if (reader.open(put(name, bytes), &error)) return "";
    EXPECT_NE(error.find(path(name) + ": "), std::string::npos) << error;  // names the file
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;               // one line
    return error;
  }

  // The message read_steps refuses all of `bytes`' steps with ("" when it takes them).
  std::string read_error(const std::vector<uint8_t>& bytes) {
    RoutingTraceReader reader;
    std::string error;
    const std::string file = put("ids.qmrt", bytes);
    EXPECT_TRUE(reader.open(file, &error)) << error;
    RoutingTrace trace;
    if (reader.read_steps(reader.header().steps, &trace, &error)) return "";
    EXPECT_TRUE(trace.ids.empty());
    EXPECT_NE(error.find(file + ": "), std::string::npos) << error;
    return error;
  }

  std::string dir_;
};

TEST_F(RoutingTraceFile, WritesTheDocumentedExampleByteForByte) {
  const std::string file = path("example.qmrt");
  std::string error;
  ASSERT_TRUE(write_routing_trace(file, documented_header(), documented_trace(), &error)) << error;
  EXPECT_EQ(contents(file), kDocumentedExample);
}

TEST_F(RoutingTraceFile, ReadsTheDocumentedExample) {
  RoutingTraceReader reader;
  std::string error;
  ASSERT_TRUE(reader.open(put("example.qmrt", kDocumentedExample), &error)) << error;
  const RoutingTraceHeader& h = reader.header();
  EXPECT_EQ(h.layers, 2u);
  EXPECT_EQ(h.experts, 4u);
  EXPECT_EQ(h.top_k, 2u);
  EXPECT_EQ(h.tokens, 2u);
  EXPECT_EQ(h.steps, 2u);
  RoutingTrace trace;
  ASSERT_TRUE(reader.read_steps(2, &trace, &error)) << error;
  EXPECT_EQ(trace.ids, documented_trace().ids);
  EXPECT_EQ(trace.per_layer, 4u);
  EXPECT_EQ(trace.per_step, 8u);
  EXPECT_TRUE(trace.weights.empty());  // a file stores none
}

TEST_F(RoutingTraceFile, RoundTripsEveryIdAndTheFirstSteps) {
  RoutingTraceHeader header;
  header.layers = 3;
  header.experts = 70000;  // ids above 16 bits
  header.top_k = 5;
  header.tokens = 7;
  header.steps = 40;
  RoutingTrace trace;
  trace.per_layer = size_t{header.tokens} * header.top_k;
  trace.per_step = trace.per_layer * header.layers;
  trace.ids.resize(trace.per_step * header.steps);
  for (size_t i = 0; i < trace.ids.size(); ++i) {
    trace.ids[i] = i % 11 == 0 ? -1 : static_cast<int32_t>((i * 2654435761u) % header.experts);
  }
  trace.ids.back() = static_cast<int32_t>(header.experts - 1);
  const std::string file = path("round.qmrt");
  std::string error;
  ASSERT_TRUE(write_routing_trace(file, header, trace, &error)) << error;
  EXPECT_EQ(fs::file_size(file), 32 + 4 * trace.ids.size());

  RoutingTraceReader reader;
  ASSERT_TRUE(reader.open(file, &error)) << error;
  EXPECT_EQ(reader.header().steps, header.steps);
  RoutingTrace read;
  ASSERT_TRUE(reader.read_steps(header.steps, &read, &error)) << error;
  EXPECT_EQ(read.ids, trace.ids);
  // The first steps alone, from the same reader: a prefix of the ids.
  ASSERT_TRUE(reader.read_steps(3, &read, &error)) << error;
  EXPECT_EQ(read.ids, std::vector<int32_t>(trace.ids.begin(),
                                           trace.ids.begin() + 3 * std::ptrdiff_t(trace.per_step)));
  ASSERT_TRUE(reader.read_steps(0, &read, &error)) << error;
  EXPECT_TRUE(read.ids.empty());
  EXPECT_FALSE(reader.read_steps(41, &read, &error));
  EXPECT_NE(error.find("has 40 steps, fewer than the 41 asked for"), std::string::npos) << error;
}

TEST_F(RoutingTraceFile, ReadsMoreIdsThanOneChunk) {
  RoutingTraceHeader header;
  header.layers = 1;
  header.experts = 3;
  header.top_k = 1;
  header.tokens = 1;
  header.steps = 40000;  // the reader moves 16384 ids at a time
  RoutingTrace trace;
  trace.per_layer = 1;
  trace.per_step = 1;
  for (uint64_t s = 0; s < header.steps; ++s) trace.ids.push_back(static_cast<int32_t>(s % 4) - 1);
  const std::string file = path("long.qmrt");
  std::string error;
  ASSERT_TRUE(write_routing_trace(file, header, trace, &error)) << error;
  RoutingTraceReader reader;
  RoutingTrace read;
  ASSERT_TRUE(reader.open(file, &error)) << error;
  ASSERT_TRUE(reader.read_steps(header.steps, &read, &error)) << error;
  EXPECT_EQ(read.ids, trace.ids);
}

TEST_F(RoutingTraceFile, RefusesEveryTruncationAndAnExtraByte) {
  for (size_t length = 0; length < kDocumentedExample.size(); ++length) {
    SCOPED_TRACE(length);
    const std::string error = open_error(
        std::vector<uint8_t>(kDocumentedExample.begin(), kDocumentedExample.begin() + length));
    const std::string expected =
        length < 32
            ? "file size is " + std::to_string(length) + " bytes, shorter than the 32-byte header"
            : "file size is " + std::to_string(length) +
                  " bytes, not the 96 its header implies (32 + steps 2 x layers 2 x "
                  "tokens 2 x top_k 2 x 4)";
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  }
  std::vector<uint8_t> longer = kDocumentedExample;
  longer.push_back(0);
  EXPECT_NE(open_error(longer).find("file size is 97 bytes, not the 96"), std::string::npos);
}

TEST_F(RoutingTraceFile, RefusesAHugeStepCountBeforeAllocating) {
  RoutingTraceHeader header = documented_header();
  header.steps = uint64_t{1} << 40;  // 2^40 steps of 8 ids: 32 TiB the file does not have
  std::vector<uint8_t> bytes = header_bytes("QMRT", 1, header);
  bytes.insert(bytes.end(), kDocumentedExample.begin() + 32, kDocumentedExample.end());
  RoutingTraceReader reader;
  std::string error;
  EXPECT_FALSE(reader.open(put("huge.qmrt", bytes), &error));
  EXPECT_NE(error.find("file size is 96 bytes, not the 35184372088864 its header implies (32 + "
                       "steps 1099511627776 x layers 2 x tokens 2 x top_k 2 x 4)"),
            std::string::npos)
      << error;
  // Nothing was read, so nothing can be: the refused reader allocates no ids.
  RoutingTrace trace;
  EXPECT_FALSE(reader.read_steps(uint64_t{1} << 40, &trace, &error));
  EXPECT_NE(error.find("no trace file is open"), std::string::npos) << error;
  EXPECT_EQ(trace.ids.capacity(), 0u);
}

TEST_F(RoutingTraceFile, RefusesSizesThatOverflow) {
  RoutingTraceHeader header;
  header.layers = UINT32_MAX;
  header.experts = UINT32_MAX;
  header.top_k = UINT32_MAX;
  header.tokens = UINT32_MAX;
  header.steps = 0;  // a zero step count does not hide a step too large to index
  uint64_t bytes = 0;
  EXPECT_FALSE(routing_trace_file_bytes(header, &bytes));
  EXPECT_NE(open_error(header_bytes("QMRT", 1, header))
                .find("the size its header implies (32 + steps 0 x layers 4294967295 x tokens "
                      "4294967295 x top_k 4294967295 x 4 bytes) overflows 64 bits"),
            std::string::npos);
  header = documented_header();
  header.steps = UINT64_MAX / 32 + 1;  // x 32 bytes a step: 2^64 and more
  EXPECT_FALSE(routing_trace_file_bytes(header, &bytes));
  EXPECT_NE(open_error(header_bytes("QMRT", 1, header)).find("overflows 64 bits"),
            std::string::npos);
  header.steps = (UINT64_MAX - 32) / 32;  // the largest that fits, with the header
  ASSERT_TRUE(routing_trace_file_bytes(header, &bytes));
  EXPECT_EQ(bytes, 32 + header.steps * 32);
  ++header.steps;
  EXPECT_FALSE(routing_trace_file_bytes(header, &bytes));
}

TEST_F(RoutingTraceFile, RefusesABadHeaderNamingTheFieldAndItsValue) {
  std::vector<uint8_t> bytes = kDocumentedExample;
  bytes[3] = 'X';
  EXPECT_NE(open_error(bytes).find(
                "magic is 51 4D 52 58, not 51 4D 52 54 (\"QMRT\"): not a qmoe routing trace"),
            std::string::npos);
  bytes = kDocumentedExample;
  bytes[4] = 2;
  EXPECT_NE(open_error(bytes).find("version is 2; this qmoe reads version 1"), std::string::npos);
  bytes = kDocumentedExample;
  bytes[7] = 1;  // the high byte: little-endian, so 2^24 + 1
  EXPECT_NE(open_error(bytes).find("version is 16777217"), std::string::npos);

  const struct {
    const char* name;
    uint32_t RoutingTraceHeader::*field;
  } counts[] = {{"layers", &RoutingTraceHeader::layers},
                {"experts", &RoutingTraceHeader::experts},
                {"top_k", &RoutingTraceHeader::top_k},
                {"tokens", &RoutingTraceHeader::tokens}};
  for (const auto& count : counts) {
    RoutingTraceHeader header = documented_header();
    header.*count.field = 0;
    EXPECT_NE(open_error(header_bytes("QMRT", 1, header))
                  .find(std::string(count.name) + " is 0; it must be at least 1"),
              std::string::npos)
        << count.name;
  }
  RoutingTraceHeader header = documented_header();
  header.top_k = 5;
  EXPECT_NE(open_error(header_bytes("QMRT", 1, header)).find("top_k is 5, above experts (4)"),
            std::string::npos);
}

TEST_F(RoutingTraceFile, RefusesAnIdOutsideTheExpertsNamingWhereItIs) {
  std::vector<uint8_t> bytes = kDocumentedExample;
  bytes[32 + 4 * 13] = 4;  // step 1, layer 1, token 0, slot 1: E itself
  EXPECT_NE(read_error(bytes).find(
                "expert id 4 at step 1, layer 1, token 0, slot 1 (byte 84) is outside [-1, 4)"),
            std::string::npos);
  bytes = kDocumentedExample;
  bytes[32 + 4 * 2] = 0xFE;  // -2: below the padding's -1
  bytes[32 + 4 * 2 + 1] = bytes[32 + 4 * 2 + 2] = bytes[32 + 4 * 2 + 3] = 0xFF;
  EXPECT_NE(read_error(bytes).find(
                "expert id -2 at step 0, layer 0, token 1, slot 0 (byte 40) is outside [-1, 4)"),
            std::string::npos);
  bytes = kDocumentedExample;
  bytes[32 + 4 * 5 + 3] = 0x80;  // INT32_MIN
  EXPECT_NE(read_error(bytes).find("expert id -2147483648 at step 0, layer 1"), std::string::npos);
  EXPECT_EQ(read_error(kDocumentedExample), "");
}

TEST_F(RoutingTraceFile, ChecksTheIdsOfTheStepsItReads) {
  std::vector<uint8_t> bytes = kDocumentedExample;
  bytes[32 + 4 * 8] = 9;  // step 1's first id
  RoutingTraceReader reader;
  std::string error;
  ASSERT_TRUE(reader.open(put("late.qmrt", bytes), &error)) << error;
  RoutingTrace trace;
  ASSERT_TRUE(reader.read_steps(1, &trace, &error)) << error;  // step 0 alone is sound
  EXPECT_EQ(trace.ids.size(), 8u);
  EXPECT_FALSE(reader.read_steps(2, &trace, &error));
  EXPECT_NE(error.find("expert id 9 at step 1, layer 0, token 0, slot 0"), std::string::npos)
      << error;
}

TEST_F(RoutingTraceFile, RefusesWhatItCannotOpen) {
  RoutingTraceReader reader;
  std::string error;
  EXPECT_FALSE(reader.open(path("missing.qmrt"), &error));
  EXPECT_EQ(error, path("missing.qmrt") + ": cannot open it: No such file or directory");
  EXPECT_FALSE(reader.open(dir_, &error));
  EXPECT_EQ(error, dir_ +
                       ": not a regular file (the header's counts are checked against the "
                       "file's size)");
}

TEST_F(RoutingTraceFile, WritesNothingForATraceTheReaderWouldRefuse) {
  std::string error;
  RoutingTrace trace = documented_trace();
  trace.ids[5] = 4;
  EXPECT_FALSE(write_routing_trace(path("bad_id.qmrt"), documented_header(), trace, &error));
  EXPECT_NE(error.find(path("bad_id.qmrt") +
                       ": not written: expert id 4 at step 0, layer 1, token 0, slot 1"),
            std::string::npos)
      << error;
  EXPECT_FALSE(fs::exists(path("bad_id.qmrt")));

  RoutingTraceHeader header = documented_header();
  header.steps = 3;  // the trace has 2
  EXPECT_FALSE(write_routing_trace(path("short.qmrt"), header, documented_trace(), &error));
  EXPECT_NE(error.find("not written: the trace (16 ids, 4 a layer, 8 a step) is not 3 steps"),
            std::string::npos)
      << error;
  EXPECT_FALSE(fs::exists(path("short.qmrt")));

  header = documented_header();
  header.top_k = 0;
  EXPECT_FALSE(write_routing_trace(path("zero.qmrt"), header, documented_trace(), &error));
  EXPECT_NE(error.find("not written: top_k is 0"), std::string::npos) << error;
  EXPECT_FALSE(write_routing_trace(path("no_dir") + "/x.qmrt", documented_header(),
                                   documented_trace(), &error));
  EXPECT_NE(error.find(": cannot create it: No such file or directory"), std::string::npos)
      << error;
}

}  // namespace
