// The library's log: a level and an optional callback that receives every line at or above it.
//
// By default lines at `warn` and above go to stderr as "sapiens-seg warning: MESSAGE". The
// level comes from set_log_level() once it has been called, else from SAPIENS_SEG_LOG
// (debug|info|warn|error|quiet; unset or any other value: warn), which is read again at each
// line until set_log_level() is called (docs/configuration.md).
//
//   sapiens_seg::set_log_level(sapiens_seg::LogLevel::kInfo);
//   sapiens_seg::set_log_callback([](sapiens_seg::LogLevel level, std::string_view line) {
//     my_logger.write(sapiens_seg::to_string(level), line);
//   });
//
// The callback runs on the thread that logs (any thread, including threads the library or the
// caller started), without any library lock held, so it may log itself or take its own locks;
// lines from several threads may reach it at once. It must not throw (an exception it lets out is
// dropped). set_log_callback({}) goes back to stderr.
#pragma once

#include <functional>
#include <string_view>

#include "sapiens_seg/export.hpp"

namespace sapiens_seg {

enum class LogLevel { kDebug, kInfo, kWarn, kError, kQuiet };

// The line without the "sapiens-seg LEVEL: " prefix and without a newline. `level` is never
// kQuiet.
using LogCallback = std::function<void(LogLevel level, std::string_view line)>;

// Lines below `level` are dropped (kQuiet drops every line). Overrides SAPIENS_SEG_LOG from
// then on. Safe to call from any thread at any time.
SAPIENS_SEG_API void set_log_level(LogLevel level);
// The level in force now (set_log_level's, else SAPIENS_SEG_LOG's, else kWarn).
SAPIENS_SEG_API LogLevel log_level();
// Where lines go: `callback`, or stderr when it is empty. Safe to call from any thread; a line
// being delivered while it is replaced may still reach the old callback.
SAPIENS_SEG_API void set_log_callback(LogCallback callback);

// "debug", "info", "warn", "error", "quiet": the spellings of SAPIENS_SEG_LOG.
SAPIENS_SEG_API std::string_view to_string(LogLevel level) noexcept;
// The level a name spells (as to_string() spells it); an Error (kInvalidInput) listing the names
// otherwise.
SAPIENS_SEG_API LogLevel parse_log_level(std::string_view name);

}  // namespace sapiens_seg
