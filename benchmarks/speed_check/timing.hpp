// Clocks and medians the parent and the workers share.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace speed_check {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The median (the mean of the middle two for an even count); NaN for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace speed_check
