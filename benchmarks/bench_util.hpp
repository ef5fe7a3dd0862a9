// Helpers the C++ micro-benchmarks share: medians and the machine facts every result records.
#pragma once

#include <algorithm>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

namespace bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The value of the first "key: value" line of `file` that starts with `key` (the whole line for
// an empty key), "" when there is none.
inline std::string read_first(const char* file, const char* key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "";
}

inline std::string today() {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::localtime(&now));
  return date;
}

}  // namespace bench
