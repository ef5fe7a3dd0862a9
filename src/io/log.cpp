#include "log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "paths.hpp"

namespace sapiens_seg::io {
namespace {

Level from_env() {
  const std::string v = env("SAPIENS_SEG_LOG");
  if (v == "debug") return Level::kDebug;
  if (v == "info") return Level::kInfo;
  if (v == "error") return Level::kError;
  if (v == "quiet") return Level::kQuiet;
  return Level::kWarn;
}

std::atomic<int>& level_ref() {
  static std::atomic<int> level{static_cast<int>(from_env())};
  return level;
}

}  // namespace

void set_log_level(Level level) {
  level_ref() = static_cast<int>(level);
}
Level log_level() {
  return static_cast<Level>(level_ref().load());
}

void log(Level level, const std::string& message) {
  if (static_cast<int>(level) < level_ref().load()) return;
  static const char* names[] = {"debug", "info", "warning", "error"};
  static std::mutex mu;  // whole lines, even from several threads
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "sapiens-seg %s: %s\n", names[static_cast<int>(level)], message.c_str());
}

}  // namespace sapiens_seg::io
