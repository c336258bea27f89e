// Progress of a long stage of work (loading a model) on stderr. On a terminal, one line per
// stage rewritten in place ("load: check weights  12.3 / 50.4 GB  6.1 GB/s"); otherwise one
// JSON line when the stage ends ({"event":"load","stage":...,"done":...,"seconds":...}), which
// log collectors read beside the server's other events. Off: silent. One thread drives it.
#pragma once
#include <chrono>
#include <string>

namespace clefrt {

class Progress {
 public:
  // total: in `unit`s ("GB" counts bytes and prints GB and GB/s; any other unit counts items)
  Progress(bool on, std::string stage, double total, std::string unit);
  ~Progress();  // finish() if not called
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void add(double amount);
  void finish();

 private:
  void draw(bool last);
  bool on_, tty_, finished_ = false;
  std::string stage_, unit_;
  double total_, done_ = 0;
  std::chrono::steady_clock::time_point t0_, last_draw_;
};

// A counter line of a long command (synth's layers, quantize's tensors, eval's rows) on stderr:
// on a terminal rewritten in place; elsewhere (a log file, a pipe) a line of its own at most
// every 10 s and at the end, so logs read line by line rather than as one "\r"-joined line.
class StatusLine {
 public:
  StatusLine();
  void update(const std::string& text);  // the latest state
  void done(const std::string& text);    // the last state, then a line end
  void end();                            // a line end if a terminal line is open (before an error)

 private:
  bool tty_, shown_ = false;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace clefrt
