// What the machine says about itself and its load, from /proc: recorded with every result, and the
// peak-RSS counter each worker resets before its timed rounds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace speed_check {

// A "VmHWM"-style field of /proc/self/status, in bytes (0 when absent).
std::int64_t vm_status(const char* field);
// Resets VmHWM (the peak RSS) to the current RSS.
void reset_peak_rss();

std::string cpu_model();
// Vendor, family, model and stepping, as /proc/cpuinfo prints CPUID's.
nlohmann::json cpu_identity();
bool cpu_flag(const std::string& flag);
// The ISA flags that decide the CPU's fast dtypes (as in src/core/cpu/cpuinfo.cpp).
std::vector<std::string> isa_flags();
std::string loadavg();

// User + system CPU time of this process, all threads, in ms.
double process_cpu_ms();
// The CPUs other jobs keep busy, sampled over a second; with a budget, samples again (for up to
// `seconds`) until that falls under a fifth of a core. Called while every worker is idle.
double wait_for_quiet(double seconds);

}  // namespace speed_check
