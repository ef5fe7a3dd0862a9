// Image decoding (OpenCV; the resizes are the library's own: core/resize/). Images travel as 8-bit
// RGB cv::Mat inside the library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "sapiens_seg/model.hpp"

namespace sapiens_seg::io {

constexpr int kMinSide = 32;                    // smaller images carry no usable person
constexpr std::int64_t kMaxPixels = 1LL << 28;  // 268 MP: far past any camera, bounds memory

// Decodes like cv2.imread(path) of the opencv-python 5.0 wheel in the authors' demo (IMREAD_COLOR:
// EXIF orientation applied, grey replicated, alpha dropped, 16-bit reduced to its high byte),
// then converts BGR to RGB. `what` names the image in error messages. Throws Error(kNotFound /
// kIo / kInvalidInput / kOutOfMemory). Files and bytes go through the same checks, in this order
// and before any pixel is decoded: a regular file (a FIFO, socket, device or directory is refused
// without being opened), at most 2 GiB of encoded data, a supported format whose header gives
// the dimensions (image_header.hpp, which also bounds a JPEG's coefficient buffers by its size),
// both sides >= kMinSide and at most `max_pixels`, and for JPEG all of the data up to the
// end-of-image marker present. Then OpenCV decodes it (orientation ignored: the library applies
// the EXIF orientation itself, for JPEG, PNG and WebP, so the result does not depend on which
// OpenCV is linked), and the decoded size must be the header's.
//
// Memory: the pixels are decoded straight into the result's buffer and turned to RGB in place,
// so the peak is the encoded bytes plus one image (two during an EXIF quarter turn).
//
// The decoder's warnings for a file that is still decoded (libjpeg's "Corrupt JPEG data: ...",
// libpng's) are logged and returned in Image::warnings / `warnings`.
Image decode_image(const std::uint8_t* data, std::size_t size, const std::string& what,
                   std::int64_t max_pixels = kMaxPixels);
Image decode_image_file(const std::string& path);
// What the header says (format, size after the EXIF orientation), without decoding a pixel: the
// checks decode_image makes before decoding, except the size limits.
ImageInfo image_info(const std::uint8_t* data, std::size_t size, const std::string& what);
ImageInfo image_info_file(const std::string& path);
// The same decode as a cv::Mat (tests, fuzzing).
cv::Mat decode_file(const std::string& path, std::vector<std::string>* warnings = nullptr);
cv::Mat decode_bytes(const std::vector<std::uint8_t>& bytes, const std::string& what,
                     std::vector<std::string>* warnings = nullptr);
cv::Mat decode_bytes(const std::uint8_t* data, std::size_t size, const std::string& what,
                     std::int64_t max_pixels, std::vector<std::string>* warnings = nullptr);
// Any 8/16-bit grey, BGR or BGRA cv::Mat to RGB8 by the same rules.
cv::Mat to_rgb8(const cv::Mat& bgr_like, const std::string& what);
// Wraps an RGB view without copying (both sides at least `min_side`).
cv::Mat wrap_view(const ImageView& view, const std::string& what, int min_side = kMinSide);
// Any input kind as an RGB8 image: `rgb` views either the caller's pixels or `decoded`.
struct LoadedInput {
  Image decoded;  // files and encoded bytes
  cv::Mat rgb;
};
LoadedInput load_input(const Input& input, const std::string& what);

void check_size(std::int64_t height, std::int64_t width, const std::string& what,
                std::int64_t max_pixels = kMaxPixels, int min_side = kMinSide);

}  // namespace sapiens_seg::io
