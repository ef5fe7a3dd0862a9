// The public image functions: decoding (the IO layer's), the header probe, the overlay, and the
// Result's foreground mask.
#include <opencv2/core.hpp>

#include "../io/image.hpp"
#include "sapiens_seg/model.hpp"
#include "sapiens_seg/version.hpp"

namespace sapiens_seg {

std::vector<std::uint8_t> Result::foreground() const {
  std::vector<std::uint8_t> fg(labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) fg[i] = labels[i] != 0 ? 1 : 0;
  return fg;
}

const char* version() noexcept {
  return SAPIENS_SEG_VERSION;
}

Image read_image(const std::string& path) {
  try {
    return io::decode_image_file(path);
  } catch (...) {
    throw as_error(std::current_exception(), "reading " + path);
  }
}

Image read_image(const std::vector<std::uint8_t>& encoded) {
  try {
    return io::decode_image(encoded.data(), encoded.size(), "encoded image");
  } catch (...) {
    throw as_error(std::current_exception(), "reading an encoded image");
  }
}

ImageInfo read_image_info(const std::uint8_t* data, std::size_t size) {
  try {
    return io::image_info(data, size, "encoded image");
  } catch (...) {
    throw as_error(std::current_exception(), "reading an image header");
  }
}

ImageInfo read_image_info(const std::string& path) {
  try {
    return io::image_info_file(path);
  } catch (...) {
    throw as_error(std::current_exception(), "reading the header of " + path);
  }
}

namespace {
Image overlay_unguarded(const Result& result, ImageView image, float opacity) {
  if (image.height != result.height || image.width != result.width) {
    throw Error(ErrorCode::kInvalidInput, "overlay: the image is " + std::to_string(image.width) +
                                              "x" + std::to_string(image.height) +
                                              " but the result is " + std::to_string(result.width) +
                                              "x" + std::to_string(result.height));
  }
  if (!(opacity >= 0.0f && opacity <= 1.0f)) {
    throw Error(ErrorCode::kInvalidInput, "overlay: opacity must be in [0, 1]");
  }
  const cv::Mat src = io::wrap_view(image, "overlay image");
  Image out;
  out.height = image.height;
  out.width = image.width;
  out.rgb.resize(static_cast<std::size_t>(out.height) * out.width * 3);
  for (int y = 0; y < out.height; ++y) {
    const std::uint8_t* s = src.ptr<std::uint8_t>(y);
    std::uint8_t* d = out.rgb.data() + static_cast<std::size_t>(y) * out.width * 3;
    const std::uint8_t* l = result.labels.data() + static_cast<std::size_t>(y) * out.width;
    for (int x = 0; x < out.width; ++x) {
      const auto& c = result.palette.at(l[x]);
      for (int ch = 0; ch < 3; ++ch) {
        d[3 * x + ch] =
            static_cast<std::uint8_t>(static_cast<float>(s[3 * x + ch]) * (1.0f - opacity) +
                                      static_cast<float>(c[ch]) * opacity);
      }
    }
  }
  return out;
}
}  // namespace

Image overlay(const Result& result, ImageView image, float opacity) {
  try {
    return overlay_unguarded(result, image, opacity);
  } catch (...) {
    throw as_error(std::current_exception(), "overlay");
  }
}

}  // namespace sapiens_seg
