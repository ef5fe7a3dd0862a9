// Unit tests of the IO layer: hashing, cards, image decoding rules, the weight store, .npy files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <ATen/ATen.h>

#include "core/resize/resize.hpp"
#include "core/tensor_ops.hpp"
#include "io/download.hpp"
#include "io/image.hpp"
#include "io/paths.hpp"
#include "io/sha256.hpp"
#include "io/weights.hpp"
#include "sapiens_seg/cards.hpp"
#include "sapiens_seg/error.hpp"
#include "test_util.hpp"

using namespace sapiens_seg;
namespace fs = std::filesystem;
using sapiens_seg::test::fixture;

using sapiens_seg::test::expect_error;

namespace {

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::vector<std::uint8_t> encode(const cv::Mat& m, const std::string& ext) {
  std::vector<std::uint8_t> buf;
  EXPECT_TRUE(cv::imencode(ext, m, buf));
  return buf;
}

cv::Mat pattern(int h, int w, int type = CV_8UC3) {
  cv::Mat m(h, w, type);
  cv::randu(m, 0, type == CV_16UC3 || type == CV_16UC1 ? 65535 : 255);
  return m;
}

void write_bytes(const fs::path& p, const std::vector<std::uint8_t>& b) {
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

}  // namespace

TEST(UnitSha256, KnownVectorsAndFiles) {
  io::Sha256 h;
  h.update("abc", 3);
  EXPECT_EQ(h.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const auto d = test::scratch_dir("sha");
  write_bytes(d / "empty", {});
  EXPECT_EQ(io::sha256_file((d / "empty").string()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  expect_error([&] { io::sha256_file((d / "nope").string()); }, ErrorCode::kNotFound, {"nope"});
}

TEST(UnitCards, BundledV1CardsParseAndAgreeWithTheSpec) {
  const auto cards = list_cards();
  int v1 = 0;
  for (const auto& c : cards) {
    if (c.family != "sapiens-v1" || c.id.rfind("sapiens-seg-", 0) != 0) continue;
    ++v1;
    EXPECT_EQ(c.num_classes, 28);
    EXPECT_EQ(c.classes.front(), "Background");
    EXPECT_EQ(c.classes.back(), "Tongue");
    EXPECT_EQ(c.input_height, 1024);
    EXPECT_EQ(c.input_width, 768);
    EXPECT_EQ(c.embed_dim % c.heads, 0);
    EXPECT_FALSE(c.commercial_use);
    EXPECT_EQ(c.license_id, "CC-BY-NC-4.0");
  }
  EXPECT_EQ(v1, 4);
  const Card c = find_card("sapiens-seg-1b-goliath");
  EXPECT_EQ(*c.sha256, "33bba30f3de8d9cfd44e4eaa4817b1bfdd98c188edfc87fa7cc031ba0f4edc17");
  EXPECT_EQ(*c.size, 4716314057ULL);
  EXPECT_EQ(c.heads, 24);
  EXPECT_FALSE(find_card("sapiens-seg-2b-goliath").sha256.has_value());
  EXPECT_EQ(find_card("sapiens-seg-0.3b-goliath@5c3ea7a0").id, "sapiens-seg-0.3b-goliath");
  expect_error([] { find_card("sapiens-seg-0.3b-goliath@deadbeef"); }, ErrorCode::kNotFound,
               {"revision"});
  expect_error([] { find_card("no-such-model"); }, ErrorCode::kNotFound,
               {"unknown model", "sapiens-seg-0.3b-goliath"});
}

TEST(UnitCards, OverlayFolderAndMalformedCards) {
  const auto d = test::scratch_dir("cards");
  {
    ScopedEnv env("SAPIENS_SEG_CARDS", fixture("cards"));
    EXPECT_EQ(find_card("fixture-tiny-a").file, "tiny_a_torchscript.pt2");
  }
  std::ifstream in(fixture("cards/tiny_a.json"));
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto write = [&](const std::string& text) {
    std::ofstream(d / "card.json") << text;
    return (d / "card.json").string();
  };
  expect_error([&] { read_card(write("{ not json")); }, ErrorCode::kFormatError,
               {"not valid JSON"});
  std::string bad_hash = good;
  const auto pos = bad_hash.find("\"sha256\": \"") + 11;
  bad_hash.replace(pos, 4, "XYZ!");
  expect_error([&] { read_card(write(bad_hash)); }, ErrorCode::kFormatError, {"sha256"});
  std::string no_id = good;
  no_id.replace(no_id.find("\"id\""), 4, "\"xid\"");
  expect_error([&] { read_card(write(no_id)); }, ErrorCode::kFormatError, {"missing field 'id'"});
  std::string evil_file = good;
  evil_file.replace(evil_file.find("tiny_a_torchscript.pt2"), 22, "../../../../etc/passwd");
  expect_error([&] { read_card(write(evil_file)); }, ErrorCode::kFormatError, {"plain file name"});
  // Families and their formats come from the one family table (src/core/families.hpp).
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  expect_error([&] { read_card(write(replaced("\"sapiens-v1\"", "\"sapiens3\""))); },
               ErrorCode::kFormatError, {"unknown family 'sapiens3' (sapiens-v1 or sapiens2)"});
  expect_error([&] { read_card(write(replaced("\"torchscript\"", "\"safetensors\""))); },
               ErrorCode::kFormatError, {"does not fit family sapiens-v1"});
}

TEST(UnitCards, BrokenCardFilesAreSkippedAndListed) {
  const auto d = test::scratch_dir("broken_cards");
  std::ifstream in(fixture("cards/tiny_a.json"));
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(d / "a_good.json") << good;
  std::ofstream(d / "garbage.json") << "\x01\x02 this is not JSON {{";
  std::ofstream(d / "empty.json") << "";
  std::string wrong_types = good;
  wrong_types.replace(wrong_types.find("\"schema\": 1"), 11, "\"schema\": \"one\"");
  std::ofstream(d / "wrong_types.json") << wrong_types;
  fs::create_directories(d / "x.json");
  ScopedEnv env("SAPIENS_SEG_CARDS", d.string());

  const auto cards = list_cards();
  EXPECT_TRUE(std::any_of(cards.begin(), cards.end(),
                          [](const Card& c) { return c.id == "fixture-tiny-a"; }));
  EXPECT_TRUE(std::any_of(cards.begin(), cards.end(),
                          [](const Card& c) { return c.id == "sapiens-seg-0.3b-goliath"; }));
  const auto broken = broken_cards();
  ASSERT_EQ(broken.size(), 4u);
  std::map<std::string, std::string> why;
  for (const auto& b : broken) why[fs::path(b.path).filename().string()] = b.error;
  EXPECT_NE(why["garbage.json"].find("not valid JSON"), std::string::npos) << why["garbage.json"];
  EXPECT_NE(why["empty.json"].find("not valid JSON"), std::string::npos) << why["empty.json"];
  EXPECT_NE(why["wrong_types.json"].find("'schema'"), std::string::npos) << why["wrong_types.json"];
  EXPECT_NE(why["x.json"].find("is a directory"), std::string::npos) << why["x.json"];
  for (const auto& [name, error] : why) EXPECT_NE(error.find(name), std::string::npos) << error;
  // Lookups work around them, and an unknown id says what was skipped.
  EXPECT_EQ(find_card("fixture-tiny-a").file, "tiny_a_torchscript.pt2");
  expect_error([] { find_card("no-such-model"); }, ErrorCode::kNotFound,
               {"unknown model", "skipped broken card", "garbage.json", "x.json"});
  expect_error([&] { read_card((d / "x.json").string()); }, ErrorCode::kFormatError,
               {"is a directory"});
}

TEST(UnitImage, DecodeRules) {
  // 8-bit BGR round trip (PNG is lossless): RGB out.
  const cv::Mat bgr = pattern(40, 50);
  cv::Mat rgb = io::decode_bytes(encode(bgr, ".png"), "png");
  cv::Mat back;
  cv::cvtColor(rgb, back, cv::COLOR_RGB2BGR);
  EXPECT_EQ(cv::norm(back, bgr, cv::NORM_INF), 0);

  // Grey is replicated to three equal channels.
  const cv::Mat grey = pattern(40, 50, CV_8UC1);
  rgb = io::decode_bytes(encode(grey, ".png"), "grey");
  std::vector<cv::Mat> ch;
  cv::split(rgb, ch);
  EXPECT_EQ(cv::norm(ch[0], grey, cv::NORM_INF), 0);
  EXPECT_EQ(cv::norm(ch[2], grey, cv::NORM_INF), 0);

  // Alpha is dropped, not composited.
  cv::Mat bgra(40, 50, CV_8UC4);
  cv::randu(bgra, 0, 255);
  rgb = io::decode_bytes(encode(bgra, ".png"), "rgba");
  cv::Mat bgr_of_bgra;
  cv::cvtColor(bgra, bgr_of_bgra, cv::COLOR_BGRA2BGR);
  cv::cvtColor(rgb, back, cv::COLOR_RGB2BGR);
  EXPECT_EQ(cv::norm(back, bgr_of_bgra, cv::NORM_INF), 0);

  // 16-bit keeps its high byte.
  const cv::Mat deep = pattern(40, 50, CV_16UC3);
  rgb = io::decode_bytes(encode(deep, ".png"), "16-bit");
  cv::Mat high;
  deep.convertTo(high, CV_8U, 1.0 / 256.0);  // a rounding reference, within 1 of the high byte
  cv::cvtColor(rgb, back, cv::COLOR_RGB2BGR);
  EXPECT_LE(cv::norm(back, high, cv::NORM_INF), 1);
  cv::Mat shifted(deep.size(), CV_8UC3);
  for (int y = 0; y < deep.rows; ++y)
    for (int x = 0; x < deep.cols; ++x)
      for (int c = 0; c < 3; ++c)
        shifted.at<cv::Vec3b>(y, x)[c] = static_cast<uchar>(deep.at<cv::Vec3w>(y, x)[c] >> 8);
  EXPECT_EQ(cv::norm(back, shifted, cv::NORM_INF), 0)
      << "16-bit PNG is not reduced to its high byte";
}

TEST(UnitImage, ExifOrientationIsApplied) {
  std::vector<std::uint8_t> jpg = encode(pattern(40, 64), ".jpg");  // 64 wide, 40 high
  // APP1 Exif segment with one IFD0 entry: Orientation (0x0112) = 6, "rotate 90 clockwise".
  const std::vector<std::uint8_t> app1 = {
      0xFF, 0xE1, 0x00, 0x22, 'E',  'x',  'i',  'f',  0,    0,  // marker, length 34, "Exif\0\0"
      'I',  'I',  0x2A, 0x00, 0x08, 0x00, 0x00, 0x00,           // TIFF little-endian, IFD0 at 8
      0x01, 0x00,                                               // one entry
      0x12, 0x01, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00,  // tag, SHORT, 1, 6
      0x00, 0x00, 0x00, 0x00};                                                 // no next IFD
  jpg.insert(jpg.begin() + 2, app1.begin(), app1.end());
  const cv::Mat rgb = io::decode_bytes(jpg, "exif");
  EXPECT_EQ(rgb.cols, 40);
  EXPECT_EQ(rgb.rows, 64);
}

// The library's resizes (core/resize) in the flavour of OpenCV's own code against the OpenCV
// this build links (Debian's has no IPP, so its INTER_CUBIC is OpenCV's own code too), on the
// host and as tensor ops: the same bytes for shrinking, enlarging and mixed aspect changes, odd
// sizes and tiny images. (The opencv-python wheel, IPP cubic included, is the reference of
// tests/python/test_resize.py.) The normalised tensor equals the host pipeline's bit for bit.
TEST(UnitImage, ResizesEqualTheLinkedOpenCvByteForByte) {
  const std::array<float, 3> zero{0, 0, 0}, one{1, 1, 1};
  cv::Mat smooth(900, 700, CV_8UC3);
  for (int y = 0; y < smooth.rows; ++y) {
    for (int x = 0; x < smooth.cols; ++x) {
      smooth.at<cv::Vec3b>(y, x) = {static_cast<std::uint8_t>((x * 255) / 699),
                                    static_cast<std::uint8_t>((y * 255) / 899),
                                    static_cast<std::uint8_t>(((x + y) * 7) % 256)};
    }
  }
  const std::vector<std::tuple<cv::Mat, int, int>> cases = {{pattern(1500, 2000), 1024, 768},
                                                            {pattern(300, 211), 1024, 768},
                                                            {pattern(4000, 3000), 1024, 768},
                                                            {pattern(2048, 1536), 1024, 768},
                                                            {pattern(3072, 2304), 1024, 768},
                                                            {pattern(33, 47), 1024, 768},
                                                            {pattern(37, 1000), 1024, 768},
                                                            {pattern(2000, 20), 1024, 768},
                                                            {pattern(1023, 767), 1024, 768},
                                                            {pattern(1025, 769), 1024, 768},
                                                            {smooth, 1024, 768},
                                                            {smooth, 333, 251},
                                                            {smooth, 301, 1201},
                                                            {pattern(64, 48), 64, 48},
                                                            {pattern(1, 1), 16, 12},
                                                            {pattern(2, 3), 1024, 768}};
  const std::pair<core::Interp, int> interps[] = {{core::Interp::kLinear, cv::INTER_LINEAR},
                                                  {core::Interp::kArea, cv::INTER_AREA},
                                                  {core::Interp::kCubic, cv::INTER_CUBIC}};
  for (const auto& [interp, cv_flag] : interps) {
    for (const auto& [img, H, W] : cases) {
      cv::Mat want;
      cv::resize(img, want, cv::Size(W, H), 0, 0, cv_flag);
      cv::Mat host(H, W, CV_8UC3);
      core::resize_u8({img.data, img.rows, img.cols, 3, img.step}, {host.data, H, W, 3, host.step},
                      interp, core::CubicFlavor::kOpenCV);
      cv::Mat diff;
      cv::absdiff(host, want, diff);
      EXPECT_EQ(cv::countNonZero(diff.reshape(1)), 0)
          << core::to_string(interp) << " host " << img.rows << "x" << img.cols << " -> " << H
          << "x" << W;

      // The tensor code is the device pipeline's: the large sources add minutes on the CPU
      // and nothing the smaller ones do not cover (tests/python/test_resize.py has them all).
      if (static_cast<int64_t>(img.rows) * img.cols > 2'000'000) continue;
      const at::Tensor t = at::from_blob(img.data, {img.rows, img.cols, 3},
                                         {static_cast<int64_t>(img.step), 3, 1}, at::kByte);
      const at::Tensor got = core::resize_normalize(t, H, W, zero, one, interp,
                                                    core::CubicFlavor::kOpenCV);  // grey levels
      const at::Tensor ref = at::from_blob(want.data, {H, W, 3}, at::kByte).permute({2, 0, 1});
      const double max_diff = (got - ref.to(at::kFloat)).abs().max().item<double>();
      EXPECT_EQ(max_diff, 0.0) << core::to_string(interp) << " tensor " << img.rows << "x"
                               << img.cols << " -> " << H << "x" << W;
      const std::array<float, 3> mean{123.5f, 116.5f, 103.5f}, sd{58.5f, 57.0f, 57.5f};
      EXPECT_TRUE(
          at::equal(core::resize_normalize(t, H, W, mean, sd, interp, core::CubicFlavor::kOpenCV),
                    core::normalize_rgb(want.data, H, W, want.step, mean, sd)));
    }
  }
}

TEST(UnitImage, BadImagesGetClearErrors) {
  const auto d = test::scratch_dir("img");
  std::vector<std::uint8_t> jpg = encode(pattern(200, 300), ".jpg");
  std::vector<std::uint8_t> cut(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() / 2));
  expect_error([&] { io::decode_bytes(cut, "cut.jpg"); }, ErrorCode::kInvalidInput,
               {"truncated JPEG"});
  std::vector<std::uint8_t> png = encode(pattern(200, 300), ".png");
  std::vector<std::uint8_t> cut_png(png.begin(), png.begin() + static_cast<long>(png.size() / 2));
  expect_error([&] { io::decode_bytes(cut_png, "cut.png"); }, ErrorCode::kInvalidInput,
               {"cannot decode"});
  expect_error(
      [&] {
        io::decode_bytes({1, 2, 3, 4, 5}, "junk");
      },
      ErrorCode::kInvalidInput, {"cannot decode junk"});
  expect_error([&] { io::decode_bytes({}, "empty"); }, ErrorCode::kInvalidInput, {"0 bytes"});
  expect_error([&] { io::decode_bytes(encode(pattern(31, 100), ".png"), "tiny"); },
               ErrorCode::kInvalidInput, {"at least 32"});
  expect_error([&] { io::decode_file((d / "missing.png").string()); }, ErrorCode::kNotFound,
               {"missing.png"});
  expect_error([&] { io::decode_file(d.string()); }, ErrorCode::kInvalidInput, {"directory"});
  expect_error([] { io::check_size(20000, 20000, "huge"); }, ErrorCode::kInvalidInput, {"268"});
  // TIFF's 32-bit unsigned sides: their product would overflow int64 (a fuzzer finding).
  expect_error([] { io::check_size(4204798202LL, 3531800632LL, "tiff"); }, ErrorCode::kInvalidInput,
               {"268", "4204798202"});
  EXPECT_NO_THROW(io::check_size(16384, 16384, "at the limit"));  // 268,435,456 pixels exactly
  // 32 is the smallest accepted side.
  EXPECT_EQ(io::decode_bytes(encode(pattern(32, 32), ".png"), "ok").rows, 32);
}

namespace {
std::string fixture_source_image(const std::string& stem) {
  for (const auto& dir : {fixture("images"), fixture("examples")}) {
    for (const char* ext : {".png", ".jpg"}) {
      if (fs::exists(dir + "/" + stem + ext)) return dir + "/" + stem + ext;
    }
  }
  return "";
}
cv::Mat library_resize(const cv::Mat& rgb, core::Interp interp, core::CubicFlavor flavor) {
  cv::Mat out(1024, 768, CV_8UC3);
  core::resize_u8({rgb.data, rgb.rows, rgb.cols, 3, rgb.step}, {out.data, 1024, 768, 3, out.step},
                  interp, flavor);
  return out;
}
}  // namespace

TEST(UnitImage, ResizeIsByteIdenticalToPythonCv2) {
  // The reference resized its images with the PyPI cv2 the authors' demo uses; the library uses
  // its own arithmetic. Both must give the same bytes or parity starts from different pixels.
  int compared = 0;
  for (const auto& e : fs::directory_iterator(fixture("ref/tiny_b"))) {
    if (!e.is_directory() || e.path().filename() == "batch") continue;
    const auto ref = test::read_npy((e.path() / "resized.npy").string());
    const std::string stem = e.path().filename().string();
    const std::string src = fixture_source_image(stem);
    ASSERT_FALSE(src.empty()) << "no source image for " << stem;
    const cv::Mat resized =
        library_resize(io::decode_file(src), core::Interp::kLinear, core::CubicFlavor::kWheel);
    cv::Mat bgr;
    cv::cvtColor(resized, bgr, cv::COLOR_RGB2BGR);
    const cv::Mat want(1024, 768, CV_8UC3, const_cast<std::uint8_t*>(ref.bytes.data()));
    cv::Mat diff;
    cv::absdiff(bgr, want, diff);
    std::printf("%s: %d of %d resized bytes differ from python cv2, max %g\n", stem.c_str(),
                cv::countNonZero(diff.reshape(1)), static_cast<int>(diff.total() * 3),
                cv::norm(diff, cv::NORM_INF));
    EXPECT_EQ(cv::norm(diff, cv::NORM_INF), 0) << stem;
    ++compared;
  }
  EXPECT_GE(compared, 4);
}

// The Sapiens2 demo's rule (INTER_AREA when the width shrinks, else INTER_CUBIC) against the
// fixtures' references, which the PyPI cv2 resized: byte for byte. The system OpenCV's cubic
// (no IPP: OpenCV's own code) is not the wheel's, and this test shows it: it must differ where
// the reference enlarged, which is why the library does not call cv::resize.
TEST(UnitImage, Sapiens2ResizeRuleMatchesPythonCv2) {
  int compared = 0, enlarged = 0;
  for (const auto& e : fs::directory_iterator(fixture("ref/s2_tiny"))) {
    if (!e.is_directory() || !fs::exists(e.path() / "resized.npy")) continue;
    const auto ref = test::read_npy((e.path() / "resized.npy").string());  // RGB
    const std::string stem = e.path().filename().string();
    const std::string src = fixture_source_image(stem);
    ASSERT_FALSE(src.empty()) << "no source image for " << stem;
    const cv::Mat rgb = io::decode_file(src);
    const core::Interp interp = core::sapiens2_interp(rgb.cols, 768);
    const cv::Mat want(1024, 768, CV_8UC3, const_cast<std::uint8_t*>(ref.bytes.data()));
    cv::Mat diff, lin_diff, system_diff, system;
    cv::absdiff(library_resize(rgb, interp, core::CubicFlavor::kWheel), want, diff);
    cv::absdiff(library_resize(rgb, core::Interp::kLinear, core::CubicFlavor::kWheel), want,
                lin_diff);
    cv::resize(rgb, system, cv::Size(768, 1024), 0, 0,
               interp == core::Interp::kArea ? cv::INTER_AREA : cv::INTER_CUBIC);
    cv::absdiff(system, want, system_diff);
    const int system_bytes = cv::countNonZero(system_diff.reshape(1));
    std::printf(
        "%s (%s): %d resized bytes differ from python cv2; INTER_LINEAR instead: max %g; "
        "the system OpenCV: %d bytes\n",
        stem.c_str(), core::to_string(interp), cv::countNonZero(diff.reshape(1)),
        cv::norm(lin_diff, cv::NORM_INF), system_bytes);
    EXPECT_EQ(cv::norm(diff, cv::NORM_INF), 0) << stem;
    EXPECT_GT(cv::norm(lin_diff, cv::NORM_INF), 1) << stem;
    if (interp == core::Interp::kCubic) {
      EXPECT_GT(system_bytes, 0) << stem << ": the system OpenCV's cubic should not be the wheel's";
      ++enlarged;
    }
    ++compared;
  }
  EXPECT_GE(compared, 3);
  EXPECT_GE(enlarged, 1);
}

TEST(UnitWeights, LocateVerifyAndGates) {
  const auto d = test::scratch_dir("weights");
  ScopedEnv home("SAPIENS_SEG_HOME", (d / "home").string());
  ScopedEnv hf("HF_HUB_CACHE", (d / "hf").string());
  ScopedEnv cards("SAPIENS_SEG_CARDS", fixture("cards"));
  unsetenv("SAPIENS_SEG_WEIGHTS_PATH");
  unsetenv("SAPIENS_SEG_NONCOMMERCIAL");
  unsetenv("SAPIENS_SEG_ALLOW_UNVERIFIED");

  const Card v1 = find_card("sapiens-seg-0.3b-goliath");
  expect_error([&] { io::check_license(v1, {}); }, ErrorCode::kLicenseNotAccepted,
               {"CC-BY-NC-4.0", "SAPIENS_SEG_NONCOMMERCIAL=1"});
  io::check_license(v1, {.accept_noncommercial = true});
  {
    ScopedEnv nc("SAPIENS_SEG_NONCOMMERCIAL", "1");
    io::check_license(v1, {});
  }
  EXPECT_FALSE(io::find_weights(v1).has_value());
  ScopedEnv offline("SAPIENS_SEG_OFFLINE", "1");
  expect_error(
      [&] { io::obtain_weights(v1, {.accept_noncommercial = true}, {}); }, ErrorCode::kOffline,
      {v1.file.c_str(), v1.sha256->c_str(), v1.url.c_str(), (d / "home" / "weights").c_str()});

  // Hand-placed folder, then the Hugging Face cache layout.
  const Card tiny = find_card("fixture-tiny-a");
  fs::create_directories(d / "placed");
  fs::copy_file(fixture("tiny_a_torchscript.pt2"), d / "placed" / tiny.file);
  {
    ScopedEnv wp("SAPIENS_SEG_WEIGHTS_PATH", (d / "placed").string());
    const auto found = io::find_weights(tiny);
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->location, "weights_path");
    const std::string p = found->path;
    EXPECT_EQ(io::verify_weights(tiny, p, {}), *tiny.sha256);
  }
  Card hub = v1;
  const fs::path snap =
      d / "hf" / "models--facebook--sapiens-seg-0.3b-torchscript" / "snapshots" / v1.revision;
  fs::create_directories(snap);
  fs::copy_file(fixture("tiny_a_torchscript.pt2"), snap / v1.file);
  EXPECT_EQ(io::find_weights(hub)->path, (snap / v1.file).string());
  EXPECT_EQ(io::find_weights(hub)->location, "hf_cache");
  // ...which is then refused by size and by hash: it is not the real file.
  expect_error([&] { io::verify_weights(hub, (snap / v1.file).string(), {}); },
               ErrorCode::kChecksumMismatch, {"bytes"});
  hub.size.reset();
  expect_error([&] { io::verify_weights(hub, (snap / v1.file).string(), {}); },
               ErrorCode::kChecksumMismatch, {"expected sha256 735a9a8d", "actual   sha256"});

  // No pinned hash: refused unless the user opts in.
  Card unpinned = tiny;
  unpinned.sha256.reset();
  const std::string placed = (d / "placed" / tiny.file).string();
  expect_error([&] { io::verify_weights(unpinned, placed, {}); }, ErrorCode::kChecksumMismatch,
               {"SAPIENS_SEG_ALLOW_UNVERIFIED=1"});
  EXPECT_EQ(io::verify_weights(unpinned, placed, {.allow_unverified = true}), *tiny.sha256);
}

TEST(UnitWeights, StampsSkipTheHashUntilTheFileChanges) {
  const auto d = test::scratch_dir("stamps");
  ScopedEnv home("SAPIENS_SEG_HOME", (d / "home").string());
  ScopedEnv cards("SAPIENS_SEG_CARDS", fixture("cards"));
  const Card tiny = find_card("fixture-tiny-a");
  const std::string file = (d / tiny.file).string();
  fs::copy_file(fixture("tiny_a_torchscript.pt2"), file);
  // A file written just now is "racy" (it could change again within the timestamp
  // granularity) and never trusted from a stamp; an older one is.
  fs::last_write_time(file, fs::last_write_time(file) - std::chrono::seconds(10));
  EXPECT_EQ(io::verify_weights(tiny, file, {}), *tiny.sha256);
  // The stamp now stands for the hash: forge one with another hash for the same size, inode and
  // mtime, and a load believes it, while an explicit re-hash does not.
  fs::path stamp;
  for (const auto& e : fs::directory_iterator(d / "home" / "stamps")) stamp = e.path();
  ASSERT_FALSE(stamp.empty());
  std::ifstream in(stamp);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const std::string forged =
      std::string(text).replace(text.find(*tiny.sha256), 64, std::string(64, 'f'));
  std::ofstream(stamp) << forged;
  expect_error([&] { io::verify_weights(tiny, file, {}); }, ErrorCode::kChecksumMismatch,
               {"actual   sha256 ffffffff"});
  EXPECT_EQ(io::verify_weights(tiny, file, {}, /*rehash=*/true), *tiny.sha256);
  // A changed file (new mtime) is hashed again whatever the stamp says.
  std::ofstream(stamp) << forged;
  fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(1));
  EXPECT_EQ(io::verify_weights(tiny, file, {}), *tiny.sha256);
}

TEST(UnitWeights, ABareFileIsKnownByItsContent) {
  const auto d = test::scratch_dir("by_content");
  ScopedEnv home("SAPIENS_SEG_HOME", (d / "home").string());
  ScopedEnv cards("SAPIENS_SEG_CARDS", fixture("cards"));
  const Card tiny = find_card("fixture-tiny-a");
  // A renamed copy: same size and SHA-256 as the card's file.
  const std::string renamed = (d / "renamed.pt2").string();
  fs::copy_file(fixture("tiny_a_torchscript.pt2"), renamed);
  fs::last_write_time(renamed, fs::last_write_time(renamed) - std::chrono::seconds(10));
  EXPECT_FALSE(io::card_for_file_name(renamed).has_value());
  auto found = io::identify_by_content(renamed, false);
  ASSERT_TRUE(found.card.has_value());
  EXPECT_EQ(found.card->id, "fixture-tiny-a");  // not fixture-wrong-hash, of the same size
  EXPECT_TRUE(found.by_content);
  EXPECT_EQ(found.sha256, *tiny.sha256);
  EXPECT_EQ(*io::read_stamp(renamed), *tiny.sha256);  // the next time is free
  // verify_file of a renamed card file names the card.
  const WeightsStatus r = verify_file(renamed);
  EXPECT_EQ(r.id, "fixture-tiny-a");
  EXPECT_TRUE(r.verified);

  // Without the fixture cards, Tiny-B is of no card's size: not hashed unless asked
  // (TorchScript: its records' CRC-32s protect it)...
  ScopedEnv no_cards("SAPIENS_SEG_CARDS", (d / "none").string());
  const std::string other = (d / "other.pt2").string();
  fs::copy_file(fixture("tiny_b_torchscript.pt2"), other);
  fs::last_write_time(other, fs::last_write_time(other) - std::chrono::seconds(10));
  EXPECT_EQ(io::identify_by_content(other, false).sha256, "");
  EXPECT_FALSE(io::read_stamp(other).has_value());
  // ...and is when asked (safetensors), then held to that first hash.
  const std::string first = io::sha256_file(other);
  found = io::identify_by_content(other, true);
  EXPECT_FALSE(found.card.has_value());
  EXPECT_EQ(found.sha256, first);
  EXPECT_EQ(io::identify_by_content(other, true).sha256, first);  // from the stamp
  // The same bytes after a touch: hashed again, accepted.
  fs::last_write_time(other, fs::last_write_time(other) + std::chrono::seconds(1));
  EXPECT_EQ(io::identify_by_content(other, true).sha256, first);
  // Other content under the same path: refused with both hashes and the way out.
  {
    std::fstream f(other, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    f.put('\x5a');
  }
  fs::last_write_time(other, fs::last_write_time(other) - std::chrono::seconds(20));
  expect_error([&] { io::identify_by_content(other, true); }, ErrorCode::kChecksumMismatch,
               {"content of", "changed since it was first used", first.c_str(),
                "sapiens-seg models verify", "stamps"});
  // verify_file accepts the new content, after which it is used as before.
  const WeightsStatus v = verify_file(other);
  EXPECT_EQ(v.id, "");
  EXPECT_FALSE(v.verified);
  EXPECT_NE(v.sha256, first);
  EXPECT_EQ(io::identify_by_content(other, true).sha256, v.sha256);
  expect_error([&] { verify_file((d / "missing.pt2").string()); }, ErrorCode::kNotFound,
               {"missing.pt2"});
}

TEST(UnitWeights, StatusSaysWrongSizeAndVerified) {
  const auto d = test::scratch_dir("status");
  ScopedEnv home("SAPIENS_SEG_HOME", (d / "home").string());
  ScopedEnv hf("HF_HUB_CACHE", (d / "hf").string());
  ScopedEnv cards("SAPIENS_SEG_CARDS", fixture("cards"));
  ScopedEnv wp("SAPIENS_SEG_WEIGHTS_PATH", (d / "placed").string());
  fs::create_directories(d / "placed");
  const Card tiny = find_card("fixture-tiny-a");
  const fs::path file = d / "placed" / tiny.file;
  fs::copy_file(fixture("tiny_a_torchscript.pt2"), file);
  fs::last_write_time(file, fs::last_write_time(file) - std::chrono::seconds(10));
  WeightsStatus s = weights_status("fixture-tiny-a");
  EXPECT_TRUE(s.present);
  EXPECT_FALSE(s.verified);  // not hashed yet
  EXPECT_EQ(s.problem, "");
  io::verify_weights(tiny, file.string(), {});
  EXPECT_TRUE(weights_status("fixture-tiny-a").verified);
  fs::resize_file(file, 1000);
  s = weights_status("fixture-tiny-a");
  EXPECT_TRUE(s.present);
  EXPECT_FALSE(s.verified);
  EXPECT_NE(s.problem.find("wrong size: 1000 bytes"), std::string::npos) << s.problem;
}

TEST(UnitWeights, MessagesNameEveryWayOut) {
  const auto d = test::scratch_dir("messages");
  ScopedEnv home("SAPIENS_SEG_HOME", (d / "home").string());
  ScopedEnv hf("HF_HUB_CACHE", (d / "hf").string());
  unsetenv("SAPIENS_SEG_CARDS");
  unsetenv("SAPIENS_SEG_WEIGHTS_PATH");
  unsetenv("SAPIENS_SEG_NONCOMMERCIAL");
  const Card v1 = find_card("sapiens-seg-0.3b-goliath");
  expect_error([&] { io::check_license(v1, {}); }, ErrorCode::kLicenseNotAccepted,
               {"accept_noncommercial=True", "--accept-noncommercial",
                "LoadOptions::accept_noncommercial", "SAPIENS_SEG_NONCOMMERCIAL=1"});
  ScopedEnv offline("SAPIENS_SEG_OFFLINE", "1");
  ScopedEnv endpoint("HF_ENDPOINT", "http://127.0.0.1:9/");
  expect_error([&] { io::obtain_weights(v1, {.accept_noncommercial = true}, {}); },
               ErrorCode::kOffline,
               {"sapiens-seg models download sapiens-seg-0.3b-goliath", "HF_ENDPOINT",
                "now http://127.0.0.1:9;", "mirror"});
}

// A tuning variable of the downloader that is set but malformed is an invalid-input error naming
// it, before anything is created or fetched (it was read as its default without a word).
TEST(UnitDownload, MalformedTuningVariablesAreInvalidInput) {
  const auto d = test::scratch_dir("retries");
  io::DownloadRequest req;
  req.url = "http://127.0.0.1:9/model.bin";  // nothing listens: a run that got there would fail
  req.dest = (d / "model.bin").string();
  req.label = "model.bin";
  setenv("SAPIENS_SEG_RETRY_BASE_MS", "1", 1);
  for (const char* bad : {"abc", "5x", "-1", "1000", " "}) {
    setenv("SAPIENS_SEG_DOWNLOAD_RETRIES", bad, 1);
    expect_error([&] { io::download(req); }, ErrorCode::kInvalidInput,
                 {"SAPIENS_SEG_DOWNLOAD_RETRIES='" + std::string(bad) + "'", "whole number"});
  }
  unsetenv("SAPIENS_SEG_DOWNLOAD_RETRIES");
  setenv("SAPIENS_SEG_LOW_SPEED_TIME", "0", 1);
  expect_error([&] { io::download(req); }, ErrorCode::kInvalidInput,
               {"SAPIENS_SEG_LOW_SPEED_TIME"});
  unsetenv("SAPIENS_SEG_LOW_SPEED_TIME");
  unsetenv("SAPIENS_SEG_RETRY_BASE_MS");
  EXPECT_TRUE(fs::is_empty(d));
  fs::remove_all(d);
}
