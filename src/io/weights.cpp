#include "weights.hpp"

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "log.hpp"
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

std::string weights_target(const Card& card) {
  return (fs::path(cache_dir()) / "weights" / card.file).string();
}

std::string locate_weights(const Card& card) {
  std::error_code ec;
  std::vector<fs::path> tried;
  if (auto dir = env("SAPIENS_SEG_WEIGHTS_PATH"); !dir.empty()) {
    tried.push_back(fs::path(dir) / card.file);
  }
  tried.emplace_back(weights_target(card));
  if (!card.repo.empty() && !card.revision.empty()) {
    std::string repo_dir = "models--" + card.repo;
    for (auto pos = repo_dir.find('/'); pos != std::string::npos; pos = repo_dir.find('/')) {
      repo_dir.replace(pos, 1, "--");
    }
    tried.push_back(fs::path(hf_hub_cache_dir()) / repo_dir / "snapshots" / card.revision /
                    card.path_in_repo);
  }
  for (const auto& p : tried) {
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  std::ostringstream os;
  os << "weights for '" << card.id << "' are not on this machine.\n  file:   " << card.file;
  if (card.size) os << " (" << *card.size << " bytes)";
  os << "\n  sha256: " << (card.sha256 ? *card.sha256 : std::string("(no pinned hash)"));
  os << "\n  url:    " << (card.url.empty() ? std::string("(none)") : card.url);
  os << "\n  put it in " << (fs::path(cache_dir()) / "weights").string()
     << "/ or in a folder named by SAPIENS_SEG_WEIGHTS_PATH.\n  looked in:";
  for (const auto& p : tried) os << "\n    " << p.string();
  throw Error(ErrorCode::kNotFound, os.str());
}

std::string verify_weights(const Card& card, const std::string& path, const GateOptions& gate) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (card.size && !ec && size != *card.size) {
    throw Error(ErrorCode::kChecksumMismatch,
                path + " is " + std::to_string(size) + " bytes but '" + card.id + "' is " +
                    std::to_string(*card.size) + " bytes (incomplete or a different file)");
  }
  if (!card.sha256 && !(gate.allow_unverified || env_flag("SAPIENS_SEG_ALLOW_UNVERIFIED"))) {
    throw Error(ErrorCode::kChecksumMismatch,
                "model '" + card.id + "' has no pinned SHA-256 in its card, so " + path +
                    " cannot be verified. Load it anyway with SAPIENS_SEG_ALLOW_UNVERIFIED=1 "
                    "(or LoadOptions::allow_unverified); its hash is printed so you can pin it.");
  }
  log(Level::kInfo, "verifying " + path + " (SHA-256)");
  const std::string actual = sha256_file(path);
  if (!card.sha256) {
    log(Level::kWarn, "unverified weights for '" + card.id + "': sha256 " + actual + " (" + path +
                          "); add it to the card to pin this file");
    return actual;
  }
  if (actual != *card.sha256) {
    throw Error(ErrorCode::kChecksumMismatch,
                "checksum mismatch for " + path + " ('" + card.id + "')\n  expected sha256 " +
                    *card.sha256 + "\n  actual   sha256 " + actual +
                    "\n  the file is corrupt or not the one the card describes; it was not loaded");
  }
  return actual;
}

}  // namespace sapiens_seg::io
