#include "weight_formats.h"

#include <cstring>

namespace {

// INT4 and INT3 take FP16 scales per 32 (what ONNX Runtime's QMoE and ggml's Q4_0 use); MXFP4
// and NVFP4 take the block size and scale type their format fixes (docs/formats.md). NVFP4's
// global scale, 1.375 * 2^-14, brings its weights to about the spread of the others (the
// generator's scale tables, run_model.cc).
constexpr RunFormat kFormats[] = {
    {QMOE_WEIGHT_FORMAT_INT4, "int4", "INT4", 32, QMOE_DTYPE_F16, 2, "f16", "FP16", 0.0f},
    {QMOE_WEIGHT_FORMAT_INT3, "int3", "INT3", 32, QMOE_DTYPE_F16, 2, "f16", "FP16", 0.0f},
    {QMOE_WEIGHT_FORMAT_MXFP4, "mxfp4", "MXFP4", 32, QMOE_DTYPE_E8M0, 1, "e8m0", "E8M0", 0.0f},
    {QMOE_WEIGHT_FORMAT_NVFP4, "nvfp4", "NVFP4", 16, QMOE_DTYPE_F8_E4M3, 1, "e4m3", "FP8 E4M3",
     0x1.6p-14f},
};

}  // namespace

const RunFormat* run_formats(size_t* count) {
  *count = sizeof kFormats / sizeof kFormats[0];
  return kFormats;
}

const RunFormat* find_run_format_of(qmoe_weight_format format) {
  for (const RunFormat& row : kFormats) {
    if (row.format == format) return &row;
  }
  return nullptr;
}

const RunFormat& run_format(qmoe_weight_format format) {
  const RunFormat* row = find_run_format_of(format);
  return row != nullptr ? *row : kFormats[0];
}

const RunFormat* find_run_format(const char* name) {
  if (name == nullptr) return nullptr;
  for (const RunFormat& row : kFormats) {
    if (std::strcmp(row.name, name) == 0) return &row;
  }
  return nullptr;
}

std::string run_format_names(const char* separator) {
  std::string out;
  for (const RunFormat& row : kFormats) {
    if (!out.empty()) out += separator;
    out += row.name;
  }
  return out;
}
