#include "stop.hpp"

#include <unistd.h>

#include <array>
#include <csignal>
#include <cstring>

namespace sapiens_seg::cli {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

// The temporary files being written now, for the second signal's handler, which may only make
// async-signal-safe calls (unlink, _exit): fixed slots of fixed-size names, claimed with an
// atomic flag, no allocation.
constexpr int kSlots = 128;
struct Slot {
  std::atomic<bool> used{false};
  std::atomic<bool> ready{false};
  char path[4096] = {};
};
std::array<Slot, kSlots> g_temps;

extern "C" void on_stop_signal(int sig) {
  if (g_stop.exchange(true)) {
    // The second signal: the user means it. No thread is waited for.
    for (auto& s : g_temps) {
      if (s.ready.load()) ::unlink(s.path);
    }
    ::_exit(128 + sig);
  }
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // Reads and writes in flight resume instead of failing with EINTR: the image in flight is
  // finished, not turned into an error.
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // A file size limit (ulimit -f, RLIMIT_FSIZE, as batch schedulers set it) would kill the
  // process with SIGXFSZ at the first write past it, leaving a temporary file and no summary:
  // ignored, the write fails with EFBIG instead, and that output's input is an I/O error.
  std::signal(SIGXFSZ, SIG_IGN);
}

std::atomic<bool>& stop_flag() {
  return g_stop;
}

void request_stop(int signal) noexcept {
  int none = 0;
  g_signal.compare_exchange_strong(none, signal);
  g_stop = true;
}

int stop_signal() noexcept {
  return g_signal.load();
}

std::string stop_reason() {
  switch (g_signal.load()) {
    case 0:
      return "";
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGPIPE:
      return "SIGPIPE (stdout was closed)";
    default:
      return "signal " + std::to_string(g_signal.load());
  }
}

TempFileGuard::TempFileGuard(const std::string& path) noexcept {
  if (path.size() >= sizeof(Slot::path)) return;
  for (int i = 0; i < kSlots; ++i) {
    if (!g_temps[i].used.exchange(true)) {
      std::memcpy(g_temps[i].path, path.c_str(), path.size() + 1);
      g_temps[i].ready = true;
      slot_ = i;
      return;
    }
  }
}

TempFileGuard::~TempFileGuard() {
  if (slot_ < 0) return;
  g_temps[slot_].ready = false;
  g_temps[slot_].used = false;
}

}  // namespace sapiens_seg::cli
