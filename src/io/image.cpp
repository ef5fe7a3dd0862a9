#include "image.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>  // cvtColor

#include "image_header.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::io {
namespace {

// cv::imdecode takes the encoded bytes as a Mat of int columns.
constexpr std::size_t kMaxEncodedBytes = static_cast<std::size_t>(std::numeric_limits<int>::max());

std::vector<std::uint8_t> read_all(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw Error(ErrorCode::kNotFound, "image not found: " + path);
  }
  if (std::filesystem::is_directory(path, ec)) {
    throw Error(ErrorCode::kInvalidInput, "image path is a directory: " + path);
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(ErrorCode::kIo, "cannot open image " + path + ": " + std::strerror(errno));
  const auto size = static_cast<std::size_t>(in.tellg());
  if (size > kMaxEncodedBytes) {
    throw Error(ErrorCode::kInvalidInput, "cannot decode " + path + ": the file has " +
                                              std::to_string(size) +
                                              " bytes, above the decoder's limit of 2 GiB");
  }
  std::vector<std::uint8_t> bytes;
  try {
    bytes.resize(size);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kOutOfMemory,
                "out of memory reading " + path + " (" + std::to_string(size) + " bytes)");
  }
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size))) {
    throw Error(ErrorCode::kIo, "cannot read image " + path + ": " + std::strerror(errno));
  }
  return bytes;
}

// OpenCV reports a failed allocation as cv::Exception(StsNoMem).
[[noreturn]] void rethrow_cv(const cv::Exception& e, const std::string& what) {
  if (e.code == cv::Error::StsNoMem) {
    throw Error(ErrorCode::kOutOfMemory, "out of memory decoding " + what + ": " + e.what());
  }
  throw Error(ErrorCode::kInvalidInput, "cannot decode " + what + ": " + e.what());
}

std::string size_text(std::int64_t width, std::int64_t height) {
  return std::to_string(width) + "x" + std::to_string(height);
}

}  // namespace

void check_size(std::int64_t height, std::int64_t width, const std::string& what,
                std::int64_t max_pixels, int min_side) {
  if (height < min_side || width < min_side) {
    throw Error(ErrorCode::kInvalidInput, what + " is " + size_text(width, height) +
                                              " (WxH); both sides must be at least " +
                                              std::to_string(min_side) + " pixels");
  }
  // Divided, not multiplied: TIFF sides are 32-bit unsigned, and two of them (a fuzzed header
  // had 4204798202 x 3531800632) overflow a 64-bit product.
  if (width > max_pixels / height) {
    throw Error(ErrorCode::kInvalidInput,
                what + " is " + size_text(width, height) + ", above the limit of " +
                    (max_pixels == kMaxPixels ? std::string("268 megapixels")
                                              : std::to_string(max_pixels) + " pixels"));
  }
}

cv::Mat to_rgb8(const cv::Mat& m, const std::string& what) {
  if (m.empty()) throw Error(ErrorCode::kInvalidInput, what + " is empty");
  cv::Mat eight = m;
  if (m.depth() == CV_16U) {
    m.convertTo(eight, CV_8U, 1.0 / 256.0);
  } else if (m.depth() != CV_8U) {
    throw Error(ErrorCode::kInvalidInput, what + ": only 8- and 16-bit images are supported");
  }
  cv::Mat rgb;
  switch (eight.channels()) {
    case 1:
      cv::cvtColor(eight, rgb, cv::COLOR_GRAY2RGB);
      break;
    case 3:
      cv::cvtColor(eight, rgb, cv::COLOR_BGR2RGB);
      break;
    case 4:
      cv::cvtColor(eight, rgb, cv::COLOR_BGRA2RGB);
      break;
    default:
      throw Error(ErrorCode::kInvalidInput,
                  what + " has " + std::to_string(eight.channels()) + " channels (1, 3 or 4)");
  }
  return rgb;
}

cv::Mat decode_bytes(const std::uint8_t* data, std::size_t size, const std::string& what,
                     std::int64_t max_pixels) {
  if (size == 0) throw Error(ErrorCode::kInvalidInput, what + " is empty (0 bytes)");
  if (size > kMaxEncodedBytes) {
    throw Error(ErrorCode::kInvalidInput, "cannot decode " + what + ": " + std::to_string(size) +
                                              " bytes, above the decoder's limit of 2 GiB");
  }
  // Refused before a single pixel is decoded: a few kilobytes can describe gigapixels.
  const ImageHeader header = read_image_header(data, size, what);
  check_size(header.height, header.width, what, max_pixels);
  if (header.format == ImageFormat::kJpeg) check_jpeg_complete(data, size, what);
  cv::Mat rgb;
  try {
    const cv::Mat buf(1, static_cast<int>(size), CV_8U, const_cast<std::uint8_t*>(data));
    const cv::Mat bgr = cv::imdecode(buf, cv::IMREAD_COLOR);
    if (bgr.empty()) {
      throw Error(ErrorCode::kInvalidInput,
                  "cannot decode " + what + ": corrupt " + format_name(header.format) + " data");
    }
    // The decoder must have decoded the image whose header was checked (EXIF orientation may
    // swap the sides).
    const bool same = (bgr.cols == header.width && bgr.rows == header.height) ||
                      (bgr.cols == header.height && bgr.rows == header.width);
    if (!same) {
      throw Error(ErrorCode::kInvalidInput,
                  "cannot decode " + what + ": its " + format_name(header.format) +
                      " header says " + size_text(header.width, header.height) +
                      " but the decoder produced " + size_text(bgr.cols, bgr.rows));
    }
    cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  } catch (const cv::Exception& e) {
    rethrow_cv(e, what);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kOutOfMemory, "out of memory decoding " + what + " (" +
                                             size_text(header.width, header.height) + ")");
  }
  return rgb;
}

cv::Mat decode_bytes(const std::vector<std::uint8_t>& bytes, const std::string& what) {
  return decode_bytes(bytes.data(), bytes.size(), what, kMaxPixels);
}

cv::Mat decode_file(const std::string& path) {
  return decode_bytes(read_all(path), path);
}

cv::Mat wrap_view(const ImageView& v, const std::string& what, int min_side) {
  if (v.data == nullptr) throw Error(ErrorCode::kInvalidInput, what + ": null pixel pointer");
  check_size(v.height, v.width, what, kMaxPixels, min_side);
  const std::size_t stride = v.stride ? v.stride : static_cast<std::size_t>(v.width) * 3;
  if (stride < static_cast<std::size_t>(v.width) * 3) {
    throw Error(ErrorCode::kInvalidInput, what + ": stride is smaller than width * 3");
  }
  return cv::Mat(v.height, v.width, CV_8UC3, const_cast<std::uint8_t*>(v.data), stride);
}

cv::Mat load_input(const Input& input, const std::string& what) {
  switch (input.kind()) {
    case Input::Kind::kFile:
      return decode_file(input.path());
    case Input::Kind::kEncoded:
      return decode_bytes(input.bytes(), what);
    case Input::Kind::kRgb:
      return wrap_view(input.view(), what);
  }
  throw Error(ErrorCode::kInternal, "unknown input kind");
}

}  // namespace sapiens_seg::io

namespace sapiens_seg {

Input Input::file(std::string path) {
  Input in;
  in.kind_ = Kind::kFile;
  in.path_ = std::move(path);
  return in;
}

Input Input::encoded(std::vector<std::uint8_t> bytes) {
  Input in;
  in.kind_ = Kind::kEncoded;
  in.bytes_ = std::make_shared<const std::vector<std::uint8_t>>(std::move(bytes));
  return in;
}

Input Input::rgb(ImageView view) {
  Input in;
  in.kind_ = Kind::kRgb;
  in.view_ = view;
  return in;
}

Input Input::rgb_copy(ImageView view) {
  const cv::Mat src = io::wrap_view(view, "RGB image");
  auto pixels = std::make_shared<std::vector<std::uint8_t>>(src.total() * 3);
  cv::Mat dst(src.rows, src.cols, CV_8UC3, pixels->data());
  src.copyTo(dst);
  Input in;
  in.kind_ = Kind::kRgb;
  in.view_ = ImageView{pixels->data(), view.height, view.width, 0};
  in.bytes_ = std::move(pixels);
  return in;
}

const std::vector<std::uint8_t>& Input::bytes() const noexcept {
  static const std::vector<std::uint8_t> empty;
  return bytes_ ? *bytes_ : empty;
}

}  // namespace sapiens_seg
