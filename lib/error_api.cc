// The status ABI: status names and the calling thread's last failure message.
#include "lib/error.h"

extern "C" {

QMOE_API const char* qmoe_last_error_message(void) {
  return qmoe::last_error_message();
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
    case QMOE_STATUS_IO_ERROR:
      return "QMOE_STATUS_IO_ERROR";
    case QMOE_STATUS_CORRUPT_DATA:
      return "QMOE_STATUS_CORRUPT_DATA";
  }
  return "QMOE_STATUS_<unknown>";
}

}  // extern "C"
