// The weight formats `qmoe run` can generate its synthetic model in, one row each: the name
// --format and the JSON use, and how the model stores that format (block size, scale type,
// global scale). The library names its tiers (qmoe_isa_name) but not its formats, so the names
// live here, in one table that parsing, the usage text and the report all read.
#ifndef QMOE_TOOLS_QMOE_WEIGHT_FORMATS_H_
#define QMOE_TOOLS_QMOE_WEIGHT_FORMATS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "qmoe/qmoe.h"

struct RunFormat {
  qmoe_weight_format format;
  const char* name;         // --format and the JSON: "int4"
  const char* title;        // the report: "INT4"
  uint32_t block_size;      // k per scale in the synthetic model
  qmoe_dtype scale_dtype;   // of its scale planes
  size_t scale_bytes;       // one scale element
  const char* scale_name;   // the JSON's scale_dtype: "f16", "e8m0", "e4m3"
  const char* scale_title;  // the report: "FP16"
  float global_scale;       // qmoe_quant_matrix::global_scale; 0 for none
};

// Every row, int4 first (the default).
const RunFormat* run_formats(size_t* count);

// The row of `format`; int4's for a value no row has.
const RunFormat& run_format(qmoe_weight_format format);

// The row named `name`; null for anything else (null included).
const RunFormat* find_run_format(const char* name);

// The row of `format`; null for a value no row has (a file's field, read as it is).
const RunFormat* find_run_format_of(qmoe_weight_format format);

// "int4|int3|mxfp4|nvfp4": every name, joined by `separator`.
std::string run_format_names(const char* separator);

#endif  // QMOE_TOOLS_QMOE_WEIGHT_FORMATS_H_
