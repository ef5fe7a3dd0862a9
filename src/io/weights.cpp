#include "weights.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "download.hpp"
#include "log.hpp"
#include "npy.hpp"
#include "paths.hpp"
#include "sapiens_seg/error.hpp"
#include "sha256.hpp"

namespace sapiens_seg::io {
namespace fs = std::filesystem;

void check_license(const Card& card, const GateOptions& gate) {
  if (card.commercial_use) return;
  if (gate.accept_noncommercial || env_flag("SAPIENS_SEG_NONCOMMERCIAL")) return;
  throw Error(ErrorCode::kLicenseNotAccepted,
              "model '" + card.id + "' is licensed " + card.license_id +
                  " (non-commercial use only" +
                  (card.license_url.empty() ? std::string() : ", " + card.license_url) +
                  "). Accept the licence with SAPIENS_SEG_NONCOMMERCIAL=1, the CLI flag "
                  "--accept-noncommercial, or LoadOptions::accept_noncommercial = true.");
}

bool show_license_notice(const Card& card) {
  if (card.license_notice.empty()) return false;
  std::string name = card.license_id.empty() ? card.id : card.license_id;
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '.') ch = '_';
  }
  const fs::path marker = fs::path(cache_dir()) / "notices" / (name + ".shown");
  std::error_code ec;
  if (fs::exists(marker, ec)) return false;
  log(Level::kWarn, "licence notice for " + card.id + " (shown once): " + card.license_notice);
  // If the marker cannot be written (read-only home), the notice simply shows again next time.
  fs::create_directories(marker.parent_path(), ec);
  std::ofstream(marker) << card.license_id << "\n" << card.license_notice << "\n";
  return true;
}

std::string weights_target(const Card& card) {
  return (fs::path(cache_dir()) / "weights" / card.file).string();
}

bool offline() {
  return env_flag("SAPIENS_SEG_OFFLINE") || env_flag("HF_HUB_OFFLINE");
}

std::string download_url(const Card& card) {
  if (!card.repo.empty() && !card.revision.empty()) {
    std::string endpoint = env("HF_ENDPOINT");
    if (endpoint.empty()) endpoint = "https://huggingface.co";
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    return endpoint + "/" + card.repo + "/resolve/" + card.revision + "/" + card.path_in_repo;
  }
  return card.url;
}

namespace {

std::vector<Located> candidates(const Card& card) {
  std::vector<Located> c;
  if (auto dir = env("SAPIENS_SEG_WEIGHTS_PATH"); !dir.empty()) {
    c.push_back({(fs::path(dir) / card.file).string(), "weights_path"});
  }
  c.push_back({weights_target(card), "cache"});
  if (!card.repo.empty() && !card.revision.empty()) {
    std::string repo_dir = "models--" + card.repo;
    for (auto pos = repo_dir.find('/'); pos != std::string::npos; pos = repo_dir.find('/')) {
      repo_dir.replace(pos, 1, "--");
    }
    c.push_back(
        {(fs::path(hf_hub_cache_dir()) / repo_dir / "snapshots" / card.revision / card.path_in_repo)
             .string(),
         "hf_cache"});
  }
  return c;
}

std::string placement_hint(const Card& card) {
  std::ostringstream os;
  os << "\n  file:   " << card.file;
  if (card.size) os << " (" << *card.size << " bytes)";
  os << "\n  sha256: " << (card.sha256 ? *card.sha256 : std::string("(no pinned hash)"));
  const std::string url = download_url(card);
  os << "\n  url:    " << (url.empty() ? std::string("(none)") : url);
  os << "\n  put it in " << (fs::path(cache_dir()) / "weights").string()
     << "/ or in a folder named by SAPIENS_SEG_WEIGHTS_PATH.\n  looked in:";
  for (const auto& p : candidates(card)) os << "\n    " << p.path;
  return os.str();
}

// Stamps live in the project cache, keyed by the file's absolute path, so files in read-only
// folders (the Hugging Face cache, hand-placed folders) get one too.
fs::path stamp_path(const std::string& path) {
  std::error_code ec;
  const std::string abs = fs::absolute(path, ec).lexically_normal().string();
  Sha256 h;
  h.update(abs.data(), abs.size());
  return fs::path(cache_dir()) / "stamps" / (h.hex().substr(0, 32) + ".json");
}

struct FileId {
  std::uint64_t size = 0, inode = 0;
  std::int64_t mtime_ns = 0;
};

std::optional<FileId> file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{static_cast<std::uint64_t>(st.st_size), static_cast<std::uint64_t>(st.st_ino),
                static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec};
}

std::int64_t now_ns() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::optional<std::string> read_stamp(const std::string& path) {
  const auto id = file_id(path);
  std::ifstream in(stamp_path(path));
  if (!id || !in) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(in);
    // Like git's racy-clean rule: a file modified less than two seconds before its stamp was
    // written may have changed again within the timestamp granularity, so it is hashed again.
    const bool racy = id->mtime_ns + 2'000'000'000LL > j.at("stamped_ns").get<std::int64_t>();
    if (!racy && j.at("size").get<std::uint64_t>() == id->size &&
        j.at("inode").get<std::uint64_t>() == id->inode &&
        j.at("mtime_ns").get<std::int64_t>() == id->mtime_ns) {
      return j.at("sha256").get<std::string>();
    }
  } catch (const nlohmann::json::exception&) {
    // A damaged stamp is only a lost shortcut: hash again.
  }
  return std::nullopt;
}

void write_stamp(const std::string& path, const std::string& sha) {
  const auto id = file_id(path);
  if (!id) return;
  const fs::path sp = stamp_path(path);
  std::error_code ec;
  fs::create_directories(sp.parent_path(), ec);
  const std::string text = nlohmann::json{
      {"path", fs::absolute(path, ec).string()},
      {"size", id->size},
      {"inode", id->inode},
      {"mtime_ns", id->mtime_ns},
      {"stamped_ns", now_ns()},
      {"sha256", sha}}.dump(2);
  try {
    write_file_atomic(sp.string(), text.data(), text.size());
  } catch (const Error& e) {
    log(Level::kWarn, std::string("cannot save the verification stamp: ") + e.what());
  }
}

// A progress bar on stderr, redrawn in place; used when the caller gave no callback.
class ProgressBar {
 public:
  bool operator()(const DownloadProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.total > 0 && p.done == p.total) {
      draw(p);
      std::fputc('\n', stderr);
      return true;
    }
    if (now - last_ < std::chrono::milliseconds(250)) return true;
    last_ = now;
    draw(p);
    return true;
  }

 private:
  static void draw(const DownloadProgress& p) {
    const double mb = 1e6;
    std::string name = p.file.size() > 36 ? p.file.substr(0, 33) + "..." : p.file;
    if (p.total > 0) {
      const double f = static_cast<double>(p.done) / static_cast<double>(p.total);
      const int filled = static_cast<int>(f * 24);
      const double eta =
          p.bytes_per_second > 0 ? static_cast<double>(p.total - p.done) / p.bytes_per_second : 0;
      std::fprintf(stderr, "\r%-36s [%s%s] %3d%% %8.1f/%.1f MB %6.1f MB/s ETA %d:%02d ",
                   name.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
                   std::string(static_cast<size_t>(24 - filled), '-').c_str(),
                   static_cast<int>(f * 100), static_cast<double>(p.done) / mb,
                   static_cast<double>(p.total) / mb, p.bytes_per_second / mb,
                   static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
    } else {
      std::fprintf(stderr, "\r%-36s %8.1f MB %6.1f MB/s ", name.c_str(),
                   static_cast<double>(p.done) / mb, p.bytes_per_second / mb);
    }
    std::fflush(stderr);
  }
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace

std::optional<Located> find_weights(const Card& card) {
  std::error_code ec;
  for (const auto& c : candidates(card)) {
    if (fs::is_regular_file(c.path, ec)) return c;
  }
  return std::nullopt;
}

namespace {
void check_verifiable(const Card& card, const GateOptions& gate) {
  if (!card.sha256 && !(gate.allow_unverified || env_flag("SAPIENS_SEG_ALLOW_UNVERIFIED"))) {
    throw Error(ErrorCode::kChecksumMismatch,
                "model '" + card.id +
                    "' has no pinned SHA-256 in its card, so its file cannot be "
                    "verified. Load it anyway with SAPIENS_SEG_ALLOW_UNVERIFIED=1 (or "
                    "LoadOptions::allow_unverified); its hash is printed so you can pin it.");
  }
}
}  // namespace

void remove_stamp(const std::string& path) {
  std::error_code ec;
  fs::remove(stamp_path(path), ec);
}

std::string verify_weights(const Card& card, const std::string& path, const GateOptions& gate,
                           bool rehash) {
  check_verifiable(card, gate);
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) throw Error(ErrorCode::kNotFound, "cannot read " + path + ": " + ec.message());
  if (card.size && size != *card.size) {
    throw Error(ErrorCode::kChecksumMismatch,
                path + " is " + std::to_string(size) + " bytes but '" + card.id + "' is " +
                    std::to_string(*card.size) + " bytes (incomplete or a different file)");
  }
  std::optional<std::string> actual = rehash ? std::nullopt : read_stamp(path);
  if (!actual) {
    log(Level::kInfo, "verifying " + path + " (SHA-256)");
    actual = sha256_file(path);
  }
  if (!card.sha256) {
    log(Level::kWarn, "unverified weights for '" + card.id + "': sha256 " + *actual + " (" + path +
                          "); add it to the card to pin this file");
    write_stamp(path, *actual);
    return *actual;
  }
  if (*actual != *card.sha256) {
    throw Error(ErrorCode::kChecksumMismatch,
                "checksum mismatch for " + path + " ('" + card.id + "')\n  expected sha256 " +
                    *card.sha256 + "\n  actual   sha256 " + *actual +
                    "\n  the file is corrupt or not the one the card describes; it was not used");
  }
  write_stamp(path, *actual);
  return *actual;
}

Verified obtain_weights(const Card& card, const GateOptions& gate, const FetchOptions& fetch) {
  if (auto found = find_weights(card)) {
    return {found->path, verify_weights(card, found->path, gate)};
  }
  const std::string url = download_url(card);
  if (offline()) {
    throw Error(ErrorCode::kOffline,
                "weights for '" + card.id +
                    "' are not on this machine and offline mode "
                    "(SAPIENS_SEG_OFFLINE / HF_HUB_OFFLINE) forbids downloading them." +
                    placement_hint(card));
  }
  if (url.empty()) {
    throw Error(ErrorCode::kNotFound, "weights for '" + card.id +
                                          "' are not on this machine and the card has no URL." +
                                          placement_hint(card));
  }
  check_verifiable(card, gate);  // before any transfer
  DownloadRequest req;
  req.url = url;
  req.dest = weights_target(card);
  req.size = card.size;
  req.sha256 = card.sha256;
  req.label = card.file;
  req.use_hf_token = fetch.use_hf_token;
  req.cancel = fetch.cancel;
  ProgressBar bar;
  if (fetch.progress) {
    req.progress = fetch.progress;
  } else if (::isatty(fileno(stderr)) && log_level() <= Level::kWarn) {
    req.progress = [&bar](const DownloadProgress& p) { return bar(p); };
  }
  log(Level::kInfo, "downloading " + card.file + " from " + url);
  try {
    const DownloadResult r = download(req);
    if (r.transferred) {
      write_stamp(req.dest, r.sha256);
      if (!card.sha256) {
        log(Level::kWarn, "unverified weights for '" + card.id + "': sha256 " + r.sha256 +
                              "; add it to the card to pin this file");
      }
      return {req.dest, r.sha256};
    }
  } catch (const Error& e) {
    // A cancel (Ctrl-C) is no failure to work around by hand.
    if (e.code() != ErrorCode::kDownloadFailed || (fetch.cancel && fetch.cancel->load())) throw;
    throw Error(e.code(),
                std::string(e.what()) + "\n  to place the file by hand:" + placement_hint(card));
  }
  // Another process finished the download while this one waited for the lock.
  return {req.dest, verify_weights(card, req.dest, gate)};
}

}  // namespace sapiens_seg::io

namespace sapiens_seg {
namespace fs = std::filesystem;

std::string cache_dir() {
  return io::cache_dir();
}

WeightsStatus weights_status(const std::string& id) {
  const Card card = find_card(id);
  WeightsStatus s;
  s.id = card.id;
  s.path = io::weights_target(card);
  if (auto found = io::find_weights(card)) {
    s.path = found->path;
    s.location = found->location;
    s.present = true;
  }
  return s;
}

std::string fetch(const std::string& id, const FetchOptions& options) {
  const Card card = find_card(id);
  // Fetching is not using: the licence gate applies at load time. The unverified gate does not
  // apply here either: the computed hash is reported so it can be pinned.
  return io::obtain_weights(card, {.accept_noncommercial = true, .allow_unverified = true}, options)
      .path;
}

WeightsStatus verify(const std::string& id) {
  const Card card = find_card(id);
  WeightsStatus s = weights_status(id);
  if (!s.present) {
    throw Error(ErrorCode::kNotFound,
                "weights for '" + card.id + "' are not on this machine (" + s.path + ")");
  }
  s.sha256 = io::verify_weights(card, s.path, {.allow_unverified = true}, /*rehash=*/true);
  s.verified = card.sha256.has_value();
  return s;
}

bool remove_weights(const std::string& id) {
  const Card card = find_card(id);
  const std::string target = io::weights_target(card);
  std::error_code ec;
  bool removed = false;
  io::remove_stamp(target);
  for (const std::string& p : {target, target + ".part"}) {
    if (fs::exists(p, ec)) {
      fs::remove(p, ec);
      if (ec) throw Error(ErrorCode::kIo, "cannot remove " + p + ": " + ec.message());
      removed = true;
    }
  }
  fs::remove(target + ".lock", ec);
  return removed;
}

}  // namespace sapiens_seg
