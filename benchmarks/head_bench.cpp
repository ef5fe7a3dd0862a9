// head_bench: the paths of the CPU decoder head (core/head: sub-pixel GEMMs on LibTorch's BLAS,
// oneDNN's convolutions, the two mixed by layer width, Winograd F(2x2, 2x2) deconvolutions in
// float32) against each other on the released heads' shapes at 1024x768, and on each of
// Sapiens2's deconvolutions alone; same process, same threads, same input, calls in rotating
// order. The measurement behind cpu_head_path (which path a CPU gets by default).
//
//   head_bench [--reps N] [--json FILE] [--only TEXT]
//
// Prints one row per case, dtype and path: median milliseconds, GFLOP/s of the direct
// computation (16 multiply-adds per input pixel of each transposed convolution, one per pixel of
// each 1x1 convolution; Winograd's own GEMMs are 9/16 of the deconvolutions'), the time against
// the gemm path's (above 1: faster), and the largest difference from the gemm path's logits.
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "bench_util.hpp"
#include "core/cpu/cpuid.hpp"
#include "core/head/cpu_head.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace head = sapiens_seg::core::head;

struct Case {
  const char* name;
  int64_t in_channels, grid_h, grid_w;  // the head's input
  std::vector<int64_t> deconv, conv;
  int64_t classes;
};

// The released heads (the project's spec; v1: VitHead with three 768-wide deconvolutions and
// convolutions; Sapiens2: four deconvolutions 512..64, two 64-wide convolutions), on the 64 x 48
// token grid of a 1024x768 input with patch 16; then Sapiens2's deconvolutions one by one (each
// with a 29-class classifier after it, a few percent of its work), for a per-layer choice.
const Case kCases[] = {
    {"v1 0.3b (C 1024)", 1024, 64, 48, {768, 768, 768}, {768, 768, 768}, 28},
    {"sapiens2 0.4b (C 1024)", 1024, 64, 48, {512, 256, 128, 64}, {64, 64}, 29},
    {"s2 deconv 1024>512", 1024, 64, 48, {512}, {}, 29},
    {"s2 deconv 512>256", 512, 128, 96, {256}, {}, 29},
    {"s2 deconv 256>128", 256, 256, 192, {128}, {}, 29},
    {"s2 deconv 128>64", 128, 512, 384, {64}, {}, 29},
};

double gflop(const Case& c) {
  double f = 0, h = double(c.grid_h), w = double(c.grid_w), in = double(c.in_channels);
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
  std::printf("%-24s %-9s %-9s %10s %9s %8s %9s %s\n", "case", "dtype", "path", "ms", "GF/s",
              "vs_gemm", "max|diff|", "library default");
  for (const Case& c : kCases) {
    if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
    for (const at::ScalarType dtype : dtypes) {
      at::manual_seed(0);
      const head::HeadWeights w = weights(c, dtype);
      // The direct paths, Winograd on every deconvolution (float32), and the library's default
      // for this CPU (path and Winograd rule as a load would pick them).
      const int64_t width = c.conv.empty() ? c.deconv.back() : c.conv.back();
      struct Variant {
        std::string name;
        head::CpuHeadPath path;
        head::Winograd wino;
      };
      const head::CpuHeadPath def_path = head::cpu_head_path(dtype, width);
      std::vector<Variant> variants{{"gemm", head::CpuHeadPath::kGemm, head::Winograd::kOff},
                                    {"onednn", head::CpuHeadPath::kOnednn, head::Winograd::kOff},
                                    {"mixed", head::CpuHeadPath::kMixed, head::Winograd::kOff}};
      if (dtype == at::kFloat) variants.push_back({"winograd", def_path, head::Winograd::kAll});
      variants.push_back({"default", def_path, head::cpu_head_winograd(dtype)});
      std::vector<head::CpuHead> heads;
      heads.reserve(variants.size());
      for (const auto& v : variants) heads.emplace_back(w, v.path, v.wino);
      const at::Tensor feat = at::randn({1, c.grid_h * c.grid_w, c.in_channels}).to(dtype);
      const size_t n = heads.size();
      std::vector<std::vector<double>> times(n);
      std::vector<double> diff(n, 0.0);
      at::Tensor ref;
      for (int r = 0; r <= reps; ++r) {  // round 0 warms up and compares; the order rotates
        for (size_t k = 0; k < n; ++k) {
          const size_t i = (k + static_cast<size_t>(r)) % n;
          const auto t0 = Clock::now();
          const at::Tensor y = heads[i].forward(feat, c.grid_h, c.grid_w);
          const double ms = ms_since(t0);
          if (r > 0) times[i].push_back(ms);
          if (r == 0 && i == 0) ref = y.to(at::kFloat);
        }
        if (r == 0) {
          for (size_t i = 1; i < n; ++i) {
            const at::Tensor y = heads[i].forward(feat, c.grid_h, c.grid_w).to(at::kFloat);
            diff[i] = (y - ref).abs().max().item<double>();
          }
        }
      }
      const double gf = gflop(c), base = bench::median(times[0]);
      const char* dt = dtype == at::kFloat ? "float32" : "bfloat16";
      const std::string def = std::string(head::to_string(def_path)) + ", winograd " +
                              head::to_string(head::cpu_head_winograd(dtype)) + " (" +
                              std::to_string(heads.back().winograd_layers()) + " layers)";
      for (size_t i = 0; i < n; ++i) {
        const double ms = bench::median(times[i]);
        const char* name = variants[i].name.c_str();
        std::printf("%-24s %-9s %-9s %10.1f %9.1f %7.2fx %9.2g %s\n", c.name, dt, name, ms,
                    gf / ms * 1e3, base / ms, diff[i], def.c_str());
        std::fflush(stdout);
        rows.push_back({{"case", c.name},
                        {"dtype", dt},
                        {"path", name},
                        {"ms", ms},
                        {"calls_ms", times[i]},
                        {"gflop", gf},
                        {"gemm_ms_over_ms", base / ms},
                        {"logits_max_abs_diff_from_gemm", diff[i]},
                        {"default_path", def}});
      }
    }
  }
  bench::write_result(json_out, reps, rows);
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
