// resize_bench: the library's resizes (core/resize) against cv::resize of the linked OpenCV, on
// the resizes the two families' demos make, same process, same threads, alternating calls.
//
//   resize_bench [--threads N] [--reps N] [--json FILE] [--only TEXT] [--portable]
//
// --portable times the plain C++ loops (what a CPU without AVX2 runs) instead of this CPU's.
//
// Prints one row per case: median milliseconds of each and the ratio (library / OpenCV; below 1
// is faster). The OpenCV column is the build this binary links (Debian's has no IPP, so its
// INTER_CUBIC is OpenCV's own code); tests/python/test_resize.py holds the bytes to the PyPI wheel.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/core/utility.hpp>
#include <opencv2/imgproc.hpp>

#include "bench_util.hpp"
#include "core/resize/resize.hpp"
#include "core/resize/wheel_cubic.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace core = sapiens_seg::core;

struct Case {
  int h, w, H, W;
  core::Interp interp;
  core::CubicFlavor flavor;
};

cv::Mat test_image(int h, int w) {
  cv::Mat m(h, w, CV_8UC3);
  std::mt19937 rng(static_cast<unsigned>(h * 7919 + w));
  for (int y = 0; y < h; ++y) {
    auto* p = m.ptr<std::uint8_t>(y);
    for (int x = 0; x < w * 3; ++x) p[x] = static_cast<std::uint8_t>((x + y) % 251 ^ (rng() & 15));
  }
  return m;
}

int cv_flag(core::Interp i) {
  return i == core::Interp::kLinear ? cv::INTER_LINEAR
         : i == core::Interp::kArea ? cv::INTER_AREA
                                    : cv::INTER_CUBIC;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, reps = 21;
  std::string json_out, only;
  auto simd = core::resize_detail::host_simd();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else if (a == "--json" && i + 1 < argc) {
      json_out = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--portable") {
      simd = core::resize_detail::Simd::kPortable;
    } else {
      std::fprintf(stderr,
                   "usage: resize_bench [--threads N] [--reps N] [--json FILE] [--only TEXT] "
                   "[--portable]\n");
      return 2;
    }
  }
  if (threads > 0) at::set_num_threads(threads);
  cv::setNumThreads(at::get_num_threads());

  const auto L = core::Interp::kLinear, A = core::Interp::kArea, C = core::Interp::kCubic;
  const auto wheel = core::CubicFlavor::kWheel, own = core::CubicFlavor::kOpenCV;
  const std::vector<Case> cases = {
      {480, 640, 1024, 768, L, own},    {1080, 1920, 1024, 768, L, own},
      {3000, 4000, 1024, 768, L, own},  {2048, 1536, 1024, 768, L, own},
      {480, 640, 1024, 768, C, own},    {480, 640, 1024, 768, C, wheel},
      {512, 512, 1024, 768, C, own},    {512, 512, 1024, 768, C, wheel},
      {1500, 700, 1024, 768, C, wheel}, {1080, 1920, 1024, 768, A, own},
      {3000, 4000, 1024, 768, A, own},  {4000, 3000, 1024, 768, A, own},
      {2048, 1536, 1024, 768, A, own},  {600, 1000, 1024, 768, A, own}};

  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-26s %-7s %10s %10s %7s\n", "resize", "cubic", "library ms", "OpenCV ms", "ratio");
  for (const Case& c : cases) {
    const std::string name = std::to_string(c.h) + "x" + std::to_string(c.w) + " -> " +
                             std::to_string(c.H) + "x" + std::to_string(c.W) + " " +
                             core::to_string(c.interp);
    if (!only.empty() && name.find(only) == std::string::npos) continue;
    const cv::Mat src = test_image(c.h, c.w);
    cv::Mat ours(c.H, c.W, CV_8UC3), theirs;
    auto run_ours = [&] {
      core::resize_detail::resize_u8_simd({src.data, c.h, c.w, 3, src.step},
                                          {ours.data, c.H, c.W, 3, ours.step}, c.interp, c.flavor,
                                          simd);
    };
    auto run_cv = [&] { cv::resize(src, theirs, cv::Size(c.W, c.H), 0, 0, cv_flag(c.interp)); };
    run_ours();
    run_cv();
    std::vector<double> t_ours, t_cv;
    for (int r = 0; r < reps; ++r) {  // alternating, so load on the machine hits both alike
      auto t0 = Clock::now();
      run_ours();
      t_ours.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      t0 = Clock::now();
      run_cv();
      t_cv.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    const double a = bench::median(t_ours), b = bench::median(t_cv);
    const char* flavor = c.interp != C ? "" : c.flavor == wheel ? "wheel" : "opencv";
    std::printf("%-26s %-7s %10.2f %10.2f %6.2fx\n", name.c_str(), flavor, a, b, a / b);
    rows.push_back({{"resize", name},
                    {"cubic", flavor},
                    {"library_ms", a},
                    {"opencv_ms", b},
                    {"ratio", a / b}});
  }
  if (!json_out.empty()) {
    const nlohmann::json out = {
        {"date", bench::today()},
        {"cpu", bench::read_first("/proc/cpuinfo", "model name")},
        {"cpu_id", bench::cpu_id_json()},
        {"cpu_flags", bench::read_first("/proc/cpuinfo", "flags")},
        {"threads", at::get_num_threads()},
        // which host loops and which of the wheel's cubic paths ran
        {"host_loops", core::resize_detail::to_string(core::resize_detail::host_simd())},
        {"wheel_cubic_path", core::resize_detail::to_string(core::resize_detail::wheel_ipp_path())},
        {"load_average", bench::read_first("/proc/loadavg", "")},
        {"opencv", CV_VERSION},
        {"reps", reps},
        {"rows", rows}};
    std::ofstream(json_out) << out.dump(2) << "\n";
  }
  return 0;
}
