// qmoe: the libqmoe command-line tool.
#include <cstdio>
#include <cstring>

#include "commands.h"
#include "qmoe/qmoe.h"

namespace {

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: qmoe <command> [options]\n"
               "\n"
               "commands:\n"
               "  info [--bandwidth]   host CPU, tier chosen, caches, kernel table\n"
               "  run [options]        MoE decode with a synthetic Qwen3-30B-A3B-shaped model\n"
               "                       (qmoe run --help for its options)\n"
               "  version              library version\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const char* command = argv[1];
  if (std::strcmp(command, "info") == 0) return run_info_command(argc - 2, argv + 2);
  if (std::strcmp(command, "run") == 0) return run_run_command(argc - 2, argv + 2);
  if (std::strcmp(command, "version") == 0) {
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
