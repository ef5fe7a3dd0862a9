#include "paths.hpp"

#include <dlfcn.h>
#include <pwd.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "../core/settings.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::io {
namespace fs = std::filesystem;

namespace {
// $HOME, else the account's home folder from the password database (a service or a container
// started without HOME). Never the working folder: a cache created wherever the process happens
// to run would be lost, or written into someone's project. No home at all is an error naming the
// variables that choose the folder.
fs::path home(const core::Settings& s) {
  if (!s.home.empty()) return s.home;
  const long size_hint = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size_hint > 0 ? static_cast<std::size_t>(size_hint) : 16384);
  struct passwd pw {};
  struct passwd* found = nullptr;
  if (::getpwuid_r(::getuid(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr &&
      found->pw_dir != nullptr && found->pw_dir[0] == '/') {
    return found->pw_dir;
  }
  throw Error(ErrorCode::kIo,
              "no folder for the sapiens-seg cache: HOME is not set and the account has no home "
              "folder; set SAPIENS_SEG_HOME (or XDG_CACHE_HOME, or HOME)");
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
  for (const fs::path& d : core::read_settings().card_dirs) dirs.push_back(d.string());
  const fs::path bundled = own_dir() / ".." / "share" / "sapiens_seg" / "cards";
  std::error_code ec;
  if (fs::is_directory(bundled, ec)) dirs.push_back(fs::weakly_canonical(bundled, ec).string());
  return dirs;
}

std::string cache_dir() {
  const core::Settings s = core::read_settings();
  if (!s.cache_home.empty()) return s.cache_home.string();
  if (!s.xdg_cache_home.empty()) return (s.xdg_cache_home / "sapiens-seg").string();
  return (home(s) / ".cache" / "sapiens-seg").string();
}

std::string hf_hub_cache_dir() {
  const core::Settings s = core::read_settings();
  if (!s.hf_hub_cache.empty()) return s.hf_hub_cache.string();
  if (!s.hf_home.empty()) return (s.hf_home / "hub").string();
  return (home(s) / ".cache" / "huggingface" / "hub").string();
}

}  // namespace sapiens_seg::io
