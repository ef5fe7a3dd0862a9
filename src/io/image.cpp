#include "image.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>  // cvtColor

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::io {
namespace {

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
  std::vector<std::uint8_t> bytes(size);
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size))) {
    throw Error(ErrorCode::kIo, "cannot read image " + path + ": " + std::strerror(errno));
  }
  return bytes;
}

// libjpeg decodes a cut-off JPEG with only a warning and fills the rest with grey; a
// segmentation of half an image is worse than an error, so look for the end-of-image marker.
bool jpeg_truncated(const std::vector<std::uint8_t>& b) {
  if (b.size() < 4 || b[0] != 0xFF || b[1] != 0xD8) return false;  // not a JPEG
  const std::size_t from = b.size() > 4096 ? b.size() - 4096 : 2;
  for (std::size_t i = b.size() - 1; i > from; --i) {
    if (b[i - 1] == 0xFF && b[i] == 0xD9) return false;
  }
  return true;
}

}  // namespace

void check_size(int height, int width, const std::string& what, int min_side) {
  if (height < min_side || width < min_side) {
    throw Error(ErrorCode::kInvalidInput,
                what + " is " + std::to_string(width) + "x" + std::to_string(height) +
                    " (WxH); both sides must be at least " + std::to_string(min_side) + " pixels");
  }
  if (static_cast<std::int64_t>(height) * width > kMaxPixels) {
    throw Error(ErrorCode::kInvalidInput, what + " is " + std::to_string(width) + "x" +
                                              std::to_string(height) +
                                              ", above the limit of 268 megapixels");
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

cv::Mat decode_bytes(const std::vector<std::uint8_t>& bytes, const std::string& what) {
  if (bytes.empty()) throw Error(ErrorCode::kInvalidInput, what + " is empty (0 bytes)");
  if (jpeg_truncated(bytes)) {
    throw Error(ErrorCode::kInvalidInput,
                "cannot decode " + what + ": truncated JPEG (no end-of-image marker)");
  }
  cv::Mat bgr;
  try {
    const cv::Mat buf(1, static_cast<int>(bytes.size()), CV_8U,
                      const_cast<std::uint8_t*>(bytes.data()));
    bgr = cv::imdecode(buf, cv::IMREAD_COLOR);
  } catch (const cv::Exception& e) {
    throw Error(ErrorCode::kInvalidInput, "cannot decode " + what + ": " + e.what());
  }
  if (bgr.empty()) {
    throw Error(ErrorCode::kInvalidInput,
                "cannot decode " + what + ": unsupported format or corrupt data");
  }
  check_size(bgr.rows, bgr.cols, what);
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return rgb;
}

cv::Mat decode_file(const std::string& path) {
  return decode_bytes(read_all(path), path);
}

cv::Mat wrap_view(const ImageView& v, const std::string& what, int min_side) {
  if (v.data == nullptr) throw Error(ErrorCode::kInvalidInput, what + ": null pixel pointer");
  check_size(v.height, v.width, what, min_side);
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
