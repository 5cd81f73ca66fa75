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

}  // namespace qmoe

extern "C" {

QMOE_API const char* qmoe_last_error_message(void) {
  return qmoe::t_last_error;
}

QMOE_API const char* qmoe_status_string(qmoe_status status) {
  switch (status) {
    case QMOE_STATUS_OK:
      return "QMOE_STATUS_OK";
    case QMOE_STATUS_INVALID_ARGUMENT:
      return "QMOE_STATUS_INVALID_ARGUMENT";
    case QMOE_STATUS_UNSUPPORTED_HARDWARE:
      return "QMOE_STATUS_UNSUPPORTED_HARDWARE";
    case QMOE_STATUS_UNSUPPORTED_FORMAT:
      return "QMOE_STATUS_UNSUPPORTED_FORMAT";
    case QMOE_STATUS_OUT_OF_MEMORY:
      return "QMOE_STATUS_OUT_OF_MEMORY";
    case QMOE_STATUS_INVALID_CONTEXT:
      return "QMOE_STATUS_INVALID_CONTEXT";
    case QMOE_STATUS_CUDA_ERROR:
      return "QMOE_STATUS_CUDA_ERROR";
    case QMOE_STATUS_CUDA_UNAVAILABLE:
      return "QMOE_STATUS_CUDA_UNAVAILABLE";
    case QMOE_STATUS_TIMEOUT:
      return "QMOE_STATUS_TIMEOUT";
    case QMOE_STATUS_INTERNAL_ERROR:
      return "QMOE_STATUS_INTERNAL_ERROR";
  }
  return "QMOE_STATUS_<unknown>";
}

}  // extern "C"
