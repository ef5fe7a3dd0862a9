// Real-world image input: dimensions read from each format's header before decoding (so
// decompression bombs are refused cheaply), JPEG completeness by libjpeg itself (phone "motion
// photos" with trailing data pass, truncated files do not), and the encoded-size limit.
#include <gtest/gtest.h>
#include <zlib.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "io/image.hpp"
#include "io/image_header.hpp"
#include "sapiens_seg/error.hpp"
#include "test_util.hpp"

using namespace sapiens_seg;
namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

using sapiens_seg::test::expect_error;

namespace {

Bytes encode(const cv::Mat& m, const std::string& ext, std::vector<int> params = {}) {
  Bytes buf;
  EXPECT_TRUE(cv::imencode(ext, m, buf, params)) << ext;
  return buf;
}

// A smooth picture (JPEG-friendly) with some noise.
cv::Mat picture(int h, int w, int type = CV_8UC3) {
  cv::Mat m(h, w, type);
  cv::randu(m, 0, 40);
  cv::Mat ramp(h, w, type);
  for (int y = 0; y < h; ++y) ramp.row(y).setTo(cv::Scalar::all((y * 200) / h));
  return m + ramp;
}

io::ImageHeader header(const Bytes& b) {
  return io::read_image_header(b.data(), b.size(), "test");
}

void put32be(Bytes& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(v >> s));
}
void put32le(Bytes& b, std::uint32_t v) {
  for (int s = 0; s <= 24; s += 8) b.push_back(static_cast<std::uint8_t>(v >> s));
}
void put16le(Bytes& b, std::uint16_t v) {
  b.push_back(static_cast<std::uint8_t>(v));
  b.push_back(static_cast<std::uint8_t>(v >> 8));
}

void png_chunk(Bytes& b, const char* type, const Bytes& data) {
  put32be(b, static_cast<std::uint32_t>(data.size()));
  Bytes body(type, type + 4);
  body.insert(body.end(), data.begin(), data.end());
  b.insert(b.end(), body.begin(), body.end());
  put32be(b, static_cast<std::uint32_t>(crc32(0, body.data(), static_cast<uInt>(body.size()))));
}

// A PNG whose IHDR says w x h RGB, followed by a few compressed rows: a decoder that trusts it
// allocates w * h * 3 bytes before it finds out the data is short.
Bytes png_claiming(std::uint32_t w, std::uint32_t h) {
  Bytes b = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  Bytes ihdr;
  put32be(ihdr, w);
  put32be(ihdr, h);
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});
  png_chunk(b, "IHDR", ihdr);
  const Bytes rows(3 * (w * 3 + 1), 0);
  uLongf n = compressBound(static_cast<uLong>(rows.size()));
  Bytes z(n);
  compress2(z.data(), &n, rows.data(), static_cast<uLong>(rows.size()), 9);
  z.resize(n);
  png_chunk(b, "IDAT", z);
  png_chunk(b, "IEND", {});
  return b;
}

// A real JPEG with the frame header (SOF0) patched to say w x h.
Bytes jpeg_claiming(std::uint16_t w, std::uint16_t h) {
  Bytes b = encode(picture(64, 64), ".jpg");
  for (std::size_t i = 2; i + 9 < b.size(); ++i) {
    if (b[i] == 0xFF && b[i + 1] == 0xC0) {
      b[i + 5] = static_cast<std::uint8_t>(h >> 8);
      b[i + 6] = static_cast<std::uint8_t>(h);
      b[i + 7] = static_cast<std::uint8_t>(w >> 8);
      b[i + 8] = static_cast<std::uint8_t>(w);
      return b;
    }
  }
  ADD_FAILURE() << "no SOF0 in the encoded JPEG";
  return b;
}

Bytes bmp_claiming(std::int32_t w, std::int32_t h) {
  Bytes b = {'B', 'M'};
  put32le(b, 54 + 16);  // file size (a lie the header check does not need)
  put32le(b, 0);
  put32le(b, 54);  // pixel data offset
  put32le(b, 40);  // BITMAPINFOHEADER
  put32le(b, static_cast<std::uint32_t>(w));
  put32le(b, static_cast<std::uint32_t>(h));
  put16le(b, 1);   // planes
  put16le(b, 24);  // bits per pixel
  for (int i = 0; i < 6; ++i) put32le(b, 0);
  b.resize(b.size() + 16, 0);
  return b;
}

// A little-endian TIFF with one grey strip, whose directory says w x h.
Bytes tiff_claiming(std::uint32_t w, std::uint32_t h) {
  Bytes b = {'I', 'I', 42, 0};
  put32le(b, 8);  // first directory
  const std::vector<std::tuple<std::uint16_t, std::uint16_t, std::uint32_t>> tags = {
      {256, 4, w},   {257, 4, h}, {258, 3, 8}, {259, 3, 1}, {262, 3, 1},
      {273, 4, 200}, {277, 3, 1}, {278, 4, h}, {279, 4, w}};
  put16le(b, static_cast<std::uint16_t>(tags.size()));
  for (const auto& [tag, type, value] : tags) {
    put16le(b, tag);
    put16le(b, type);
    put32le(b, 1);
    if (type == 3) {
      put16le(b, static_cast<std::uint16_t>(value));
      put16le(b, 0);
    } else {
      put32le(b, value);
    }
  }
  put32le(b, 0);  // no next directory
  b.resize(256, 0);
  return b;
}

// An animated WebP's canvas can be far larger than a still image's 16383 x 16383.
Bytes webp_animation_claiming(std::uint32_t w, std::uint32_t h) {
  Bytes b = {'R', 'I', 'F', 'F'};
  put32le(b, 4 + 8 + 10);
  b.insert(b.end(), {'W', 'E', 'B', 'P', 'V', 'P', '8', 'X'});
  put32le(b, 10);
  b.insert(b.end(), {0x02, 0, 0, 0});  // flags: animation
  for (std::uint32_t v : {w - 1, h - 1}) {
    b.insert(b.end(), {static_cast<std::uint8_t>(v), static_cast<std::uint8_t>(v >> 8),
                       static_cast<std::uint8_t>(v >> 16)});
  }
  return b;
}

std::size_t find(const Bytes& b, std::initializer_list<std::uint8_t> pattern) {
  const Bytes p(pattern);
  auto it = std::search(b.begin(), b.end(), p.begin(), p.end());
  return it == b.end() ? std::string::npos : static_cast<std::size_t>(it - b.begin());
}

cv::Mat decode(const Bytes& b, const char* what = "test") {
  return io::decode_bytes(b, what);
}

double max_diff(const cv::Mat& a, const cv::Mat& b) {
  return a.size() == b.size() ? cv::norm(a, b, cv::NORM_INF) : 1e9;
}

}  // namespace

TEST(UnitImageInput, HeadersOfEveryAcceptedFormat) {
  const cv::Mat bgr = picture(45, 70), grey = picture(45, 70, CV_8UC1);
  cv::Mat bgra;
  cv::cvtColor(bgr, bgra, cv::COLOR_BGR2BGRA);
  cv::Mat deep;
  bgr.convertTo(deep, CV_16UC3, 256.0);
  struct Case {
    Bytes bytes;
    io::ImageFormat format;
  };
  const std::vector<Case> cases = {
      {encode(bgr, ".jpg"), io::ImageFormat::kJpeg},
      {encode(bgr, ".jpg", {cv::IMWRITE_JPEG_PROGRESSIVE, 1}), io::ImageFormat::kJpeg},
      {encode(grey, ".jpg"), io::ImageFormat::kJpeg},
      {encode(bgr, ".png"), io::ImageFormat::kPng},
      {encode(bgra, ".png"), io::ImageFormat::kPng},
      {encode(deep, ".png"), io::ImageFormat::kPng},
      {encode(bgr, ".webp"), io::ImageFormat::kWebp},
      {encode(bgr, ".webp", {cv::IMWRITE_WEBP_QUALITY, 101}), io::ImageFormat::kWebp},
      {encode(bgr, ".tiff"), io::ImageFormat::kTiff},
      {encode(deep, ".tiff"), io::ImageFormat::kTiff},
      {encode(bgr, ".bmp"), io::ImageFormat::kBmp},
      {encode(bgr, ".ppm"), io::ImageFormat::kPnm},
      {encode(grey, ".pgm"), io::ImageFormat::kPnm},
  };
  for (const auto& c : cases) {
    const io::ImageHeader h = header(c.bytes);
    EXPECT_EQ(h.format, c.format) << io::format_name(c.format);
    EXPECT_EQ(h.width, 70) << io::format_name(c.format);
    EXPECT_EQ(h.height, 45) << io::format_name(c.format);
    const cv::Mat rgb = decode(c.bytes);
    EXPECT_EQ(rgb.cols, 70);
    EXPECT_EQ(rgb.rows, 45);
    EXPECT_EQ(rgb.type(), CV_8UC3);
  }
}

TEST(UnitImageInput, FormatsWithoutABoundedHeaderAreRefused) {
  cv::Mat f(40, 40, CV_32FC3, cv::Scalar::all(0.5));
  for (const char* ext : {".hdr", ".pfm", ".sr"}) {
    Bytes b;
    if (!cv::imencode(ext, ext == std::string(".sr") ? picture(40, 40) : f, b)) continue;
    expect_error([&] { decode(b); }, ErrorCode::kInvalidInput,
                 {"not an image in a supported format", "JPEG, PNG, WebP, TIFF, BMP"});
  }
  expect_error(
      [] {
        decode(Bytes{'P', '3', '\n', '3', '3'});
      },
      ErrorCode::kInvalidInput,
      {"supported format"});  // ASCII PNM: stb_image cannot read its header
}

// A few bytes that describe a huge image are refused from the header, before a decoder
// allocates anything: the message gives the header's size and the limit.
TEST(UnitImageInput, DecompressionBombsAreRefusedFromTheHeader) {
  struct Case {
    const char* name;
    Bytes bytes;
    const char* size;
  };
  const std::vector<Case> cases = {
      {"png", png_claiming(30000, 30000), "30000x30000"},
      {"jpeg", jpeg_claiming(60000, 60000), "60000x60000"},
      {"bmp", bmp_claiming(30000, -30000), "30000x30000"},  // top-down rows
      {"tiff", tiff_claiming(40000, 40000), "40000x40000"},
      {"webp", webp_animation_claiming(20000, 20000), "20000x20000"},
  };
  for (const auto& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    expect_error([&] { decode(c.bytes, c.name); }, ErrorCode::kInvalidInput,
                 {c.name, c.size, "above the limit of 268 megapixels"});
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(ms, 200.0) << c.name << ": refusing from the header should take no time";
  }
  Bytes ppm = {'P', '6', '\n'};
  for (char ch : std::string("30000 30000\n255\n")) ppm.push_back(static_cast<std::uint8_t>(ch));
  ppm.resize(ppm.size() + 64, 0);
  expect_error([&] { decode(ppm, "ppm"); }, ErrorCode::kInvalidInput, {"30000x30000", "268"});
  // A side below 32 is refused from the header as well.
  expect_error([&] { decode(png_claiming(20, 100000), "thin"); }, ErrorCode::kInvalidInput,
               {"20x100000", "at least 32"});
  // Within the limit the same header passes, and the short data is then a decode error.
  expect_error([&] { decode(png_claiming(1000, 1000), "short"); }, ErrorCode::kInvalidInput,
               {"cannot decode short"});
}

TEST(UnitImageInput, CorruptHeadersGetClearErrors) {
  Bytes png = encode(picture(40, 40), ".png");
  png[20] ^= 0x55;  // inside IHDR: its CRC no longer matches
  expect_error([&] { decode(png, "png"); }, ErrorCode::kInvalidInput, {"corrupt PNG header"});
  Bytes tiff = {'I', 'I', 42, 0, 0xFF, 0xFF, 0xFF, 0x7F};  // first directory far outside
  expect_error([&] { decode(tiff, "tiff"); }, ErrorCode::kInvalidInput, {"corrupt TIFF header"});
  expect_error(
      [&] {
        decode(Bytes{0xFF, 0xD8, 0xFF, 0xD9}, "jpg");
      },
      ErrorCode::kInvalidInput, {"corrupt JPEG header"});
  Bytes webp = {'R', 'I', 'F', 'F', 4, 0, 0, 0, 'W', 'E', 'B', 'P'};
  expect_error([&] { decode(webp, "webp"); }, ErrorCode::kInvalidInput, {"corrupt WebP header"});
}

// Android "motion photos" (and other files) carry data after the JPEG's end-of-image marker:
// such files decode exactly as cv2.imread decodes them, whatever the trailing bytes hold.
TEST(UnitImageInput, JpegWithTrailingDataDecodes) {
  const Bytes jpg = encode(picture(120, 90), ".jpg");
  const cv::Mat want = decode(jpg);
  Bytes mp4 = {0, 0, 0, 0x18, 'f', 't', 'y', 'p', 'm', 'p', '4', '2'};
  cv::RNG rng(3);
  for (std::size_t extra : {std::size_t{8} << 10, std::size_t{2} << 20}) {
    Bytes motion = jpg;
    motion.insert(motion.end(), mp4.begin(), mp4.end());
    for (std::size_t i = mp4.size(); i < extra; ++i) {
      motion.push_back(static_cast<std::uint8_t>(rng.uniform(0, 256)));
    }
    EXPECT_EQ(max_diff(decode(motion), want), 0) << extra << " trailing bytes";
  }
  // Trailing data that itself holds markers, FFD9 included.
  Bytes marked = jpg;
  for (int i = 0; i < 100; ++i) marked.insert(marked.end(), {0xFF, 0xD9, 0xFF, 0xD8, 0x00});
  EXPECT_EQ(max_diff(decode(marked), want), 0);
}

// A really truncated JPEG is refused, wherever it is cut, also when an end-of-image marker of
// an embedded thumbnail or a comment lies in its last bytes (a search for FFD9 near the end
// is fooled by those).
TEST(UnitImageInput, TruncatedJpegIsRefusedWhereverItIsCut) {
  const Bytes jpg = encode(picture(200, 300), ".jpg");
  const Bytes progressive = encode(picture(200, 300), ".jpg", {cv::IMWRITE_JPEG_PROGRESSIVE, 1});
  for (const Bytes* b : {&jpg, &progressive}) {
    const std::size_t sos = find(*b, {0xFF, 0xDA});
    ASSERT_NE(sos, std::string::npos);
    for (double at : {0.05, 0.3, 0.6, 0.9, 0.99}) {
      const auto n =
          std::max(sos + 20, static_cast<std::size_t>(at * static_cast<double>(b->size())));
      const Bytes cut(b->begin(), b->begin() + static_cast<long>(std::min(n, b->size() - 2)));
      expect_error([&] { decode(cut, "cut.jpg"); }, ErrorCode::kInvalidInput,
                   {"cut.jpg", "truncated JPEG"});
    }
    const Bytes no_eoi(b->begin(), b->end() - 2);
    expect_error([&] { decode(no_eoi, "no-eoi.jpg"); }, ErrorCode::kInvalidInput,
                 {"truncated JPEG"});
  }
  // A comment holding FFD9 right after the headers, then the file cut in its scan data.
  Bytes commented = jpg;
  const Bytes com = {0xFF, 0xFE, 0x00, 0x06, 0xFF, 0xD9, 0xFF, 0xD9};
  commented.insert(commented.begin() + static_cast<long>(find(jpg, {0xFF, 0xDA})), com.begin(),
                   com.end());
  EXPECT_EQ(max_diff(decode(commented), decode(jpg)), 0);
  const std::size_t scan = find(commented, {0xFF, 0xDA});
  const Bytes cut(commented.begin(), commented.begin() + static_cast<long>(scan + 200));
  expect_error([&] { decode(cut, "commented.jpg"); }, ErrorCode::kInvalidInput, {"truncated JPEG"});
}

TEST(UnitImageInput, HeaderAndDecoderAgreeUnderExifRotation) {
  // The header gives 64 x 40; EXIF orientation 6 turns the decoded image to 40 x 64.
  Bytes jpg = encode(picture(40, 64), ".jpg");
  const Bytes app1 = {0xFF, 0xE1, 0x00, 0x22, 'E',  'x',  'i',  'f',  0,    0,    'I',  'I',
                      0x2A, 0x00, 0x08, 0x00, 0x00, 0x00, 0x01, 0x00, 0x12, 0x01, 0x03, 0x00,
                      0x01, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  jpg.insert(jpg.begin() + 2, app1.begin(), app1.end());
  EXPECT_EQ(header(jpg).width, 64);
  const cv::Mat rgb = decode(jpg);
  EXPECT_EQ(rgb.cols, 40);
  EXPECT_EQ(rgb.rows, 64);
}

TEST(UnitImageInput, FilesAboveTwoGibibytesAreRefusedUnread) {
  const fs::path d = fs::temp_directory_path() / ("sapiens_seg_big_" + std::to_string(getpid()));
  fs::create_directories(d);
  const fs::path f = d / "sparse.png";
  { std::ofstream(f) << "\x89PNG"; }
  fs::resize_file(f, (std::uintmax_t{1} << 31) + 10);  // sparse: no disk space used
  expect_error([&] { io::decode_file(f.string()); }, ErrorCode::kInvalidInput,
               {"sparse.png", "2 GiB"});
  fs::remove_all(d);
}

namespace {

// EXIF data in its TIFF layout with one IFD0 entry: Orientation = `o`.
Bytes exif_tiff(int o) {
  return {'I',
          'I',
          0x2A,
          0,
          8,
          0,
          0,
          0,
          1,
          0,
          0x12,
          0x01,
          3,
          0,
          1,
          0,
          0,
          0,
          static_cast<std::uint8_t>(o),
          0,
          0,
          0,
          0,
          0,
          0,
          0};
}

Bytes jpeg_with_orientation(const cv::Mat& bgr, int o) {
  Bytes b = encode(bgr, ".jpg", {cv::IMWRITE_JPEG_QUALITY, 95});
  const Bytes tiff = exif_tiff(o);
  Bytes app1 = {0xFF, 0xE1, 0, static_cast<std::uint8_t>(2 + 6 + tiff.size()), 'E', 'x', 'i',
                'f',  0,    0};
  app1.insert(app1.end(), tiff.begin(), tiff.end());
  b.insert(b.begin() + 2, app1.begin(), app1.end());
  return b;
}

// eXIf goes before the first IDAT.
Bytes png_with_orientation(const cv::Mat& bgr, int o) {
  const Bytes png = encode(bgr, ".png");
  const std::size_t idat = find(png, {'I', 'D', 'A', 'T'}) - 4;
  Bytes b(png.begin(), png.begin() + static_cast<long>(idat));
  png_chunk(b, "eXIf", exif_tiff(o));
  b.insert(b.end(), png.begin() + static_cast<long>(idat), png.end());
  return b;
}

// The extended format: VP8X (with the EXIF flag), the lossless image chunk, then EXIF.
Bytes webp_with_orientation(const cv::Mat& bgr, int o) {
  const Bytes simple = encode(bgr, ".webp", {cv::IMWRITE_WEBP_QUALITY, 101});  // lossless
  const Bytes image(simple.begin() + 12, simple.end());                        // its one chunk
  Bytes body = {'W', 'E', 'B', 'P', 'V', 'P', '8', 'X'};
  put32le(body, 10);
  body.insert(body.end(), {0x08, 0, 0, 0});  // flags: EXIF
  for (int v : {bgr.cols - 1, bgr.rows - 1}) {
    body.insert(body.end(), {static_cast<std::uint8_t>(v), static_cast<std::uint8_t>(v >> 8),
                             static_cast<std::uint8_t>(v >> 16)});
  }
  body.insert(body.end(), image.begin(), image.end());
  const Bytes tiff = exif_tiff(o);
  body.insert(body.end(), {'E', 'X', 'I', 'F'});
  put32le(body, static_cast<std::uint32_t>(tiff.size()));
  body.insert(body.end(), tiff.begin(), tiff.end());
  Bytes b = {'R', 'I', 'F', 'F'};
  put32le(b, static_cast<std::uint32_t>(body.size()));
  b.insert(b.end(), body.begin(), body.end());
  return b;
}

// What orientation `o` makes of the stored picture, by the EXIF 2.3 table.
cv::Mat oriented(const cv::Mat& m, int o) {
  cv::Mat out;
  switch (o) {
    case 2:
      cv::flip(m, out, 1);
      return out;
    case 3:
      cv::flip(m, out, -1);
      return out;
    case 4:
      cv::flip(m, out, 0);
      return out;
    case 5:
      cv::transpose(m, out);
      return out;
    case 6:
      cv::rotate(m, out, cv::ROTATE_90_CLOCKWISE);
      return out;
    case 7:
      cv::transpose(m, out);
      cv::flip(out, out, -1);
      return out;
    case 8:
      cv::rotate(m, out, cv::ROTATE_90_COUNTERCLOCKWISE);
      return out;
    default:
      return m.clone();
  }
}

// A progressive JPEG whose frame header (SOF2) is patched to say w x h: a kilobyte.
Bytes progressive_jpeg_claiming(std::uint16_t w, std::uint16_t h) {
  Bytes b = encode(picture(64, 64), ".jpg", {cv::IMWRITE_JPEG_PROGRESSIVE, 1});
  const std::size_t sof = find(b, {0xFF, 0xC2});
  EXPECT_NE(sof, std::string::npos) << "no SOF2 in the encoded progressive JPEG";
  if (sof == std::string::npos) return b;
  b[sof + 5] = static_cast<std::uint8_t>(h >> 8);
  b[sof + 6] = static_cast<std::uint8_t>(h);
  b[sof + 7] = static_cast<std::uint8_t>(w >> 8);
  b[sof + 8] = static_cast<std::uint8_t>(w);
  return b;
}

}  // namespace

// Every EXIF orientation of the formats that carry one in a way cv2.imread (opencv-python 5.0)
// applies: JPEG (APP1), PNG (eXIf) and WebP (EXIF chunk). The expected pixels are the stored
// picture turned by the EXIF table (tests/python/test_decode_robustness.py checks the same files
// against the wheel itself).
TEST(UnitImageInput, ExifOrientationOfJpegPngAndWebp) {
  const cv::Mat bgr = picture(40, 64);  // not square: a quarter turn shows
  struct Format {
    const char* name;
    Bytes (*make)(const cv::Mat&, int);
  };
  for (const Format& f :
       {Format{"jpeg", jpeg_with_orientation}, Format{"png", png_with_orientation},
        Format{"webp", webp_with_orientation}}) {
    const cv::Mat upright = decode(f.make(bgr, 1), f.name);
    for (int o = 1; o <= 8; ++o) {
      const Bytes b = f.make(bgr, o);
      EXPECT_EQ(header(b).orientation, o) << f.name << " " << o;
      EXPECT_EQ(max_diff(decode(b, f.name), oriented(upright, o)), 0.0) << f.name << " " << o;
    }
  }
}

// libjpeg's warnings about a file it still decodes (as cv2.imread decodes it) are returned, not
// printed: here three stray bytes between two header segments.
TEST(UnitImageInput, DecoderWarningsAreReturned) {
  Bytes jpg = encode(picture(64, 64), ".jpg");
  std::vector<std::string> warnings;
  io::decode_bytes(jpg, "clean", &warnings);
  EXPECT_TRUE(warnings.empty());
  const std::size_t dht = find(jpg, {0xFF, 0xC4});
  ASSERT_NE(dht, std::string::npos);
  jpg.insert(jpg.begin() + static_cast<long>(dht), {0x12, 0x34, 0x56});
  const cv::Mat rgb = io::decode_bytes(jpg, "stray", &warnings);
  EXPECT_EQ(rgb.rows, 64);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "libjpeg: Corrupt JPEG data: 3 extraneous bytes before marker 0xc4");
  const Image img = io::decode_image(jpg.data(), jpg.size(), "stray");
  EXPECT_EQ(img.warnings, warnings);
}

// A kilobyte of progressive JPEG whose header says 16000 x 16000 (256 MP, under the limit) is
// refused from its header: libjpeg would allocate 1.2 GB of coefficient buffers before finding
// the data missing. Checked under an address-space limit of 256 MiB above what the process
// already has, in a child process.
TEST(UnitImageInput, ProgressiveJpegBombIsRefusedBeforeItsBuffers) {
  const Bytes bomb = progressive_jpeg_claiming(16000, 16000);
  EXPECT_LT(bomb.size(), 4096u);
  expect_error([&] { decode(bomb, "bomb.jpg"); }, ErrorCode::kInvalidInput,
               {"bomb.jpg", "truncated JPEG", "16000x16000", "blocks of 8x8"});
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(test::exit_under_memory_limit(std::size_t{256} << 20, ErrorCode::kInvalidInput,
                                            [&] { decode(bomb, "bomb.jpg"); }),
              ::testing::ExitedWithCode(0), "");
  // A real progressive JPEG still decodes.
  const cv::Mat small = picture(300, 200);
  EXPECT_EQ(decode(encode(small, ".jpg", {cv::IMWRITE_JPEG_PROGRESSIVE, 1})).rows, 300);
}

// An EXIF block shorter than one IFD entry that ends at the end of readable memory (a WebP whose
// last chunk is a 10-byte EXIF hands over exactly that): the parser must not read past it. The
// bytes sit at the end of a page followed by an inaccessible one, so a read past them crashes.
TEST(UnitImageInput, ExifShorterThanAnEntryIsNotReadPastItsEnd) {
  const long page = sysconf(_SC_PAGESIZE);
  void* mem = mmap(nullptr, 2 * static_cast<std::size_t>(page), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* base = static_cast<std::uint8_t*>(mem);
  ASSERT_EQ(mprotect(base + page, static_cast<std::size_t>(page), PROT_NONE), 0);
  // "II", 42, first IFD at 8, then its entry count (1): 10 bytes, no room for the entry.
  const std::uint8_t tiff[10] = {'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0};
  std::uint8_t* at = base + page - sizeof tiff;
  std::memcpy(at, tiff, sizeof tiff);
  EXPECT_EQ(io::exif_orientation(at, sizeof tiff), 1);
  munmap(mem, 2 * static_cast<std::size_t>(page));
}
