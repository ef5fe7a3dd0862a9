#include "log.hpp"

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <utility>

#include "../core/settings.hpp"

namespace sapiens_seg {
namespace {

constexpr int kFromEnvironment = -1;

// Never destroyed: a line logged from another object's destructor at exit still finds it.
struct LogState {
  std::atomic<int> level{kFromEnvironment};  // set_log_level's, or SAPIENS_SEG_LOG's
  std::mutex callback_mu;
  std::shared_ptr<const LogCallback> callback;  // null: stderr
  std::mutex stderr_mu;                         // whole lines, even from several threads
};

LogState& state() {
  static auto* s = new LogState;
  return *s;
}

}  // namespace

void set_log_level(LogLevel level) {
  state().level = static_cast<int>(level);
}

LogLevel log_level() {
  const int set = state().level.load();
  if (set != kFromEnvironment) return static_cast<LogLevel>(set);
  return core::read_settings().log_level;
}

void set_log_callback(LogCallback callback) {
  auto next = callback ? std::make_shared<const LogCallback>(std::move(callback)) : nullptr;
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.callback_mu);
  s.callback.swap(next);
  // The previous callback is released after the lock (its captures may log or take locks).
}

namespace io {

void log(Level level, const std::string& message) noexcept {
  try {
    if (level == Level::kQuiet || static_cast<int>(level) < static_cast<int>(log_level())) return;
    LogState& s = state();
    std::shared_ptr<const LogCallback> callback;
    {
      std::lock_guard<std::mutex> lock(s.callback_mu);
      callback = s.callback;
    }
    // Called without a lock of ours held: a callback that takes a lock (Python's GIL) which a
    // thread logging at the same time holds would otherwise deadlock the two.
    if (callback) {
      (*callback)(level, message);
      return;
    }
    static const char* const names[] = {"debug", "info", "warning", "error"};
    std::lock_guard<std::mutex> lock(s.stderr_mu);
    std::fprintf(stderr, "sapiens-seg %s: %s\n", names[static_cast<int>(level)], message.c_str());
  } catch (...) {
    // A log line is not worth an exception in the caller (a callback's, or out of memory).
  }
}

}  // namespace io
}  // namespace sapiens_seg
