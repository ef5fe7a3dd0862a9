// How a run ends early: SIGINT, SIGTERM and SIGHUP (Ctrl-C, `kill`, `timeout`, `docker stop`,
// a batch scheduler, a dropped ssh session) and a closed stdout (`--json | head -1`) all ask the
// run to stop the same way: the images being segmented are finished, nothing new starts, the
// summary is written with "cancelled": true, no temporary file is left, and the exit status is
// 128 + the signal's number (SIGPIPE's for a closed stdout). A second signal ends the process at
// once, removing the temporary files being written.
#pragma once

#include <atomic>
#include <string>

namespace sapiens_seg::cli {

// Installs the handlers (and ignores SIGPIPE, so that a closed stdout is an EPIPE error that the
// writer sees rather than a death by signal, and SIGXFSZ, so that a write past the file size
// limit fails with EFBIG and is reported). Call once, before any thread starts.
void install_stop_handlers();

// The flag every stage polls (also handed to downloads as their cancel flag).
std::atomic<bool>& stop_flag();

// Stops the run as if `signal` had arrived (SIGPIPE when stdout is closed).
void request_stop(int signal) noexcept;

// The signal that stopped the run, 0 when none.
int stop_signal() noexcept;

// "SIGTERM", "SIGPIPE (stdout was closed)", ...
std::string stop_reason();

// A temporary file that the process removes if a second signal ends it in the middle of writing.
// Scoped: the file is forgotten (not removed) when the object dies.
class TempFileGuard {
 public:
  explicit TempFileGuard(const std::string& path) noexcept;
  ~TempFileGuard();
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;

 private:
  int slot_ = -1;
};

}  // namespace sapiens_seg::cli
