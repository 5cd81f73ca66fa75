#include "option_scanner.h"

#include <cstring>

bool OptionScanner::next(int* code) {
  i_ += flag_ ? 1 : 2;
  flag_ = false;
  if (i_ >= argc_) return false;
  if (std::strncmp(arg(), "--", 2) == 0 && !seen_.insert(arg()).second) {
    *code = bad("is given twice");
    return false;
  }
  return true;
}

bool OptionScanner::is(const char* name) const {
  return std::strcmp(arg(), name) == 0;
}

int OptionScanner::bad(const char* what) const {
  std::fprintf(stderr, "qmoe %s: %s %s\n\n", command_, arg(), what);
  usage_(stderr);
  return 2;
}

int OptionScanner::unknown() const {
  std::fprintf(stderr, "qmoe %s: unknown option '%s'\n\n", command_, arg());
  usage_(stderr);
  return 2;
}

int OptionScanner::refuse(const char* why) const {
  std::fprintf(stderr, "qmoe %s: %s\n\n", command_, why);
  usage_(stderr);
  return 2;
}
