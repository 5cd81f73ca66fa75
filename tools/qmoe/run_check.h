// How `qmoe run` answers a failed library call: every call is checked, and the library's
// one-line message (it names the function) goes to stderr with exit code 1.
#ifndef QMOE_TOOLS_QMOE_RUN_CHECK_H_
#define QMOE_TOOLS_QMOE_RUN_CHECK_H_

#include <cstdio>

#include "qmoe/qmoe.h"

// Prints the failure on a line of its own (a progress bar may be half drawn) and returns the
// exit code, 1.
inline int report_failed_call(qmoe_status status) {
  std::fprintf(stderr, "\nqmoe run: %s (%s)\n", qmoe_last_error_message(),
               qmoe_status_string(status));
  return 1;
}

// Returns report_failed_call's exit code from the enclosing function when `call` fails.
#define QMOE_CHECK(call)                                                                     \
  do {                                                                                       \
    const qmoe_status qmoe_check_status_ = (call);                                           \
    if (qmoe_check_status_ != QMOE_STATUS_OK) return report_failed_call(qmoe_check_status_); \
  } while (0)

#endif  // QMOE_TOOLS_QMOE_RUN_CHECK_H_
