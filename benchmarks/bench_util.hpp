// Helpers the C++ micro-benchmarks share: medians and the machine facts every result records.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

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

// The flags the kernel micro-benchmarks share: --reps N, --json FILE, --only TEXT (cases whose
// name contains TEXT). False, with `usage` printed, on anything else.
struct Args {
  int reps;
  std::string json_out, only;
};
inline bool parse_args(int argc, char** argv, const char* usage, Args& args) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      args.reps = std::stoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      args.json_out = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      args.only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s\n", usage);
      return false;
    }
  }
  return true;
}

// The CPU's identity as /proc/cpuinfo prints what CPUID says: one model name ("AMD EPYC" in a VM)
// spans generations whose vector units differ.
inline nlohmann::json cpu_id_json() {
  auto num = [](const char* key) {
    const std::string v = read_first("/proc/cpuinfo", key);
    return v.empty() || !std::isdigit(static_cast<unsigned char>(v[0])) ? -1 : std::stoi(v);
  };
  return {{"vendor", read_first("/proc/cpuinfo", "vendor_id")},
          {"family", num("cpu family")},
          {"model", num("model\t")},
          {"stepping", num("stepping")}};
}

// What every result file records about the machine it ran on: date, CPU model, identity and
// flags, cores, LibTorch's threads, the load average.
inline nlohmann::json machine_json() {
  return {{"date", today()},
          {"cpu", read_first("/proc/cpuinfo", "model name")},
          {"cpu_id", cpu_id_json()},
          {"cpu_flags", read_first("/proc/cpuinfo", "flags")},
          {"cores", read_first("/proc/cpuinfo", "cpu cores")},
          {"threads", at::get_num_threads()},
          {"load_average", read_first("/proc/loadavg", "")}};
}

// A micro-benchmark's result file: the machine facts, the LibTorch version, the repetitions and
// one object per row. Nothing is written when `path` is empty (the rows were printed).
inline void write_result(const std::string& path, int reps, const nlohmann::json& rows) {
  if (path.empty()) return;
  nlohmann::json out = machine_json();
  out["libtorch"] = TORCH_VERSION;
  out["reps"] = reps;
  out["rows"] = rows;
  std::ofstream(path) << out.dump(2) << "\n";
}

}  // namespace bench
