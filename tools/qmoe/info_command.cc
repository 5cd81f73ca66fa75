// `qmoe info`: what libqmoe found on this host and what it will run.
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <set>
#include <string>

#include "commands.h"
#include "qmoe/qmoe.h"
#include "qmoe/qmoe_cuda.h"
#include "qmoe/qmoe_experimental.h"
#include "tier_names.h"

namespace {

void print_size(const char* label, uint32_t bytes, uint32_t instances) {
  if (bytes == 0) {
    std::printf("  %-22s unknown\n", label);
  } else if (instances > 1) {
    std::printf("  %-22s %u KiB x %u\n", label, bytes / 1024, instances);
  } else {
    std::printf("  %-22s %u KiB\n", label, bytes / 1024);
  }
}

void print_usage(std::FILE* out) {
  std::fprintf(out, "usage: qmoe info [--isa %s] [--bandwidth]\n", tier_name_list("|").c_str());
}

}  // namespace

int run_info_command(int argc, char** argv) {
  bool measure_bandwidth = false;
  qmoe_isa requested = QMOE_ISA_DEFAULT;
  // As in `qmoe run`: an option given twice is an error rather than the last one winning.
  std::set<std::string> seen;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      print_usage(stdout);
      return 0;
    }
    if (std::strncmp(argv[i], "--", 2) == 0 && !seen.insert(argv[i]).second) {
      std::fprintf(stderr, "qmoe info: %s is given twice\n", argv[i]);
      return 2;
    }
    if (std::strcmp(argv[i], "--bandwidth") == 0) {
      measure_bandwidth = true;
    } else if (std::strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
      if (!parse_tier_name(argv[++i], &requested)) {
        std::fprintf(stderr, "qmoe info: --isa takes %s\n", tier_name_list(", ").c_str());
        return 2;
      }
    } else {
      print_usage(stderr);
      return 2;
    }
  }

  qmoe_host_info host;
  std::memset(&host, 0, sizeof(host));
  host.struct_size = sizeof(host);
  if (qmoe_get_host_info(&host) != QMOE_STATUS_OK) {
    std::fprintf(stderr, "qmoe info: %s\n", qmoe_last_error_message());
    return 1;
  }

  std::printf("libqmoe %s\n\n", qmoe_version_string());
  std::printf("CPU\n");
  std::printf("  %-22s %s\n", "brand", host.cpu_brand[0] ? host.cpu_brand : "(unknown)");
  std::printf("  %-22s", "features");
  for (uint32_t bit = 1; bit != 0; bit <<= 1) {
    const char* name = qmoe_cpu_feature_name(bit);
    if (name != nullptr && (host.cpu_features & bit)) std::printf(" %s", name);
  }
  std::printf("\n  %-22s %u logical, %u physical cores\n", "processors", host.logical_processors,
              host.physical_cores);
  print_size("L1d cache", host.l1d_cache_bytes, 0);
  print_size("L2 cache", host.l2_cache_bytes, 0);
  print_size("L3 cache", host.l3_cache_bytes, host.l3_cache_instances);

  std::printf("\nTiers\n");
  for (qmoe_isa isa : known_tiers()) {
    qmoe_context_options options;
    qmoe_context_options_init(&options);
    options.max_isa = isa;
    options.num_threads = 1;
    qmoe_context* probe = nullptr;
    if (qmoe_context_create(&options, &probe) == QMOE_STATUS_OK) {
      std::printf("  %-22s available\n", qmoe_isa_name(isa));
      qmoe_context_destroy(probe);
    } else {
      std::printf("  %-22s unavailable (%s)\n", qmoe_isa_name(isa), qmoe_last_error_message());
    }
  }
  std::printf("  %-22s %s\n", "best supported", qmoe_isa_name(host.best_supported_isa));
  std::printf("  %-22s %s%s%s%s\n", "process default", qmoe_isa_name(host.default_isa),
              host.default_isa_reason[0] ? " (" : "", host.default_isa_reason,
              host.default_isa_reason[0] ? ")" : "");
  std::printf("  %-22s %s\n", "QMOE_MAX_ISA", host.max_isa_env[0] ? host.max_isa_env : "(unset)");

  qmoe_context_options options;
  qmoe_context_options_init(&options);
  options.max_isa = requested;
  qmoe_context* context = nullptr;
  if (qmoe_context_create(&options, &context) != QMOE_STATUS_OK) {
    std::fprintf(stderr, "qmoe info: %s\n", qmoe_last_error_message());
    return 1;
  }
  qmoe_isa chosen = QMOE_ISA_SCALAR;
  uint32_t threads = 0;
  qmoe_context_get_isa(context, &chosen);
  qmoe_context_get_num_threads(context, &threads);
  std::printf("\nContext\n  %-22s %s\n  %-22s %u\n", "tier", qmoe_isa_name(chosen), "threads",
              threads);
  std::printf("\nKernel table\n");
  uint32_t kernels = 0;
  qmoe_context_get_kernel_count(context, &kernels);
  for (uint32_t i = 0; i < kernels; ++i) {
    qmoe_kernel_info info{};
    info.struct_size = sizeof info;
    if (qmoe_context_get_kernel_info(context, i, &info) != QMOE_STATUS_OK) continue;
    std::string entry = info.operation;
    if (info.format != 0) {
      entry += info.accuracy == QMOE_ACCURACY_FAST ? " fast" : " exact";
    }
    std::printf("  %-22s %s\n", entry.c_str(), info.name);
  }

  int devices = 0;
  const qmoe_status cuda = qmoe_cuda_get_device_count(&devices);
  std::printf("\nCUDA\n");
  if (cuda == QMOE_STATUS_OK) {
    std::printf("  %-22s %d\n", "devices", devices);
  } else {
    std::printf("  %-22s %s\n", "unavailable", qmoe_last_error_message());
  }

  if (measure_bandwidth) {
    // Several times the last-level cache, so the figure is DRAM's.
    const size_t llc =
        host.l3_cache_bytes
            ? size_t{host.l3_cache_bytes} * (host.l3_cache_instances ? host.l3_cache_instances : 1)
            : size_t{32} << 20;
    const size_t bytes = 8 * llc;
    double one = 0.0, all = 0.0;
    std::printf("\nRead bandwidth (%zu MiB buffer)\n", bytes >> 20);
    if (qmoe_measure_read_bandwidth(context, bytes, 5, 0, &one) == QMOE_STATUS_OK &&
        qmoe_measure_read_bandwidth(context, bytes, 5, 1, &all) == QMOE_STATUS_OK) {
      std::printf("  %-22s %.1f GB/s\n  %-22s %.1f GB/s (%u threads)\n", "1 thread", one * 1e-9,
                  "all threads", all * 1e-9, threads);
    } else {
      std::printf("  failed: %s\n", qmoe_last_error_message());
    }
  }
  qmoe_context_destroy(context);
  return 0;
}
