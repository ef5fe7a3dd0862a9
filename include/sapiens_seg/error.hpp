// One exception type for the whole library; the code says what kind of failure it was so callers
// (and the CLI's exit status, and the Python exception classes) can branch on it.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

#include "sapiens_seg/export.hpp"

namespace sapiens_seg {

enum class ErrorCode : int {
  kNotFound = 1,            // weights, card or input file not found
  kChecksumMismatch = 2,    // SHA-256 of a weights file differs from its card
  kDownloadFailed = 3,      // network or server failure while fetching weights
  kOffline = 4,             // the file is needed but offline mode forbids fetching it
  kLicenseNotAccepted = 5,  // non-commercial weights without explicit acceptance
  kBackendUnavailable = 6,  // the requested mode/device/dtype cannot run here
  kInvalidInput = 7,        // bad image, bad argument, wrong size
  kFormatError = 8,         // malformed checkpoint or card
  kIo = 9,                  // cannot read or write a file (permissions, disk full)
  kInternal = 10,           // a bug: please report it
  kOutOfMemory = 11,        // an allocation failed (host memory, CUDA memory, a thread)
};

// Stable lower-case name of a code ("checksum_mismatch", ...), used in logs and JSON.
SAPIENS_SEG_API std::string_view to_string(ErrorCode code) noexcept;

class SAPIENS_SEG_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// The exception `e` as an Error: an Error unchanged; an allocation failure (std::bad_alloc,
// LibTorch's out-of-memory errors on the CPU and on CUDA, OpenCV's, a thread that cannot start)
// as kOutOfMemory; anything else as kInternal. `context` ("segmenting 8 images") starts the
// message of a converted exception. Used where the library, the CLI and the Python binding must
// never let a foreign exception through.
SAPIENS_SEG_API Error as_error(const std::exception_ptr& e, const std::string& context);

}  // namespace sapiens_seg
