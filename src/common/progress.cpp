#include "common/progress.h"

#include <unistd.h>

#include <cstdio>

#include "common/log_event.h"

namespace clefrt {

Progress::Progress(bool on, std::string stage, double total, std::string unit)
    : on_(on), tty_(on && isatty(STDERR_FILENO)), stage_(std::move(stage)), unit_(std::move(unit)), total_(total),
      t0_(std::chrono::steady_clock::now()), last_draw_(t0_) {
  if (tty_) draw(false);
}

Progress::~Progress() { finish(); }

void Progress::add(double amount) {
  done_ += amount;
  if (!tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(200)) return;  // a terminal, not a flood
  last_draw_ = now;
  draw(false);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (on_) draw(true);
}

void Progress::draw(bool last) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const bool bytes = unit_ == "GB";
  const double scale = bytes ? 1e-9 : 1.0, done = done_ * scale, total = total_ * scale;
  if (tty_) {
    if (bytes)
      std::fprintf(stderr, "\rload: %-16s %7.1f / %.1f GB  %5.1f GB/s  %5.1f s", stage_.c_str(), done, total, secs > 0 ? done / secs : 0.0, secs);
    else
      std::fprintf(stderr, "\rload: %-16s %5.0f / %.0f %s  %5.1f s", stage_.c_str(), done, total, unit_.c_str(), secs);
    if (last) std::fprintf(stderr, "\n");
    std::fflush(stderr);
    return;
  }
  if (!last) return;
  char b[256];
  if (bytes)
    std::snprintf(b, sizeof b, "\"event\":\"load\",\"stage\":\"%s\",\"gb\":%.2f,\"seconds\":%.2f,\"gb_per_s\":%.2f", stage_.c_str(), done, secs,
                  secs > 0 ? done / secs : 0.0);
  else
    std::snprintf(b, sizeof b, "\"event\":\"load\",\"stage\":\"%s\",\"%s\":%.0f,\"seconds\":%.2f", stage_.c_str(), unit_.c_str(), done, secs);
  log_event(b);
}

StatusLine::StatusLine() : tty_(isatty(STDERR_FILENO)), last_(std::chrono::steady_clock::now()) {}

void StatusLine::update(const std::string& text) {
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    std::fprintf(stderr, "\r%s   ", text.c_str());
    std::fflush(stderr);
    shown_ = true;
    return;
  }
  if (now - last_ < std::chrono::seconds(10)) return;
  last_ = now;
  std::fprintf(stderr, "%s\n", text.c_str());
}

void StatusLine::end() {
  if (tty_ && shown_) std::fprintf(stderr, "\n");
  shown_ = false;
}

void StatusLine::done(const std::string& text) {
  std::fprintf(stderr, tty_ ? "\r%s   \n" : "%s\n", text.c_str());
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace clefrt
