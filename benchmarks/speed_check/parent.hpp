// The parent process: one worker per column, driven in lock step; the JSON result.
#pragma once

#include <string>

#include "options.hpp"

namespace speed_check {

int run_parent(const Options& options, const std::string& command, const char* argv0);

}  // namespace speed_check
