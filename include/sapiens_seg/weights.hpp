// The weight store: where a model's checkpoint lives on this machine, fetching it (resumable,
// verified), verifying and removing it.
//
// Lookup order for a card's file: $SAPIENS_SEG_WEIGHTS_PATH/<file> (hand-placed files), the
// project cache <cache_dir()>/weights/<file>, the Hugging Face hub cache
// (models--ORG--NAME/snapshots/REV/<path>), then a download into the project cache from
// $HF_ENDPOINT (default https://huggingface.co). Every file is checked against the card's SHA-256
// before use; a verified file gets a stamp (size, mtime, inode, hash) so later loads skip the
// hash. SAPIENS_SEG_OFFLINE=1 or HF_HUB_OFFLINE=1 never opens a connection.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "sapiens_seg/export.hpp"

namespace sapiens_seg {

struct DownloadProgress {
  std::string file;
  std::uint64_t done = 0;   // bytes on disk, resumed bytes included
  std::uint64_t total = 0;  // 0 when unknown
  double bytes_per_second = 0;
};
// Called a few times a second while downloading; return false to cancel (the partial file is
// kept, so the next fetch resumes it).
using ProgressCallback = std::function<bool(const DownloadProgress&)>;

struct FetchOptions {
  ProgressCallback progress;  // empty: a progress bar on stderr when it is a terminal
  // Set to true (e.g. from a signal handler) to cancel; the partial file is kept.
  const std::atomic<bool>* cancel = nullptr;
  // Send $HF_TOKEN as a bearer token. Off unless asked for here or with
  // SAPIENS_SEG_USE_HF_TOKEN=1, so a token in the environment never leaves unasked.
  bool use_hf_token = false;
};

struct WeightsStatus {
  std::string id;
  std::string path;      // where the file is, or where a download would put it
  std::string location;  // "weights_path", "cache", "hf_cache" or "" when absent
  bool present = false;
  bool verified = false;   // its stamp (or a fresh hash) matches the card
  std::string sha256;      // the hash that was checked ("" when absent or not checked)
  std::uint64_t size = 0;  // the file's size in bytes (when present)
  // Why the file cannot be the card's (its size differs, its last verification failed); ""
  // when nothing is known against it.
  std::string problem;
};

// $SAPIENS_SEG_HOME, else $XDG_CACHE_HOME/sapiens-seg, else ~/.cache/sapiens-seg.
SAPIENS_SEG_API std::string cache_dir();

// Where the card's file is (no hashing beyond the stamp, no network).
SAPIENS_SEG_API WeightsStatus weights_status(const std::string& id);

// Makes the card's file present and verified, downloading it when needed. Returns its path.
// Throws Error(kOffline / kDownloadFailed / kChecksumMismatch / kIo / kNotFound).
SAPIENS_SEG_API std::string fetch(const std::string& id, const FetchOptions& options = {});

// Re-hashes the file whatever its stamp says. Throws Error(kNotFound) when absent and
// Error(kChecksumMismatch) with both hashes when it differs.
SAPIENS_SEG_API WeightsStatus verify(const std::string& id);

// Re-hashes the checkpoint at `path` and records its content in its stamp. A file named as a card's
// file is checked against that card (Error(kChecksumMismatch) when it differs); another file is
// recognised as a card's file by size and SHA-256, or else accepted as it is now: a checkpoint
// without a card is held to the hash recorded here, so this is how a file replaced on purpose is
// accepted. `id` is the card's id ("" for none), `verified` whether a pinned hash matched.
SAPIENS_SEG_API WeightsStatus verify_file(const std::string& path);

// Deletes the file, its partial download and its stamp from the project cache (never from
// SAPIENS_SEG_WEIGHTS_PATH or the Hugging Face cache). Returns false when nothing was there.
SAPIENS_SEG_API bool remove_weights(const std::string& id);

}  // namespace sapiens_seg
