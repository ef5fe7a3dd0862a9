// Resumable, verified HTTP(S) downloads with libcurl.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "sapiens_seg/weights.hpp"

namespace sapiens_seg::io {

struct DownloadRequest {
  std::string url;
  std::string dest;  // final path; the transfer goes to dest + ".part" and is renamed when verified
  std::optional<std::uint64_t> size;
  std::optional<std::string> sha256;  // nullopt: the computed hash is returned, not checked
  std::string label;                  // the file name shown in progress and messages
  ProgressCallback progress;          // empty: no progress reports
  const std::atomic<bool>* cancel = nullptr;
  bool use_hf_token = false;
};

struct DownloadResult {
  std::string sha256;
  bool transferred = false;  // false when another process finished the file while we waited
};

// Holds dest + ".lock" (flock) for the whole transfer so concurrent processes never write the
// same file: a second one waits, then finds the finished file. Resumes dest + ".part" with a
// Range request (checking for 206, restarting from zero when the server ignores ranges), retries
// network errors and 5xx with back-off, and hashes while writing. Nothing reaches `dest` unless
// its size and SHA-256 match. Throws Error(kDownloadFailed / kChecksumMismatch / kIo).
DownloadResult download(const DownloadRequest& request);

// True for https URLs and for plain http to a loopback host (tests and local mirrors).
bool url_allowed(const std::string& url);

}  // namespace sapiens_seg::io
