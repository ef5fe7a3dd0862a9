// The library's own log lines: io::log(Level::kWarn, "...") goes to the public log
// (include/sapiens_seg/log.hpp): its level (set_log_level, else SAPIENS_SEG_LOG) and its
// callback (else stderr).
#pragma once

#include <string>

#include "sapiens_seg/log.hpp"

namespace sapiens_seg::io {

using Level = LogLevel;

// Never throws; `level` kQuiet is dropped.
void log(Level level, const std::string& message) noexcept;

}  // namespace sapiens_seg::io
