// `qmoe store FILE [--verify] [--json]`: what an expert store file (qmoe/qmoe_store.h) holds,
// and with --verify every record of every layer read and its CRC-32C checked, on every
// hardware thread: the check to run once after copying or downloading a model's store.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "option_scanner.h"
#include "parallel_items.h"
#include "qmoe/qmoe_store.h"
#include "run_clock.h"
#include "run_report.h"
#include "weight_formats.h"

namespace {

void print_store_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: qmoe store FILE [--verify] [--json]\n"
               "\n"
               "Describes an expert store file (written by qmoe run --write-store or\n"
               "qmoe_expert_store_write): its layers, experts, widths, formats and sizes.\n"
               "  --verify  read every expert's record and check its CRC-32C (exit 1, naming\n"
               "            the layer and expert, on the first damaged one)\n"
               "  --json    JSON summary on stdout\n");
}

struct FreeWeights {
  void operator()(void* p) const { qmoe_free_weight_memory(p); }
};

// Every record of every layer through qmoe_expert_store_read with verify, each thread reading
// whole layers into its own buffer (made at its first layer). Returns "" or the first failure's
// message.
std::string verify_store(const qmoe_expert_store* store, const qmoe_expert_store_info& info,
                         unsigned threads) {
  const size_t bytes = info.expert_bytes * info.num_experts;
  std::vector<std::unique_ptr<void, FreeWeights>> buffers(threads);
  std::vector<uint32_t> ids(info.num_experts);
  for (uint32_t e = 0; e < info.num_experts; ++e) ids[e] = e;
  return run_items_in_parallel(
      0, info.num_layers, threads,
      [&](uint32_t l, unsigned thread, std::string* why) {
        if (buffers[thread] == nullptr) {
          void* raw = nullptr;
          if (qmoe_alloc_weight_memory(bytes, &raw) != QMOE_STATUS_OK) {
            *why = qmoe_last_error_message();
            return false;
          }
          buffers[thread].reset(raw);
        }
        if (qmoe_expert_store_read(store, l, ids.data(), info.num_experts, 1, buffers[thread].get(),
                                   bytes) != QMOE_STATUS_OK) {
          *why = qmoe_last_error_message();
          return false;
        }
        return true;
      },
      nullptr);
}

const char* format_name(qmoe_weight_format format) {
  const RunFormat* row = find_run_format_of(format);
  return row != nullptr ? row->name : "unknown";
}

}  // namespace

int run_store_command(int argc, char** argv) {
  OptionScanner s("store", print_store_usage, argc, argv);
  const char* path = nullptr;
  bool verify = false, json = false;
  int code = 0;
  while (s.next(&code)) {
    if (s.is("--help") || s.is("-h")) {
      print_store_usage(stdout);
      return 0;
    }
    s.flag();
    if (s.is("--verify")) {
      verify = true;
    } else if (s.is("--json")) {
      json = true;
    } else if (s.arg()[0] != '-' && path == nullptr) {
      path = s.arg();
    } else {
      return s.unknown();
    }
  }
  if (code != 0) return code;
  if (path == nullptr) return s.refuse("needs the store's file name");

  qmoe_expert_store* raw = nullptr;
  if (qmoe_expert_store_open(path, &raw) != QMOE_STATUS_OK) {
    std::fprintf(stderr, "qmoe store: %s\n", qmoe_last_error_message());
    return 1;
  }
  std::unique_ptr<qmoe_expert_store, qmoe_status (*)(qmoe_expert_store*)> store(
      raw, qmoe_expert_store_close);
  qmoe_expert_store_info info{};
  info.struct_size = sizeof info;
  if (qmoe_expert_store_get_info(store.get(), &info) != QMOE_STATUS_OK) {
    std::fprintf(stderr, "qmoe store: %s\n", qmoe_last_error_message());
    return 1;
  }
  std::FILE* out = json ? stderr : stdout;
  std::fprintf(out,
               "%s: %u layers of %u experts, H %u, I %u, FC1 %s, FC2 %s, %zu bytes an expert, "
               "%.2f GB\n",
               path, info.num_layers, info.num_experts, info.hidden, info.intermediate,
               format_name(info.fc1_format), format_name(info.fc2_format), info.expert_bytes,
               static_cast<double>(info.file_bytes) * 1e-9);
  std::string failure;
  double seconds = 0.0;
  const unsigned threads =
      std::max(1u, std::min(std::thread::hardware_concurrency(), info.num_layers));
  if (verify) {
    const auto start = Clock::now();
    failure = verify_store(store.get(), info, threads);
    seconds = seconds_since(start);
    if (failure.empty()) {
      std::fprintf(
          out, "verified: %llu records, CRC-32C checked, %.2f s (%.2f GB/s on %u threads)\n",
          static_cast<unsigned long long>(info.num_layers) * info.num_experts, seconds,
          seconds > 0 ? static_cast<double>(info.file_bytes) / seconds * 1e-9 : 0.0, threads);
    } else {
      std::fprintf(stderr, "qmoe store: %s\n", failure.c_str());
    }
  }
  if (json) {
    std::printf(
        "{\"command\": \"store\", \"file\": \"%s\", \"layers\": %u, \"experts\": %u, \"hidden\": "
        "%u, \"intermediate\": %u, \"fc1_format\": \"%s\", \"fc2_format\": \"%s\", "
        "\"expert_bytes\": %zu, \"file_bytes\": %llu, \"verified\": %s, \"verify_s\": %.4f}\n",
        json_escape(path).c_str(), info.num_layers, info.num_experts, info.hidden,
        info.intermediate, format_name(info.fc1_format), format_name(info.fc2_format),
        info.expert_bytes, static_cast<unsigned long long>(info.file_bytes),
        !verify           ? "null"
        : failure.empty() ? "true"
                          : "false",
        seconds);
  }
  return failure.empty() ? 0 : 1;
}
