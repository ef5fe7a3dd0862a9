// head_bench: the two paths of the CPU decoder head (core/head: sub-pixel GEMMs on LibTorch's
// BLAS, or oneDNN's convolutions) against each other on the released heads' shapes at 1024x768,
// same process, same threads, same input, alternating calls. The measurement behind
// cpu_head_path (which path a CPU gets by default).
//
//   head_bench [--reps N] [--json FILE] [--only TEXT]
//
// Prints one row per case and dtype: median milliseconds of each path, GFLOP/s (the head's
// multiply-adds: 16 taps per input pixel of each transposed convolution, one per pixel of each
// 1x1 convolution) and the ratio (gemm / onednn; above 1 oneDNN is faster), plus the largest
// difference between the two paths' logits.
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include "bench_util.hpp"
#include "core/cpu/cpuid.hpp"
#include "core/head/cpu_head.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace head = sapiens_seg::core::head;

struct Case {
  const char* name;
  int64_t in_channels;
  std::vector<int64_t> deconv, conv;
  int64_t classes;
};

// The released heads (the project's spec; v1: VitHead with three 768-wide deconvolutions and
// convolutions; Sapiens2: four deconvolutions 512..64, two 64-wide convolutions), on the 64 x 48
// token grid of a 1024x768 input with patch 16.
const Case kCases[] = {
    {"v1 0.3b (C 1024)", 1024, {768, 768, 768}, {768, 768, 768}, 28},
    {"sapiens2 0.4b (C 1024)", 1024, {512, 256, 128, 64}, {64, 64}, 29},
};
constexpr int64_t kGridH = 64, kGridW = 48;

double gflop(const Case& c) {
  double f = 0, h = kGridH, w = kGridW, in = double(c.in_channels);
  for (int64_t out : c.deconv) {
    f += 2.0 * h * w * 16 * in * double(out);
    h *= 2, w *= 2, in = double(out);
  }
  for (int64_t out : c.conv) f += 2.0 * h * w * in * double(out), in = double(out);
  return (f + 2.0 * h * w * in * double(c.classes)) / 1e9;
}

head::HeadWeights weights(const Case& c, at::ScalarType dtype) {
  head::HeadWeights w;
  int64_t in = c.in_channels;
  for (int64_t out : c.deconv) {
    w.deconv_w.push_back((at::randn({in, out, 4, 4}) / std::sqrt(16.0 * double(in))).to(dtype));
    in = out;
  }
  for (int64_t out : c.conv) {
    w.conv_w.push_back((at::randn({out, in, 1, 1}) / std::sqrt(double(in))).to(dtype));
    w.conv_b.push_back(at::randn({out}).to(dtype));
    in = out;
  }
  w.seg_w = (at::randn({c.classes, in, 1, 1}) / std::sqrt(double(in))).to(dtype);
  w.seg_b = at::randn({c.classes}).to(dtype);
  return w;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int run(int argc, char** argv) {
  bench::Args args{3, "", ""};
  if (!bench::parse_args(argc, argv, "head_bench [--reps N] [--json FILE] [--only TEXT]", args))
    return 2;
  const int reps = args.reps;
  const std::string &json_out = args.json_out, &only = args.only;
  if (!at::hasMKLDNN()) {
    std::fprintf(stderr, "head_bench: this LibTorch has no oneDNN, only the GEMM path runs\n");
    return 1;
  }
  c10::InferenceMode guard;
  // bfloat16 only where the CPU has bf16 dot products: elsewhere LibTorch's bf16 GEMM is a scalar
  // fallback and the library refuses the dtype (core/cpu/cpuinfo.hpp).
  std::vector<at::ScalarType> dtypes{at::kFloat};
  if (sapiens_seg::core::host_cpu_features().avx512_bf16) dtypes.push_back(at::kBFloat16);
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-24s %-9s %10s %10s %9s %9s %7s %9s %s\n", "case", "dtype", "gemm_ms", "onednn_ms",
              "gemm_GF/s", "dnn_GF/s", "ratio", "max|diff|", "default");
  for (const Case& c : kCases) {
    if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
    for (const at::ScalarType dtype : dtypes) {
      at::manual_seed(0);
      const head::HeadWeights w = weights(c, dtype);
      const head::CpuHead gemm(w, head::CpuHeadPath::kGemm), dnn(w, head::CpuHeadPath::kOnednn);
      const at::Tensor feat = at::randn({1, kGridH * kGridW, c.in_channels}).to(dtype);
      std::vector<double> t_gemm, t_dnn;
      double diff = 0;
      for (int r = 0; r <= reps; ++r) {  // round 0 warms up; the order alternates
        for (int k = 0; k < 2; ++k) {
          const bool g = (r + k) % 2 == 0;
          const auto t0 = Clock::now();
          const at::Tensor y = (g ? gemm : dnn).forward(feat, kGridH, kGridW);
          const double ms = ms_since(t0);
          if (r > 0) (g ? t_gemm : t_dnn).push_back(ms);
          if (r == 0 && k == 1) {
            const at::Tensor other = (g ? dnn : gemm).forward(feat, kGridH, kGridW);
            diff = (y.to(at::kFloat) - other.to(at::kFloat)).abs().max().item<double>();
          }
        }
      }
      const double a = bench::median(t_gemm), b = bench::median(t_dnn), gf = gflop(c);
      const char* dt = dtype == at::kFloat ? "float32" : "bfloat16";
      const char* def = head::to_string(head::cpu_head_path(dtype, c.conv.back()));
      std::printf("%-24s %-9s %10.1f %10.1f %9.1f %9.1f %6.2fx %9.2g %s\n", c.name, dt, a, b,
                  gf / a * 1e3, gf / b * 1e3, a / b, diff, def);
      std::fflush(stdout);
      rows.push_back({{"case", c.name},
                      {"dtype", dt},
                      {"gemm_ms", a},
                      {"onednn_ms", b},
                      {"gemm_calls_ms", t_gemm},
                      {"onednn_calls_ms", t_dnn},
                      {"gflop", gf},
                      {"ratio_gemm_over_onednn", a / b},
                      {"logits_max_abs_diff", diff},
                      {"default_path", def}});
    }
  }
  if (!json_out.empty()) {
    nlohmann::json out = bench::machine_json();
    out["libtorch"] = TORCH_VERSION;
    out["reps"] = reps;
    out["rows"] = rows;
    std::ofstream(json_out) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "head_bench: %s\n", e.what());
    return 1;
  }
}
