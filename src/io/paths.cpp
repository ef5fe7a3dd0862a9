#include "paths.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace sapiens_seg::io {
namespace fs = std::filesystem;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_flag(const char* name) {
  std::string v = env(name);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

namespace {
std::string home() {
  std::string h = env("HOME");
  return h.empty() ? "." : h;
}

// The folder of the binary that contains this function (libsapiens_seg.so, or an executable
// that links the library statically).
fs::path own_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_dir), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code ec;
    fs::path p = fs::canonical(info.dli_fname, ec);
    if (!ec) return p.parent_path();
  }
  return {};
}
}  // namespace

std::vector<std::string> card_dirs() {
  std::vector<std::string> dirs;
  std::stringstream ss(env("SAPIENS_SEG_CARDS"));
  for (std::string d; std::getline(ss, d, ':');) {
    if (!d.empty()) dirs.push_back(d);
  }
  const fs::path bundled = own_dir() / ".." / "share" / "sapiens_seg" / "cards";
  std::error_code ec;
  if (fs::is_directory(bundled, ec)) dirs.push_back(fs::weakly_canonical(bundled, ec).string());
  return dirs;
}

std::string cache_dir() {
  if (auto v = env("SAPIENS_SEG_HOME"); !v.empty()) return v;
  if (auto v = env("XDG_CACHE_HOME"); !v.empty()) return (fs::path(v) / "sapiens-seg").string();
  return (fs::path(home()) / ".cache" / "sapiens-seg").string();
}

std::string hf_hub_cache_dir() {
  if (auto v = env("HF_HUB_CACHE"); !v.empty()) return v;
  if (auto v = env("HF_HOME"); !v.empty()) return (fs::path(v) / "hub").string();
  return (fs::path(home()) / ".cache" / "huggingface" / "hub").string();
}

}  // namespace sapiens_seg::io
