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

// Decodes like cv2.imread(path) in the authors' demo (IMREAD_COLOR: EXIF orientation applied,
// grey replicated, alpha dropped, 16-bit reduced to its high byte), then converts BGR to RGB.
// `what` names the image in error messages. Throws Error(kNotFound / kIo / kInvalidInput).
// Files and bytes go through the same checks, in this order and before any pixel is decoded:
// at most 2 GiB of encoded data, a supported format whose header gives the dimensions
// (image_header.hpp), both sides >= kMinSide and at most `max_pixels`, and for JPEG all of the
// data up to the end-of-image marker present. Then OpenCV decodes it, and the decoded size must
// be the header's. Allocation failures are Error(kOutOfMemory).
cv::Mat decode_file(const std::string& path);
cv::Mat decode_bytes(const std::vector<std::uint8_t>& bytes, const std::string& what);
cv::Mat decode_bytes(const std::uint8_t* data, std::size_t size, const std::string& what,
                     std::int64_t max_pixels);
// Any 8/16-bit grey, BGR or BGRA cv::Mat to RGB8 by the same rules.
cv::Mat to_rgb8(const cv::Mat& bgr_like, const std::string& what);
// Wraps an RGB view without copying (both sides at least `min_side`).
cv::Mat wrap_view(const ImageView& view, const std::string& what, int min_side = kMinSide);
// Any input kind to an RGB8 image.
cv::Mat load_input(const Input& input, const std::string& what);

void check_size(std::int64_t height, std::int64_t width, const std::string& what,
                std::int64_t max_pixels = kMaxPixels, int min_side = kMinSide);

}  // namespace sapiens_seg::io
