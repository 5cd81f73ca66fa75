// qmoe: the libqmoe command-line tool.
#include <cstdio>
#include <cstring>
#include <new>

#include "commands.h"
#include "qmoe/qmoe.h"

namespace {

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: qmoe <command> [options]\n"
               "\n"
               "commands:\n"
               "  info [--bandwidth]   host CPU, tier chosen, caches, kernel table\n"
               "  run [options]        MoE decode with a synthetic model of a known MoE's\n"
               "                       layer shape (Qwen3-30B-A3B by default; --model)\n"
               "                       (qmoe run --help for its options)\n"
               "  cache [options]      replay a routing trace through the expert cache\n"
               "                       policies (static, LRU, LFU, LFRU) and compare hit\n"
               "                       rates and copies (qmoe cache --help for its options)\n"
               "  store FILE [--verify] what an expert store file holds; --verify checks\n"
               "                       every record's CRC-32C\n"
               "  version              library version\n");
}

int dispatch(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const char* command = argv[1];
  if (std::strcmp(command, "info") == 0) return run_info_command(argc - 2, argv + 2);
  if (std::strcmp(command, "run") == 0) return run_run_command(argc - 2, argv + 2);
  if (std::strcmp(command, "cache") == 0) return run_cache_command(argc - 2, argv + 2);
  if (std::strcmp(command, "store") == 0) return run_store_command(argc - 2, argv + 2);
  if (std::strcmp(command, "version") == 0) {
    if (argc == 3 && (std::strcmp(argv[2], "--help") == 0 || std::strcmp(argv[2], "-h") == 0)) {
      std::printf("usage: qmoe version\n");
      return 0;
    }
    if (argc > 2) {
      std::fprintf(stderr, "qmoe version: takes no options ('%s')\n", argv[2]);
      return 2;
    }
    std::printf("qmoe %s (library %s)\n", QMOE_VERSION_STRING, qmoe_version_string());
    return 0;
  }
  if (std::strcmp(command, "--help") == 0 || std::strcmp(command, "-h") == 0 ||
      std::strcmp(command, "help") == 0) {
    print_usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "qmoe: unknown command '%s'\n\n", command);
  print_usage(stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // The commands size their buffers from the options and check them against usable memory;
  // an allocation that fails all the same is reported, not an abort.
  try {
    const int status = dispatch(argc, argv);
    // A report that could not be written (a full disk, a closed pipe: `--json > /dev/full`)
    // is a failure, not an exit 0 with the output lost.
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      std::fprintf(stderr, "qmoe: writing to standard output failed\n");
      return status == 0 ? 1 : status;
    }
    return status;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "qmoe: out of memory (an allocation failed); try fewer --layers, or a "
                 "smaller --batch (run) or --steps and --tokens (cache)\n");
    return 1;
  }
}
