#include "progress.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

Progress::Progress(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)),
      total_(total == 0 ? 1 : total),
      enabled_(enabled),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  if (enabled_) draw(0, true);
}

Progress::~Progress() {
  // Destroyed before finish(): the work stopped early (an error), so the bar is left where it
  // was rather than drawn at 100%; only the line is ended.
  if (enabled_ && !finished_ && tty_) std::fputc('\n', stderr);
}

void Progress::update(uint64_t done) {
  if (enabled_ && !finished_) draw(done, false);
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  draw(total_, true);
  if (tty_) std::fputc('\n', stderr);
  finished_ = true;
}

void Progress::draw(uint64_t done, bool force) {
  if (done > total_) done = total_;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double fraction = static_cast<double>(done) / static_cast<double>(total_);
  if (tty_) {
    // At most ~20 redraws a second.
    if (!force && now - last_draw_ < std::chrono::milliseconds(50)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    char bar[kWidth + 1];
    for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
    bar[kWidth] = '\0';
    std::fprintf(stderr, "\r%-22s [%s] %3d%% %llu/%llu %.1fs", label_.c_str(), bar,
                 static_cast<int>(fraction * 100.0), static_cast<unsigned long long>(done),
                 static_cast<unsigned long long>(total_), elapsed);
    std::fflush(stderr);
    return;
  }
  const int quarter = static_cast<int>(fraction * 4.0);
  if (quarter == last_quarter_) return;
  last_quarter_ = quarter;
  std::fprintf(stderr, "%s: %d%% (%llu/%llu) %.1fs\n", label_.c_str(), quarter * 25,
               static_cast<unsigned long long>(done), static_cast<unsigned long long>(total_),
               elapsed);
}
