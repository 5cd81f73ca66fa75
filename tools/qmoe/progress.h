// A progress bar on stderr for the qmoe tool: redrawn in place when stderr is a terminal,
// otherwise a plain line at every quarter (so logs stay short).
#ifndef QMOE_TOOLS_QMOE_PROGRESS_H_
#define QMOE_TOOLS_QMOE_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <string>

class Progress {
 public:
  // `enabled` false makes every call a no-op.
  Progress(std::string label, uint64_t total, bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void update(uint64_t done);
  // Draws 100% and ends the line; call it when the work is done. A bar destroyed without it
  // (an early return) stays at its last value.
  void finish();

 private:
  void draw(uint64_t done, bool force);

  std::string label_;
  uint64_t total_;
  bool enabled_;
  bool tty_;
  bool finished_ = false;
  int last_quarter_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

#endif  // QMOE_TOOLS_QMOE_PROGRESS_H_
