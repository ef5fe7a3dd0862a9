// Minimal leveled logging to stderr. SAPIENS_SEG_LOG=debug|info|warn|error|quiet (default warn).
#pragma once

#include <string>

namespace sapiens_seg::io {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kQuiet = 4 };

void log(Level level, const std::string& message);
void set_log_level(Level level);  // overrides the environment (the CLI's -v / -q)
Level log_level();

}  // namespace sapiens_seg::io
