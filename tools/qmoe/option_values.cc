#include "option_values.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

// strtoull's base 0 read "010" as 8 and " -1" as 2^64 - 1: the digits are checked first.
bool parse_u64(const char* text, uint64_t* value) {
  if (text == nullptr || *text == '\0') return false;
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9') return false;
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long long parsed = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *value = parsed;
  return true;
}

bool parse_u32(const char* text, uint32_t min, uint32_t max, uint32_t* value) {
  uint64_t parsed = 0;
  if (!parse_u64(text, &parsed) || parsed < min || parsed > max) return false;
  *value = static_cast<uint32_t>(parsed);
  return true;
}

// strtod alone would take signs, exponents, hex, "inf" and "nan".
bool parse_decimal(const char* text, double* value) {
  if (text == nullptr || *text == '\0') return false;
  int dots = 0, digits = 0;
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c == '.') {
      ++dots;
    } else if (*c >= '0' && *c <= '9') {
      ++digits;
    } else {
      return false;
    }
  }
  if (dots > 1 || digits == 0) return false;
  char* end = nullptr;
  const double parsed = std::strtod(text, &end);
  if (*end != '\0' || !std::isfinite(parsed)) return false;
  *value = parsed;
  return true;
}

bool parse_decimal_float(const char* text, float* value) {
  double parsed = 0.0;
  if (!parse_decimal(text, &parsed)) return false;
  const auto narrowed = static_cast<float>(parsed);
  if (!std::isfinite(narrowed)) return false;
  *value = narrowed;
  return true;
}

bool parse_fraction(const char* text, double* value) {
  double parsed = 0.0;
  if (!parse_decimal(text, &parsed) || parsed > 1.0) return false;
  *value = parsed;
  return true;
}

bool asks_for_help(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return true;
  }
  return false;
}
