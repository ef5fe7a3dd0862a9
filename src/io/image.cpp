#include "image.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>  // cvtColor

#include "../core/checkpoint/mapped_file.hpp"
#include "image_header.hpp"
#include "log.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::io {
namespace {

// cv::imdecode takes the encoded bytes as a Mat of int columns.
constexpr std::size_t kMaxEncodedBytes = static_cast<std::size_t>(std::numeric_limits<int>::max());

std::vector<std::uint8_t> read_all(const std::string& path) {
  // Refused before any open(): a FIFO would block until a writer came, a device may do
  // something on open.
  core::check_regular_file(path, "image");
  // O_NONBLOCK in case the path became a FIFO since the check; the fstat refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR)
      throw Error(ErrorCode::kNotFound, "image not found: " + path);
    throw Error(ErrorCode::kIo, "cannot open image " + path + ": " + std::strerror(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw Error(ErrorCode::kIo, "cannot stat image " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) core::check_regular_file(path, "image");  // says what it is now
  const auto size = static_cast<std::size_t>(st.st_size);
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
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, bytes.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw Error(ErrorCode::kIo, "cannot read image " + path + ": " + std::strerror(errno));
    if (n == 0) break;  // cut short since the fstat: decoded as the shorter file it now is
    done += static_cast<std::size_t>(n);
  }
  bytes.resize(done);
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

namespace {

// BGR to RGB in place (cv::cvtColor makes no promise about a destination that is its source).
void swap_red_blue(cv::Mat& m) {
  for (int y = 0; y < m.rows; ++y) {
    std::uint8_t* p = m.ptr<std::uint8_t>(y);
    for (int x = 0; x < m.cols; ++x, p += 3) std::swap(p[0], p[2]);
  }
}

// cv::flip codes for EXIF orientations 2-4 and, after a transpose, 5-8 (the EXIF 2.3 table, as
// OpenCV's ApplyExifOrientation and Pillow's exif_transpose read it). 2 means none.
int flip_code(int orientation) {
  switch (orientation) {
    case 2:
    case 6:
      return 1;  // left-right
    case 3:
    case 7:
      return -1;  // both
    case 4:
    case 8:
      return 0;  // top-bottom
    default:
      return 2;
  }
}

// The decode, into 8-bit 3-channel buffers that `alloc(height, width)` hands out (one, or two for
// an EXIF quarter turn); returns the one holding the image.
template <typename Alloc>
cv::Mat decode_into(const std::uint8_t* data, std::size_t size, const std::string& what,
                    std::int64_t max_pixels, Alloc&& alloc, std::vector<std::string>& warnings) {
  if (size == 0) throw Error(ErrorCode::kInvalidInput, what + " is empty (0 bytes)");
  if (size > kMaxEncodedBytes) {
    throw Error(ErrorCode::kInvalidInput, "cannot decode " + what + ": " + std::to_string(size) +
                                              " bytes, above the decoder's limit of 2 GiB");
  }
  // Refused before a single pixel is decoded: a few kilobytes can describe gigapixels.
  ImageHeader header = read_image_header(data, size, what);
  check_size(header.height, header.width, what, max_pixels);
  check_jpeg_data_size(header, size, what);
  warnings = std::move(header.warnings);
  if (header.format == ImageFormat::kJpeg) {
    for (auto& w : check_jpeg_complete(data, size, what)) warnings.push_back(std::move(w));
  }
  const int height = static_cast<int>(header.height), width = static_cast<int>(header.width);
  try {
    cv::Mat target = alloc(height, width);
    cv::Mat bgr = target;
    const cv::Mat buf(1, static_cast<int>(size), CV_8U, const_cast<std::uint8_t*>(data));
    cv::imdecode(buf, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION, &bgr);
    if (bgr.empty()) {
      throw Error(ErrorCode::kInvalidInput,
                  "cannot decode " + what + ": corrupt " + format_name(header.format) + " data");
    }
    // The decoder must have decoded the image whose header was checked; libtiff may have turned
    // a TIFF by its own orientation tag, swapping the sides.
    const bool same = bgr.cols == width && bgr.rows == height;
    if (!same && !(bgr.cols == height && bgr.rows == width)) {
      throw Error(ErrorCode::kInvalidInput,
                  "cannot decode " + what + ": its " + format_name(header.format) +
                      " header says " + size_text(width, height) + " but the decoder produced " +
                      size_text(bgr.cols, bgr.rows));
    }
    if (bgr.data != target.data || bgr.type() != CV_8UC3) {
      // The decoder allocated its own (other sides): moved into a buffer of ours.
      cv::Mat own = alloc(bgr.rows, bgr.cols);
      bgr.convertTo(own, CV_8UC3);
      bgr = own;
    }
    target.release();
    swap_red_blue(bgr);
    const int o = header.orientation;
    if (o >= 2 && o <= 4) {
      cv::flip(bgr, bgr, flip_code(o));  // row and pixel swaps: in place
    } else if (o >= 5 && o <= 8) {
      cv::Mat turned = alloc(bgr.cols, bgr.rows);
      cv::transpose(bgr, turned);
      bgr.release();
      if (o != 5) cv::flip(turned, turned, flip_code(o));
      bgr = turned;
    }
    for (const auto& w : warnings) log(Level::kWarn, what + ": " + w);
    return bgr;
  } catch (const cv::Exception& e) {
    rethrow_cv(e, what);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kOutOfMemory,
                "out of memory decoding " + what + " (" + size_text(width, height) + ")");
  }
}

}  // namespace

Image decode_image(const std::uint8_t* data, std::size_t size, const std::string& what,
                   std::int64_t max_pixels) {
  // At most two buffers (a quarter turn needs a second); the image ends in the last one.
  std::vector<std::uint8_t> buffers[2];
  int used = 0;
  const auto alloc = [&](int h, int w) {
    if (used == 2) throw Error(ErrorCode::kInternal, "decode_image: a third buffer");
    std::vector<std::uint8_t>& b = buffers[used++];
    b.resize(static_cast<std::size_t>(h) * static_cast<std::size_t>(w) * 3);
    return cv::Mat(h, w, CV_8UC3, b.data());
  };
  Image img;
  const cv::Mat m = decode_into(data, size, what, max_pixels, alloc, img.warnings);
  for (auto& b : buffers) {
    if (!b.empty() && b.data() == m.data) img.rgb = std::move(b);
  }
  if (img.rgb.empty()) throw Error(ErrorCode::kInternal, "decode_image lost its buffer");
  img.height = m.rows;
  img.width = m.cols;
  return img;
}

Image decode_image_file(const std::string& path) {
  const std::vector<std::uint8_t> bytes = read_all(path);
  return decode_image(bytes.data(), bytes.size(), path, kMaxPixels);
}

ImageInfo image_info(const std::uint8_t* data, std::size_t size, const std::string& what) {
  if (size == 0) throw Error(ErrorCode::kInvalidInput, what + " is empty (0 bytes)");
  const ImageHeader header = read_image_header(data, size, what);
  ImageInfo info;
  info.format = format_name(header.format);
  const bool turned = header.orientation >= 5 && header.orientation <= 8;
  const std::int64_t h = turned ? header.width : header.height;
  const std::int64_t w = turned ? header.height : header.width;
  constexpr std::int64_t kMaxSide = std::numeric_limits<int>::max();
  info.height = static_cast<int>(std::min(h, kMaxSide));
  info.width = static_cast<int>(std::min(w, kMaxSide));
  return info;
}

ImageInfo image_info_file(const std::string& path) {
  const std::vector<std::uint8_t> bytes = read_all(path);
  return image_info(bytes.data(), bytes.size(), path);
}

cv::Mat decode_bytes(const std::uint8_t* data, std::size_t size, const std::string& what,
                     std::int64_t max_pixels, std::vector<std::string>* warnings) {
  std::vector<std::string> kept;
  const auto alloc = [](int h, int w) { return cv::Mat(h, w, CV_8UC3); };
  cv::Mat m = decode_into(data, size, what, max_pixels, alloc, kept);
  if (warnings) *warnings = std::move(kept);
  return m;
}

cv::Mat decode_bytes(const std::vector<std::uint8_t>& bytes, const std::string& what,
                     std::vector<std::string>* warnings) {
  return decode_bytes(bytes.data(), bytes.size(), what, kMaxPixels, warnings);
}

cv::Mat decode_file(const std::string& path, std::vector<std::string>* warnings) {
  const std::vector<std::uint8_t> bytes = read_all(path);
  return decode_bytes(bytes.data(), bytes.size(), path, kMaxPixels, warnings);
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

LoadedInput load_input(const Input& input, const std::string& what) {
  LoadedInput in;
  switch (input.kind()) {
    case Input::Kind::kFile:
      in.decoded = decode_image_file(input.path());
      break;
    case Input::Kind::kEncoded:
      in.decoded = decode_image(input.bytes().data(), input.bytes().size(), what);
      break;
    case Input::Kind::kRgb:
      in.rgb = wrap_view(input.view(), what);
      return in;
  }
  in.rgb = cv::Mat(in.decoded.height, in.decoded.width, CV_8UC3, in.decoded.rgb.data());
  return in;
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
