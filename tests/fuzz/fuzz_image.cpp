// libFuzzer target for image input (io::decode_bytes: format sniffing, each format's header
// read by its library, the size limits, JPEG completeness, OpenCV's decode with EXIF
// orientation). Any input either decodes to an 8-bit RGB image whose size is within the limits
// and equals the header's (up to an EXIF quarter turn), or throws sapiens_seg::Error with
// kInvalidInput (or kOutOfMemory); anything else (a crash, another exception, a sanitizer
// report, a header that disagrees with the decoder) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include <opencv2/core.hpp>

#include "io/image.hpp"
#include "io/image_header.hpp"
#include "sapiens_seg/error.hpp"

namespace {
// A lower limit than the library's 268 MP keeps every execution fast; the checks are the same.
constexpr std::int64_t kFuzzMaxPixels = 1 << 20;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cv::setNumThreads(0);  // one thread: reproducible, and no pool to start per run
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sapiens_seg;
  try {
    const cv::Mat rgb = io::decode_bytes(data, size, "fuzz", kFuzzMaxPixels);
    const io::ImageHeader h = io::read_image_header(data, size, "fuzz");
    const bool same = (rgb.cols == h.width && rgb.rows == h.height) ||
                      (rgb.cols == h.height && rgb.rows == h.width);
    if (!same || rgb.type() != CV_8UC3 || rgb.rows < io::kMinSide || rgb.cols < io::kMinSide ||
        static_cast<std::int64_t>(rgb.rows) * rgb.cols > kFuzzMaxPixels) {
      std::abort();
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidInput && e.code() != ErrorCode::kOutOfMemory) std::abort();
  }
  return 0;
}
