// `qmoe run`'s report: the header as the run starts, the results in text when it ends, and
// the --json summary. The text goes to `out` (stdout, or stderr under --json); JSON to stdout.
#ifndef QMOE_TOOLS_QMOE_RUN_REPORT_H_
#define QMOE_TOOLS_QMOE_RUN_REPORT_H_

#include <cstdio>
#include <string>

#include "run_bandwidth.h"
#include "run_context.h"
#include "run_decode.h"
#include "run_model.h"
#include "run_options.h"

// What will run: library, host, tier, kernels, model and decode.
void print_run_header(std::FILE* out, const RunOptions& options, const RunContext& run,
                      const RunModel& model);

// The fresh buffer's read bandwidth, printed as soon as it is measured.
void print_buffer_bandwidth(std::FILE* out, const RunContext& run, const RunBandwidth& bandwidth);

// `text` as the inside of a JSON string: quotes and backslashes escaped, control bytes dropped.
std::string json_escape(const char* text);

// `value` in printf `format` for the JSON, or null when there is no such number (`known`
// false).
std::string json_number(bool known, const char* format, double value);

// The results in text, then in JSON under --json.
void print_run_report(std::FILE* out, const RunOptions& options, const RunContext& run,
                      const RunModel& model, const RunBandwidth& bandwidth,
                      const DecodeResult& decode, double total_s);

#endif  // QMOE_TOOLS_QMOE_RUN_REPORT_H_
