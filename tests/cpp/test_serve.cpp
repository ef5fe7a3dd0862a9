// The server's pieces without a socket: request parsing (query, base64, multipart, JSON), the
// response encoders (npy header, COCO RLE strings) and the batching queue (admission, batches,
// dropped jobs, batched results equal to single ones).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "formats/npy.hpp"
#include "sapiens_seg/sapiens_seg.hpp"
#include "serve/batcher.hpp"
#include "serve/encode.hpp"
#include "serve/metrics.hpp"
#include "serve/request.hpp"
#include "test_util.hpp"

namespace ss = sapiens_seg;
namespace sv = sapiens_seg::serve;

namespace {

int status_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const sv::HttpError& e) {
    return e.status;
  }
  return 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST(UnitServeRequest, QueryIsPercentDecodedAndChecked) {
  const auto q = sv::parse_query("output=json&classes=Face_Neck%2C3&rle=true&opacity=0.25&x");
  sv::SegmentRequest r;
  sv::apply_query(q, r);
  EXPECT_EQ(r.output, sv::Output::kJson);
  EXPECT_EQ(r.classes, (std::vector<std::string>{"Face_Neck", "3"}));
  EXPECT_TRUE(r.rle);
  EXPECT_FLOAT_EQ(r.opacity, 0.25f);
  EXPECT_EQ(sv::parse_query("a=1+2")["a"], "1 2");
  EXPECT_EQ(status_of([] { sv::parse_query("a=%4"); }), 400);
  EXPECT_EQ(status_of([] { sv::parse_query("a=%zz"); }), 400);
  for (const char* bad :
       {"output=gif", "opacity=1.5", "opacity=-0.1", "opacity=nan", "opacity=0.5x", "rle=yes"}) {
    EXPECT_EQ(status_of([&] {
                sv::SegmentRequest x;
                sv::apply_query(sv::parse_query(bad), x);
              }),
              400)
        << bad;
  }
}

TEST(UnitServeRequest, Base64IsStrict) {
  EXPECT_EQ(sv::base64_decode("aGVsbG8="), "hello");
  EXPECT_EQ(sv::base64_decode("aGVsbG8"), "hello");  // padding optional
  EXPECT_EQ(sv::base64_decode("aGVs\r\nbG8="), "hello");
  EXPECT_EQ(sv::base64_decode(""), "");
  EXPECT_FALSE(sv::base64_decode("aGVsbG8=x"));  // data after padding
  EXPECT_FALSE(sv::base64_decode("a"));          // 6 bits cannot end a quantum
  EXPECT_FALSE(sv::base64_decode("aGVsbG8==="));
  EXPECT_FALSE(sv::base64_decode("aGV$bG8="));
}

TEST(UnitServeRequest, BodiesByContentType) {
  sv::SegmentRequest r;
  sv::read_body("image/jpeg", "\xff\xd8\xffJPEG", r);
  EXPECT_EQ(r.image, "\xff\xd8\xffJPEG");
  sv::read_body("", "raw", r);  // no Content-Type: octet-stream
  EXPECT_EQ(r.image, "raw");

  const std::string multipart =
      "preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhi\r\n"
      "--XyZ\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n"
      "Content-Type: image/png\r\n\r\nPNG\r\n--Xy\r\nDATA\r\n--XyZ--\r\n";
  sv::read_body("multipart/form-data; boundary=\"XyZ\"", multipart, r);
  EXPECT_EQ(r.image, "PNG\r\n--Xy\r\nDATA");  // a near-delimiter is data

  sv::SegmentRequest j;
  sv::read_body("application/json; charset=utf-8",
                R"({"image": "aGVsbG8=", "output": "overlay", "classes": ["Hair", 3],
                    "rle": true, "opacity": 1, "model": "m"})",
                j);
  EXPECT_EQ(j.image, "hello");
  EXPECT_EQ(j.output, sv::Output::kOverlay);
  EXPECT_EQ(j.classes, (std::vector<std::string>{"Hair", "3"}));
  EXPECT_EQ(j.model, "m");
  EXPECT_FLOAT_EQ(j.opacity, 1.0f);

  const auto status = [](const std::string& type, const std::string& body) {
    return status_of([&] {
      sv::SegmentRequest x;
      sv::read_body(type, body, x);
    });
  };
  EXPECT_EQ(status("text/plain", "x"), 415);
  EXPECT_EQ(status("application/x-www-form-urlencoded", "a=b"), 415);
  EXPECT_EQ(status("image/png", ""), 400);
  EXPECT_EQ(status("application/json", "[1]"), 400);
  EXPECT_EQ(status("application/json", R"({"image": 1})"), 400);
  EXPECT_EQ(status("application/json", R"({"image": "aGVsbG8=", "rle": "yes"})"), 400);
  EXPECT_EQ(status("application/json", R"({"image": "aGVsbG8=", "classes": [-1]})"), 400);
  EXPECT_EQ(status("multipart/form-data", "--b\r\n"), 400);  // no boundary parameter
  EXPECT_EQ(status("multipart/form-data; boundary=b", "--b\r\nno end of headers"), 400);
  EXPECT_EQ(status("multipart/form-data; boundary=b",
                   "--b\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\nA\r\n"
                   "--b\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\nB\r\n--b--"),
            400);  // two image parts
}

TEST(UnitServeRequest, FormatsAreSniffedFromTheirMagic) {
  EXPECT_EQ(sv::sniff_format("\x89PNG\r\n\x1a\n...."), "PNG");
  EXPECT_EQ(sv::sniff_format("\xff\xd8\xff\xe0"), "JPEG");
  EXPECT_EQ(sv::sniff_format(std::string_view("RIFF\x10\0\0\0WEBPVP8 ", 16)), "WebP");
  EXPECT_EQ(sv::sniff_format("GIF89a"), "");
  EXPECT_EQ(sv::sniff_format(""), "");
  EXPECT_EQ(sv::sniff_format("RIFF"), "");  // shorter than the WebP tag: no out-of-range read
  EXPECT_EQ(sv::sniff_format("P"), "");
}

TEST(UnitServeEncode, NpyHeaderIsNumpys) {
  // numpy.save(np.zeros((3, 5), np.int64)) starts with exactly these 128 bytes.
  const std::int64_t shape[] = {3, 5};
  const std::string h = ss::formats::npy_header("<i8", shape);
  std::string want("\x93NUMPY\x01\x00v\x00", 10);
  want += "{'descr': '<i8', 'fortran_order': False, 'shape': (3, 5), }";
  want.append(127 - want.size(), ' ');
  want += '\n';
  EXPECT_EQ(h, want);
  const std::int64_t one[] = {7};
  EXPECT_NE(ss::formats::npy_header("|b1", one).find("(7,)"), std::string::npos);
}

TEST(UnitServeEncode, RleCountsAndStrings) {
  ss::Result r;
  r.height = 2;
  r.width = 3;
  // Column-major order: 0 1 | 1 2 | 2 0
  r.labels = {0, 1, 2, 1, 2, 0};
  const auto counts = sv::rle_counts(r, {true, true, true, true});
  EXPECT_EQ(counts[0], (std::vector<std::uint32_t>{0, 1, 4, 1}));
  EXPECT_EQ(counts[1], (std::vector<std::uint32_t>{1, 2, 3}));
  EXPECT_EQ(counts[2], (std::vector<std::uint32_t>{3, 2, 1}));
  EXPECT_EQ(counts[3], (std::vector<std::uint32_t>{6}));  // absent: one run of 0s
  // pycocotools' strings for these counts (mask.encode of the same masks).
  EXPECT_EQ(sv::rle_string({6}), "6");
  EXPECT_EQ(sv::rle_string({1, 2, 3}), "123");
  EXPECT_EQ(sv::rle_string({0, 1, 4, 1}), "0140");
  EXPECT_EQ(sv::rle_string({3, 2, 1}), "321");
  EXPECT_EQ(sv::rle_string({100000}), "PeQ3");
}

TEST(UnitServeEncode, ClassesByNameOrIndex) {
  const std::vector<std::string> names = {"Background", "Hair", "Face_Neck"};
  EXPECT_EQ(sv::parse_classes("", names), sv::ClassSet{});
  EXPECT_EQ(sv::parse_classes("hair, 2", names), (sv::ClassSet{false, true, true}));
  ss::test::expect_error([&] { sv::parse_classes("3", names); }, ss::ErrorCode::kInvalidInput,
                         {"out of range"});
  ss::test::expect_error([&] { sv::parse_classes("Nose", names); }, ss::ErrorCode::kInvalidInput,
                         {"Nose"});
  ss::test::expect_error([&] { sv::parse_classes("1,,2", names); }, ss::ErrorCode::kInvalidInput,
                         {"empty"});
}

// The queue with the tiny fixture: a full queue refuses, jobs queued within the delay share one
// batch, an abandoned job is dropped unrun, and batched labels equal single calls.
TEST(UnitServeBatcher, BatchesDropsAndMatchesSingleCalls) {
  ss::LoadOptions o;
  o.accept_noncommercial = true;
  o.input_height = 128;
  o.input_width = 96;
  const ss::Model model = ss::load(ss::test::fixture("tiny_b_torchscript.pt2"), o);
  sv::Metrics metrics;
  metrics.set_models({"m"});
  sv::BatchSettings settings;
  settings.max_batch = 4;
  settings.max_delay = std::chrono::milliseconds(2000);
  settings.max_queue = 3;
  sv::Batcher batcher(model, "m", settings, metrics);

  const std::vector<std::string> images = {"synth_300x211.png", "astronaut.jpg", "synth_33x47.png"};
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::shared_ptr<sv::Job>> jobs;
  for (const auto& name : images) {
    ASSERT_TRUE(batcher.reserve());
    const std::string bytes = read_file(ss::test::fixture("images/" + name));
    auto job = std::make_shared<sv::Job>();
    job->prepared = model.prepare(ss::Input::encoded({bytes.begin(), bytes.end()}));
    job->done = [&] {
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      cv.notify_all();
    };
    jobs.push_back(job);
  }
  EXPECT_FALSE(batcher.reserve());  // three slots, all taken
  jobs[1]->abandoned = true;        // its client went away while it waited
  for (auto& job : jobs) batcher.submit(job);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done == 3; }));
  }
  EXPECT_EQ(batcher.depth(), 0u);
  EXPECT_TRUE(jobs[1]->dropped);
  EXPECT_FALSE(jobs[1]->result);
  for (const std::size_t k : {0u, 2u}) {
    ASSERT_TRUE(jobs[k]->result) << (jobs[k]->error ? jobs[k]->error->what() : "");
    const ss::Result single =
        model.segment(ss::Input::file(ss::test::fixture("images/" + images[k])));
    EXPECT_EQ(jobs[k]->result->labels, single.labels) << images[k];
    EXPECT_GE(jobs[k]->queue_ms, 0.0);
  }
  const std::string text = metrics.text([](const std::string&) { return 0; });
  EXPECT_NE(text.find("sapiens_seg_batches_total{model=\"m\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("sapiens_seg_images_total{model=\"m\"} 2\n"), std::string::npos);
  batcher.stop();
}
