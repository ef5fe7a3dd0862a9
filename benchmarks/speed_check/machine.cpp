#include "machine.hpp"

#include <sys/resource.h>

#include <cctype>
#include <chrono>
#include <fstream>
#include <thread>
#include <utility>

#include "timing.hpp"

namespace speed_check {

std::int64_t vm_status(const char* field) {
  std::ifstream in("/proc/self/status");
  const std::string key = std::string(field) + ":";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  }
  return 0;
}

// Writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS.
void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// One model name ("AMD EPYC" in a VM) spans generations whose vector units differ by 2x, so the
// record names vendor, family, model and stepping.
nlohmann::json cpu_identity() {
  nlohmann::json id = {{"vendor", ""}, {"family", -1}, {"model", -1}, {"stepping", -1}};
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line) && !line.empty();) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "vendor_id") id["vendor"] = value;
    const char* num_keys[] = {"cpu family", "model", "stepping"};
    const char* names[] = {"family", "model", "stepping"};
    for (int i = 0; i < 3; ++i) {
      if (key == num_keys[i] && !value.empty() &&
          std::isdigit(static_cast<unsigned char>(value[0])))
        id[names[i]] = std::stoi(value);
    }
  }
  return id;
}

bool cpu_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) == 0)
      return (line + " ").find(" " + flag + " ") != std::string::npos;
  }
  return false;
}

std::vector<std::string> isa_flags() {
  std::vector<std::string> out;
  for (const char* f : {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                        "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16"}) {
    if (cpu_flag(f)) out.emplace_back(f);
  }
  return out;
}

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

double process_cpu_ms() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return (static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

namespace {

// Busy CPUs (0 .. cores) over `ms` milliseconds, from /proc/stat.
double busy_cpus(int ms) {
  auto sample = [] {
    std::ifstream in("/proc/stat");
    std::string cpu;
    std::uint64_t v[8] = {};
    in >> cpu >> v[0] >> v[1] >> v[2] >> v[3] >> v[4] >> v[5] >> v[6] >> v[7];
    const std::uint64_t idle = v[3] + v[4];
    std::uint64_t total = 0;
    for (auto x : v) total += x;
    return std::pair<std::uint64_t, std::uint64_t>{total - idle, total};
  };
  const auto a = sample();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  const auto b = sample();
  const double total = static_cast<double>(b.second - a.second);
  return total > 0 ? static_cast<double>(b.first - a.first) / total *
                         static_cast<double>(std::thread::hardware_concurrency())
                   : 0.0;
}

}  // namespace

double wait_for_quiet(double seconds) {
  const auto t0 = Clock::now();
  double busy = busy_cpus(1000);
  while (busy > 0.2 && ms_since(t0) < seconds * 1e3) busy = busy_cpus(1000);
  return busy;
}

}  // namespace speed_check
