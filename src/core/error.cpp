#include "sapiens_seg/error.hpp"

namespace sapiens_seg {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kChecksumMismatch:
      return "checksum_mismatch";
    case ErrorCode::kDownloadFailed:
      return "download_failed";
    case ErrorCode::kOffline:
      return "offline";
    case ErrorCode::kLicenseNotAccepted:
      return "license_not_accepted";
    case ErrorCode::kBackendUnavailable:
      return "backend_unavailable";
    case ErrorCode::kInvalidInput:
      return "invalid_input";
    case ErrorCode::kFormatError:
      return "format_error";
    case ErrorCode::kIo:
      return "io_error";
    case ErrorCode::kInternal:
      return "internal_error";
    case ErrorCode::kOutOfMemory:
      return "out_of_memory";
  }
  return "unknown";
}

}  // namespace sapiens_seg
