// The clock `qmoe run` times its parts with.
#ifndef QMOE_TOOLS_QMOE_RUN_CLOCK_H_
#define QMOE_TOOLS_QMOE_RUN_CLOCK_H_

#include <chrono>

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

#endif  // QMOE_TOOLS_QMOE_RUN_CLOCK_H_
