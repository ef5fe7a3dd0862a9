// attention_bench: the CPU attention kernel (core/attention) against LibTorch's
// at::scaled_dot_product_attention on the networks' attention shapes at 1024x768, same process,
// same threads, alternating calls, on every kernel path this CPU runs: float32 on AVX-512 and on
// AVX2 + FMA, bfloat16 where the CPU has AVX512-BF16.
//
//   attention_bench [--reps N] [--json FILE] [--only TEXT]
//
// Prints one row per case: median milliseconds of each, GFLOP/s (4 N^2 hd per head) and the
// ratio (LibTorch / kernel; above 1 the kernel is faster). Both get q, k, v as the networks hand
// them over (v1: strided views of the fused qkv GEMM's output) and return merged heads.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "bench_util.hpp"
#include "core/attention/cpu_attention.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace attn = sapiens_seg::core::attention;

struct Case {
  const char* name;
  int64_t heads, kv_heads, tokens, hd;
  bool fused_qkv;  // v1's q, k, v: views of one [B, N, 3, heads, hd] tensor
};

// 1024x768 with patch 16: 64 x 48 = 3072 tokens; Sapiens2 puts 9 prefix tokens (cls and 8
// registers) before them. Heads and head dims from the models' configurations.
const Case kCases[] = {
    {"v1 0.3b/1b (hd 64)", 16, 16, 3072, 64, true}, {"v1 0.6b (hd 80)", 16, 16, 3072, 80, true},
    {"v1 2b (hd 60)", 32, 32, 3072, 60, true},      {"sapiens2 0.4b MHA", 16, 16, 3081, 64, false},
    {"sapiens2 0.4b GQA", 16, 8, 3081, 64, false},
};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args{5, "", ""};
  if (!bench::parse_args(argc, argv, "attention_bench [--reps N] [--json FILE] [--only TEXT]",
                         args))
    return 2;
  const int reps = args.reps;
  const std::string &json_out = args.json_out, &only = args.only;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-24s %-9s %-11s %12s %12s %9s %9s %7s\n", "case", "dtype", "path", "libtorch_ms",
              "kernel_ms", "lib_GF/s", "ker_GF/s", "ratio");
  for (const Case& c : kCases) {
    if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
    for (const attn::CpuAttentionPath path :
         {attn::CpuAttentionPath::kAvx512, attn::CpuAttentionPath::kAvx2,
          attn::CpuAttentionPath::kAvx512Bf16, attn::CpuAttentionPath::kAmxBf16}) {
      const at::ScalarType dtype =
          path == attn::CpuAttentionPath::kAvx512Bf16 || path == attn::CpuAttentionPath::kAmxBf16
              ? at::kBFloat16
              : at::kFloat;
      if (!attn::cpu_attention_runs(path, dtype, c.hd)) continue;  // not on this CPU
      at::manual_seed(0);
      at::Tensor q, k, v;
      if (c.fused_qkv) {
        const at::Tensor qkv = at::randn({1, c.tokens, 3, c.heads, c.hd}).to(dtype);
        const at::Tensor q5 = qkv.permute({2, 0, 3, 1, 4});
        q = q5[0], k = q5[1], v = q5[2];
      } else {
        q = at::randn({1, c.tokens, c.heads, c.hd}).to(dtype).transpose(1, 2);
        k = at::randn({1, c.tokens, c.kv_heads, c.hd}).to(dtype).transpose(1, 2);
        v = at::randn({1, c.tokens, c.kv_heads, c.hd}).to(dtype).transpose(1, 2);
      }
      std::vector<double> t_lib, t_ker;
      for (int r = 0; r <= reps; ++r) {  // round 0 warms up
        auto t0 = Clock::now();
        at::Tensor a = attn::cpu_attention(q, k, v, attn::CpuAttentionPath::kLibTorch);
        const double lib = ms_since(t0);
        t0 = Clock::now();
        at::Tensor b = attn::cpu_attention(q, k, v, path);
        const double ker = ms_since(t0);
        if (r > 0) t_lib.push_back(lib), t_ker.push_back(ker);
      }
      const double a = bench::median(t_lib), b = bench::median(t_ker);
      const double gflop =
          4.0 * double(c.tokens) * double(c.tokens) * double(c.hd) * double(c.heads) / 1e9;
      const char* dt = dtype == at::kFloat ? "float32" : "bfloat16";
      std::printf("%-24s %-9s %-11s %12.1f %12.1f %9.1f %9.1f %6.2fx\n", c.name, dt,
                  attn::to_string(path), a, b, gflop / a * 1e3, gflop / b * 1e3, a / b);
      std::fflush(stdout);
      rows.push_back({{"case", c.name},
                      {"dtype", dt},
                      {"kernel_path", attn::to_string(path)},
                      {"libtorch_ms", a},
                      {"kernel_ms", b},
                      {"gflop", gflop},
                      {"ratio_libtorch_over_kernel", a / b}});
    }
  }
  bench::write_result(json_out, reps, rows);
  return 0;
}
