// The weight store internals: lookup, stamps, verification, licence gates and downloads.
#pragma once

#include <optional>
#include <string>

#include "sapiens_seg/cards.hpp"
#include "sapiens_seg/weights.hpp"

namespace sapiens_seg::io {

struct GateOptions {
  bool accept_noncommercial = false;  // or SAPIENS_SEG_NONCOMMERCIAL=1
  bool allow_unverified = false;      // or SAPIENS_SEG_ALLOW_UNVERIFIED=1
};

// Throws Error(kLicenseNotAccepted) for non-commercial weights without acceptance.
void check_license(const Card& card, const GateOptions& gate);

// Logs the card's licence notice (use restrictions) once per machine and cache folder: a marker
// under <cache>/notices/ records that it was shown. Returns whether it was shown now.
bool show_license_notice(const Card& card);

struct Located {
  std::string path;
  std::string location;  // "weights_path", "cache" or "hf_cache"
};
// Looks for the card's file without hashing or network.
std::optional<Located> find_weights(const Card& card);

// Where a download puts the card's file: <cache>/weights/<file>.
std::string weights_target(const Card& card);
// $HF_ENDPOINT/<repo>/resolve/<revision>/<path_in_repo>, else the card's url ("" when neither).
std::string download_url(const Card& card);
bool offline();  // SAPIENS_SEG_OFFLINE=1 or HF_HUB_OFFLINE=1

// Checks `path` against the card: the stamp when it matches the file's size, mtime and inode,
// else a fresh hash (always with `rehash`), which then gets a stamp. A mismatch throws
// Error(kChecksumMismatch) with both hashes; a card without a pinned hash needs
// allow_unverified and logs the computed hash. Returns the hash.
std::string verify_weights(const Card& card, const std::string& path, const GateOptions& gate,
                           bool rehash = false);

// Forgets the verification stamp of `path`.
void remove_stamp(const std::string& path);

// find_weights, else (unless offline) a download into the cache; then verify_weights.
struct Verified {
  std::string path, sha256;
};
Verified obtain_weights(const Card& card, const GateOptions& gate, const FetchOptions& fetch);

}  // namespace sapiens_seg::io
