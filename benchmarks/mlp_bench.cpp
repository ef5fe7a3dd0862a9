// mlp_bench: Sapiens2's CPU MLP the ways the fused blocks run it, random maps of the released
// models' shapes (0.4b: C 1024, F 4096; 1b: C 1536, F 6144), same process, same threads, the ways
// in rotating order round by round so that a change in the machine's speed hits them alike.
//
// - float32, the gate (w12 and SwiGLU): w12 whole into an [M, 2F] map then fused_swiglu, as the
//   authors' module does, or w12 a pair of column chunks at a time with fused_swiglu_columns
//   (SAPIENS_SEG_CPU_MLP_COLUMNS), at 3077 tokens.
// - bfloat16 ("rows"), the whole MLP (w12, fused_swiglu, w3) at 3081 tokens (1024x768: 3072
//   patches and 9 prefix tokens): whole, as the authors' module runs it, or by row chunks of 1024
//   tokens, the last chunk the remainder (1024 x 3 + 9) or taking it in (cpu/row_chunks.hpp:
//   1024, 1024, 1033). The MLP of 8 distinct layers a round, so that each layer's weights come
//   from memory as in the network (192 MB at 0.4b).
//
//   mlp_bench [--reps N] [--json FILE] [--only TEXT]
//
// Prints, per shape and way: the median milliseconds, GFLOP/s of w12 (float32), the median over
// rounds of the first way's time over this way's within the same round (above 1: faster), and
// whether the output has the first way's bits (the column chunks are used by the library only
// where they do).
#include <algorithm>
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
#include "core/cpu/row_chunks.hpp"
#include "core/v2/cpu_ops.hpp"

namespace {

struct Shape {
  const char* name;
  int64_t tokens, C, F;
};

// The bfloat16 MLP by row chunks, two plans: {name, chunk sizes}.
void run_rows(const Shape& s, int reps, nlohmann::json& rows) {
  constexpr int64_t kRows = 1024, kTokens = 3081, kLayers = 8;
  const int64_t M = kTokens, C = s.C, F = s.F;
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  at::manual_seed(5);
  const at::Tensor h = at::randn({M, C}).to(at::kBFloat16);
  std::vector<at::Tensor> w12, b12, w3, b3;
  for (int64_t l = 0; l < kLayers; ++l) {
    w12.push_back((at::randn({2 * F, C}) / std::sqrt(static_cast<double>(C))).to(at::kBFloat16));
    b12.push_back((at::randn({2 * F}) * 0.1).to(at::kBFloat16));
    w3.push_back((at::randn({C, F}) / std::sqrt(static_cast<double>(F))).to(at::kBFloat16));
    b3.push_back((at::randn({C}) * 0.1).to(at::kBFloat16));
  }
  std::vector<int64_t> remainder, taken_in;
  for (int64_t r = 0; r < M; r += kRows) remainder.push_back(std::min(kRows, M - r));
  for (int64_t r = 0, n = 0; r < M; r += n) {
    n = sapiens_seg::core::cpu::chunk_rows_at(r, M, kRows);
    taken_in.push_back(n);
  }
  const std::vector<std::pair<std::string, std::vector<int64_t>>> plans = {
      {"whole", {M}}, {"remainder chunk", remainder}, {"remainder taken in", taken_in}};
  const int64_t most = M;  // the whole way's map
  const at::Tensor g = at::empty({most, 2 * F}, bf16), a = at::empty({most, F}, bf16);
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < plans.size(); ++i) outs.push_back(at::empty({M, C}, bf16));
  auto way = [&](size_t i) {
    for (int64_t l = 0; l < kLayers; ++l) {
      int64_t r = 0;
      for (const int64_t n : plans[i].second) {
        at::Tensor gn = g.narrow(0, 0, n), an = a.narrow(0, 0, n), on = outs[i].narrow(0, r, n);
        at::addmm_out(gn, b12[l], h.narrow(0, r, n), w12[l].t());
        sapiens_seg::core::v2::fused_swiglu(an, gn);
        at::addmm_out(on, b3[l], an, w3[l].t());
        r += n;
      }
    }
  };
  std::vector<std::vector<double>> times(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) way(i);  // warm-up
  for (int r = 0; r < reps; ++r) {
    for (size_t k = 0; k < plans.size(); ++k) {
      const size_t i = (k + static_cast<size_t>(r)) % plans.size();
      const auto t0 = std::chrono::steady_clock::now();
      way(i);
      times[i].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
          kLayers);
    }
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    std::vector<double> ratios(times[i].size());
    for (size_t r = 0; r < ratios.size(); ++r) ratios[r] = times[0][r] / times[i][r];
    const double ms = bench::median(times[i]);
    const bool same = outs[i].view(at::kShort).equal(outs[0].view(at::kShort));
    std::string chunks;
    for (const int64_t n : plans[i].second)
      chunks += (chunks.empty() ? "" : ",") + std::to_string(n);
    std::printf("%-5s bf16 rows %-19s %8.2f ms a layer  first/this %.3f  %s  (%s)\n", s.name,
                plans[i].first.c_str(), ms, bench::median(ratios),
                same ? "bit-identical" : "DIFFERENT BITS", chunks.c_str());
    rows.push_back({{"shape", std::string(s.name) + " rows"},
                    {"dtype", "bfloat16"},
                    {"tokens", M},
                    {"C", C},
                    {"F", F},
                    {"way", plans[i].first},
                    {"chunks", plans[i].second},
                    {"ms_per_layer", ms},
                    {"layer_ms", times[i]},
                    {"first_over_this_paired_median", bench::median(ratios)},
                    {"bit_identical_to_first", same}});
  }
}

int run(int argc, char** argv) {
  bench::Args args{9, "", ""};
  if (!bench::parse_args(argc, argv, "mlp_bench [--reps N] [--json FILE] [--only TEXT]", args)) {
    return 2;
  }
  c10::InferenceMode guard;
  const std::vector<Shape> shapes = {{"0.4b", 3077, 1024, 4096}, {"1b", 3077, 1536, 6144}};
  const std::vector<int64_t> widths = {0, 256, 512, 1024};  // 0: whole
  nlohmann::json rows = nlohmann::json::array();
  for (const Shape& s : shapes) {
    if (!args.only.empty() && std::string(s.name).find(args.only) == std::string::npos) continue;
    const int64_t M = s.tokens, C = s.C, F = s.F;
    at::manual_seed(3);
    const at::Tensor h = at::randn({M, C});
    const at::Tensor w12 = at::randn({2 * F, C}) * (1.0 / std::sqrt(static_cast<double>(C)));
    const at::Tensor b12 = at::randn({2 * F}) * 0.1;
    const at::Tensor g = at::empty({M, 2 * F});
    const at::Tensor gu = at::empty({2 * M * widths.back()});
    std::vector<at::Tensor> outs;
    for (size_t i = 0; i < widths.size(); ++i) outs.push_back(at::empty({M, F}));
    auto way = [&](size_t i) {
      const int64_t width = widths[i];
      if (width == 0) {
        at::Tensor o = g;
        at::addmm_out(o, b12, h, w12.t());
        sapiens_seg::core::v2::fused_swiglu(outs[i], g);
        return;
      }
      for (int64_t j = 0; j < F; j += width) {
        const int64_t w = std::min(width, F - j);
        at::Tensor gc = gu.narrow(0, 0, M * w).view({M, w});
        at::Tensor uc = gu.narrow(0, M * w, M * w).view({M, w});
        at::addmm_out(gc, b12.narrow(0, j, w), h, w12.narrow(0, j, w).t());
        at::addmm_out(uc, b12.narrow(0, F + j, w), h, w12.narrow(0, F + j, w).t());
        sapiens_seg::core::v2::fused_swiglu_columns(outs[i], gc, uc, j);
      }
    };
    std::vector<std::vector<double>> times(widths.size());
    for (size_t i = 0; i < widths.size(); ++i) way(i);  // warm-up
    for (int r = 0; r < args.reps; ++r) {
      for (size_t k = 0; k < widths.size(); ++k) {
        const size_t i = (k + static_cast<size_t>(r)) % widths.size();
        const auto t0 = std::chrono::steady_clock::now();
        way(i);
        times[i].push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    }
    const double gflop =
        2.0 * static_cast<double>(M) * static_cast<double>(C) * 2.0 * static_cast<double>(F) / 1e9;
    for (size_t i = 0; i < widths.size(); ++i) {
      std::vector<double> ratios(times[i].size());
      for (size_t r = 0; r < ratios.size(); ++r) ratios[r] = times[0][r] / times[i][r];
      const double ms = bench::median(times[i]);
      const bool same = outs[i].view(at::kInt).equal(outs[0].view(at::kInt));
      const std::string name = widths[i] == 0 ? "whole" : "columns " + std::to_string(widths[i]);
      std::printf("%-5s %-13s %8.1f ms  %6.1f GFLOP/s  whole/this %.3f  %s\n", s.name, name.c_str(),
                  ms, gflop / ms * 1e3, bench::median(ratios),
                  same ? "bit-identical" : "DIFFERENT BITS");
      rows.push_back({{"shape", s.name},
                      {"tokens", M},
                      {"C", C},
                      {"F", F},
                      {"way", name},
                      {"ms", ms},
                      {"calls_ms", times[i]},
                      {"gflop_w12", gflop},
                      {"whole_over_this_paired_median", bench::median(ratios)},
                      {"bit_identical_to_whole", same}});
    }
  }
  for (const Shape& s : shapes) {
    const std::string name = std::string(s.name) + " rows";
    if (!args.only.empty() && name.find(args.only) == std::string::npos) continue;
    run_rows(s, args.reps, rows);
  }
  bench::write_result(args.json_out, args.reps, rows);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlp_bench: %s\n", e.what());
    return 1;
  }
}
