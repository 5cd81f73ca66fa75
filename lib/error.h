// Failure reporting for the C ABI: every failing call records a one-line message in a
// thread-local buffer (read back with qmoe_last_error_message) and returns its status.
#ifndef QMOE_LIB_ERROR_H_
#define QMOE_LIB_ERROR_H_

#include "qmoe/qmoe.h"

namespace qmoe {

/// Record "<function>: <formatted detail>" for the calling thread and return `status`.
qmoe_status fail(qmoe_status status, const char* function, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

/// The calling thread's last message ("" when none).
const char* last_error_message();

}  // namespace qmoe

/// QMOE_FAIL(status, "detail %d", x) inside an ABI function: records the message prefixed with
/// the function's name and returns the status from the enclosing function.
#define QMOE_FAIL(status, ...) return ::qmoe::fail((status), __func__, __VA_ARGS__)

#endif  // QMOE_LIB_ERROR_H_
