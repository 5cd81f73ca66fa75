#include "lib/error.h"

#include <cstdarg>
#include <cstdio>

namespace qmoe {
namespace {

// Fixed-size so that reading it never allocates and a thread exit runs no destructor.
constexpr size_t kMessageCapacity = 512;
thread_local char t_last_error[kMessageCapacity];

}  // namespace

qmoe_status fail(qmoe_status status, const char* function, const char* format, ...) {
  int prefix = std::snprintf(t_last_error, kMessageCapacity, "%s: ", function);
  if (prefix < 0 || static_cast<size_t>(prefix) >= kMessageCapacity) prefix = 0;
  va_list args;
  va_start(args, format);
  std::vsnprintf(t_last_error + prefix, kMessageCapacity - prefix, format, args);
  va_end(args);
  return status;
}

const char* last_error_message() {
  return t_last_error;
}

}  // namespace qmoe
