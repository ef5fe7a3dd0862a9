// The CPU attention kernel (core/attention) against attention computed in float64 from the same
// inputs, beside LibTorch's own kernel in the same dtype: the bar for the kernel is to be as close
// to the exact result as LibTorch's at::scaled_dot_product_attention is.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/attention/cpu_attention.hpp"
#include "core/cpu/cpuid.hpp"
#include "core/cpu/cpuinfo.hpp"
#include "sapiens_seg/error.hpp"
#include "test_util.hpp"

using namespace sapiens_seg;
using core::attention::cpu_attention;
using core::attention::cpu_attention_path;
using core::attention::cpu_attention_runs;
using core::attention::CpuAttentionPath;
using sapiens_seg::test::expect_error;

namespace {

struct Case {
  int64_t B, Hq, Hk, N, hd;
};

// Logits spread over ~+-20 (scale 1/sqrt(hd) included), as trained attention's are, so that the
// softmax is peaked and its max subtraction and exp are exercised, not only a flat average.
struct Qkv {
  at::Tensor q, k, v;
};
Qkv random_qkv(const Case& c, at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  auto opt = at::TensorOptions().dtype(at::kFloat);
  Qkv r;
  r.q = (at::randn({c.B, c.Hq, c.N, c.hd}, opt) * 2.0).to(dtype);
  r.k = (at::randn({c.B, c.Hk, c.N, c.hd}, opt) * 2.0).to(dtype);
  r.v = at::randn({c.B, c.Hk, c.N, c.hd}, opt).to(dtype);
  return r;
}

// [B, N, Hq * hd] in float64 from the inputs' values.
at::Tensor exact(const Qkv& x) {
  at::Tensor q = x.q.to(at::kDouble), k = x.k.to(at::kDouble), v = x.v.to(at::kDouble);
  const int64_t B = q.size(0), Hq = q.size(1), N = q.size(2), hd = q.size(3);
  k = k.repeat_interleave(Hq / k.size(1), 1);
  v = v.repeat_interleave(Hq / v.size(1), 1);
  at::Tensor p = at::softmax(at::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(hd)), -1);
  return at::matmul(p, v).transpose(1, 2).reshape({B, N, Hq * hd});
}

double max_err(const at::Tensor& got, const at::Tensor& ref) {
  return (got.to(at::kDouble) - ref).abs().max().item<double>();
}
double mean_err(const at::Tensor& got, const at::Tensor& ref) {
  return (got.to(at::kDouble) - ref).abs().mean().item<double>();
}

const Case kCases[] = {
    {1, 2, 2, 200, 64},   // v1's head dim, N not a multiple of the 64-key tile
    {2, 4, 2, 77, 80},    // 0.6b's head dim (5 vectors), grouped kv heads (Sapiens2's GQA)
    {1, 3, 1, 5, 60},     // 2b's head dim (a masked tail vector), one kv head for three
    {1, 1, 1, 1, 64},     // one token: the softmax of one score is 1
    {1, 2, 2, 130, 128},  // the widest head dim the kernel takes
    {1, 2, 2, 64, 32},    // one tile exactly
    {2, 4, 2, 300, 20},   // the Sapiens2 tiny fixture's head dim (a 4-wide tail vector)
};

std::string name(const Case& c) {
  return "B" + std::to_string(c.B) + " Hq" + std::to_string(c.Hq) + " Hk" + std::to_string(c.Hk) +
         " N" + std::to_string(c.N) + " hd" + std::to_string(c.hd);
}

}  // namespace

TEST(UnitCpuAttention, PathFollowsTheCpu) {
  const core::CpuFeatures& f = core::host_cpu_features();
  const bool avx2 = f.avx2_fma();
  // float32 runs the kernel where it was measured faster: AMD cores (SAPIENS_SEG_CPU_ATTENTION=
  // kernel forces it elsewhere).
  const CpuAttentionPath f32_kernel = f.avx512_core() ? CpuAttentionPath::kAvx512
                                      : avx2          ? CpuAttentionPath::kAvx2
                                                      : CpuAttentionPath::kLibTorch;
  EXPECT_EQ(cpu_attention_path(at::kFloat, 64), f.amd ? f32_kernel : CpuAttentionPath::kLibTorch);
  EXPECT_EQ(test::with_env("SAPIENS_SEG_CPU_ATTENTION", "kernel",
                           [] { return cpu_attention_path(at::kFloat, 64); }),
            f32_kernel);
  // bfloat16 runs the kernel on CPUs with AVX512-BF16: its AMX path where the tiles run and take
  // the head dim (a multiple of 32), else the AVX512-BF16 one except on CPUs with AMX-BF16 (whose
  // tiles make LibTorch's attention the faster there); =kernel forces the widest kernel.
  const bool bf16_kernel = f.avx512_core() && f.avx512_bf16;
  const bool amx = cpu_attention_runs(CpuAttentionPath::kAmxBf16, at::kBFloat16, 64);
  EXPECT_TRUE(!amx || (f.amx_bf16_os() && bf16_kernel)) << "AMX ran without its CPU bits";
  const CpuAttentionPath vdp =
      bf16_kernel && core::attention::bfloat16_kernel_beats_libtorch(core::cpu_caps())
          ? CpuAttentionPath::kAvx512Bf16
          : CpuAttentionPath::kLibTorch;
  EXPECT_EQ(cpu_attention_path(at::kBFloat16, 64), amx ? CpuAttentionPath::kAmxBf16 : vdp);
  EXPECT_EQ(cpu_attention_path(at::kBFloat16, 96), amx ? CpuAttentionPath::kAmxBf16 : vdp);
  EXPECT_EQ(cpu_attention_path(at::kBFloat16, 80), vdp);
  EXPECT_EQ(test::with_env("SAPIENS_SEG_CPU_ATTENTION", "kernel",
                           [] { return cpu_attention_path(at::kBFloat16, 64); }),
            amx           ? CpuAttentionPath::kAmxBf16
            : bf16_kernel ? CpuAttentionPath::kAvx512Bf16
                          : CpuAttentionPath::kLibTorch);
  EXPECT_EQ(test::with_env("SAPIENS_SEG_CPU_ATTENTION", "kernel",
                           [] { return cpu_attention_path(at::kBFloat16, 80); }),
            bf16_kernel ? CpuAttentionPath::kAvx512Bf16 : CpuAttentionPath::kLibTorch);
  EXPECT_EQ(test::with_libtorch_attention([] { return cpu_attention_path(at::kBFloat16, 64); }),
            CpuAttentionPath::kLibTorch);
  EXPECT_EQ(cpu_attention_runs(CpuAttentionPath::kAvx2, at::kFloat, 64), avx2);
  EXPECT_FALSE(cpu_attention_runs(CpuAttentionPath::kAvx2, at::kBFloat16, 64));   // float32 only
  EXPECT_EQ(cpu_attention_path(at::kFloat, 129), CpuAttentionPath::kLibTorch);    // over 8 vectors
  EXPECT_EQ(cpu_attention_path(at::kBFloat16, 63), CpuAttentionPath::kLibTorch);  // odd: no pairs
  EXPECT_EQ(cpu_attention_path(at::kHalf, 64), CpuAttentionPath::kLibTorch);
  EXPECT_EQ(test::with_libtorch_attention([] { return cpu_attention_path(at::kFloat, 64); }),
            CpuAttentionPath::kLibTorch);
}

// The bfloat16 rule on other machines' /proc/cpuinfo flags: AMX-BF16 (tiles and their bfloat16
// products) hands attention to LibTorch; AVX512-BF16 alone keeps the kernel.
TEST(UnitCpuAttention, BFloat16KernelGivesWayToAmx) {
  using core::attention::bfloat16_kernel_beats_libtorch;
  const std::string avx512 =
      "vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n"
      "flags\t\t: avx f16c fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 "
      "avx512_fp16";
  EXPECT_TRUE(bfloat16_kernel_beats_libtorch(core::parse_cpuinfo(avx512 + "\n")));
  EXPECT_FALSE(bfloat16_kernel_beats_libtorch(
      core::parse_cpuinfo(avx512 + " amx_bf16 amx_tile amx_int8\n")));
  // AMX-INT8 alone (no bfloat16 tiles) does not count.
  EXPECT_TRUE(bfloat16_kernel_beats_libtorch(core::parse_cpuinfo(avx512 + " amx_tile amx_int8\n")));
  // Zen 4: AVX512-BF16, no AMX.
  EXPECT_TRUE(bfloat16_kernel_beats_libtorch(core::parse_cpuinfo(
      "vendor_id\t: AuthenticAMD\nflags\t\t: avx2 fma avx512f avx512dq avx512bw avx512vl "
      "avx512_bf16\n")));
}

TEST(UnitCpuAttention, RefusesWhatItCannotRun) {
  const Qkv x = random_qkv({1, 2, 2, 8, 64}, at::kFloat, 1);
  // A path for another dtype (or, on a CPU without AVX-512, any kernel path).
  expect_error([&] { cpu_attention(x.q, x.k, x.v, CpuAttentionPath::kAvx512Bf16); },
               ErrorCode::kInvalidInput, {"avx512-bf16", "cannot run", "Float"});
  const Qkv h = random_qkv({1, 2, 2, 8, 64}, at::kBFloat16, 1);
  expect_error([&] { cpu_attention(h.q, h.k, h.v, CpuAttentionPath::kAvx2); },
               ErrorCode::kInvalidInput, {"avx2", "cannot run", "BFloat16"});
  expect_error(
      [&] {
        cpu_attention(x.q, x.k.repeat({1, 2, 1, 1}).narrow(1, 0, 3), x.v,
                      CpuAttentionPath::kLibTorch);
      },
      ErrorCode::kInvalidInput, {"shapes"});
  expect_error([&] { cpu_attention(x.q, x.k.to(at::kBFloat16), x.v, CpuAttentionPath::kLibTorch); },
               ErrorCode::kInvalidInput, {"dtypes"});
}

// float32: within float32 rounding of the exact result, and no further from it than LibTorch;
// every float32 path this CPU can run (an AVX-512 CPU runs the AVX2 one too).
TEST(UnitCpuAttention, Float32MatchesExactAttention) {
  int ran = 0;
  for (CpuAttentionPath path : {CpuAttentionPath::kAvx512, CpuAttentionPath::kAvx2}) {
    if (!cpu_attention_runs(path, at::kFloat, 64)) continue;
    ++ran;
    uint64_t seed = 10;
    for (const Case& c : kCases) {
      SCOPED_TRACE(std::string(core::attention::to_string(path)) + " " + name(c));
      const Qkv x = random_qkv(c, at::kFloat, ++seed);
      const at::Tensor ref = exact(x);
      const at::Tensor got = cpu_attention(x.q, x.k, x.v, path);
      const at::Tensor lib = cpu_attention(x.q, x.k, x.v, CpuAttentionPath::kLibTorch);
      ASSERT_EQ(got.sizes(), ref.sizes());
      ASSERT_EQ(got.scalar_type(), at::kFloat);
      std::printf("float32 %-11s %-24s max |err| kernel %.3g, LibTorch %.3g\n",
                  core::attention::to_string(path), name(c).c_str(), max_err(got, ref),
                  max_err(lib, ref));
      EXPECT_LT(max_err(got, ref), 2e-5);
      EXPECT_LE(max_err(got, ref), 4 * max_err(lib, ref) + 2e-6);
    }
  }
  if (ran == 0) GTEST_SKIP() << "this CPU has neither AVX-512 nor AVX2 + FMA: no float32 kernel";
}

// Scores far apart (a row's terms spanning more than float32's exponent range) and the extremes
// of the exp: the softmax's max subtraction and its smallest terms, on every float32 path.
TEST(UnitCpuAttention, Float32PeakedSoftmax) {
  int ran = 0;
  for (CpuAttentionPath path : {CpuAttentionPath::kAvx512, CpuAttentionPath::kAvx2}) {
    if (!cpu_attention_runs(path, at::kFloat, 64)) continue;
    ++ran;
    SCOPED_TRACE(core::attention::to_string(path));
    Qkv x = random_qkv({1, 2, 2, 150, 64}, at::kFloat, 7);
    x.q = x.q * 40;  // logits up to ~+-2000: most terms underflow, a few dominate
    const at::Tensor ref = exact(x);
    const at::Tensor got = cpu_attention(x.q, x.k, x.v, path);
    const at::Tensor lib = cpu_attention(x.q, x.k, x.v, CpuAttentionPath::kLibTorch);
    EXPECT_TRUE(at::isfinite(got).all().item<bool>());
    EXPECT_LE(max_err(got, ref), 4 * max_err(lib, ref) + 2e-6)
        << "kernel " << max_err(got, ref) << ", LibTorch " << max_err(lib, ref);
  }
  if (ran == 0) GTEST_SKIP() << "this CPU has neither AVX-512 nor AVX2 + FMA: no float32 kernel";
}

// bfloat16: the probabilities and the output are rounded to bfloat16, as in LibTorch's kernel; the
// errors against the exact result are held to LibTorch's own in the same dtype, on each bfloat16
// path this CPU runs (the AMX one at the head dims it takes, multiples of 32).
TEST(UnitCpuAttention, Bfloat16AsCloseAsLibTorch) {
  int ran = 0;
  for (CpuAttentionPath path : {CpuAttentionPath::kAvx512Bf16, CpuAttentionPath::kAmxBf16}) {
    uint64_t seed = 20;
    for (const Case& c : kCases) {
      if (!cpu_attention_runs(path, at::kBFloat16, c.hd)) continue;
      ++ran;
      SCOPED_TRACE(std::string(core::attention::to_string(path)) + " " + name(c));
      const Qkv x = random_qkv(c, at::kBFloat16, ++seed);
      const at::Tensor ref = exact(x);
      const at::Tensor got = cpu_attention(x.q, x.k, x.v, path);
      const at::Tensor lib = cpu_attention(x.q, x.k, x.v, CpuAttentionPath::kLibTorch);
      ASSERT_EQ(got.scalar_type(), at::kBFloat16);
      const double lib_max = max_err(lib, ref), lib_mean = mean_err(lib, ref);
      std::printf("bfloat16 %-11s %-24s max |err| kernel %.3g, LibTorch %.3g; mean %.3g, %.3g\n",
                  core::attention::to_string(path), name(c).c_str(), max_err(got, ref), lib_max,
                  mean_err(got, ref), lib_mean);
      EXPECT_LE(max_err(got, ref), 1.5 * lib_max + 1e-3) << "LibTorch's max error " << lib_max;
      EXPECT_LE(mean_err(got, ref), 1.2 * lib_mean + 1e-5) << "LibTorch's mean error " << lib_mean;
      EXPECT_LT(max_err(got, ref), 2e-2);
    }
  }
  if (ran == 0) GTEST_SKIP() << "this CPU has no AVX512-BF16: no bfloat16 kernel runs here";
}

// The AMX path where the tiles' edges are: fewer query rows than a tile (1, 15, 17), a row count
// one past a pass (33), keys one past a 64-key tile (65), and the widest head dim it takes (128),
// each against the AVX512-BF16 kernel's products (the same packed panels, softmax and rounding;
// only the order of the float32 sums inside a dot product differs) and the exact result.
TEST(UnitCpuAttention, AmxTilesAtTheirEdges) {
  if (!cpu_attention_runs(CpuAttentionPath::kAmxBf16, at::kBFloat16, 64)) {
    GTEST_SKIP() << "this CPU (or its OS) offers no AMX-BF16 tiles";
  }
  EXPECT_FALSE(cpu_attention_runs(CpuAttentionPath::kAmxBf16, at::kBFloat16, 80));  // not 32k
  EXPECT_FALSE(cpu_attention_runs(CpuAttentionPath::kAmxBf16, at::kFloat, 64));
  uint64_t seed = 40;
  for (const Case& c : std::vector<Case>{{1, 2, 2, 1, 64},
                                         {1, 2, 1, 15, 64},
                                         {1, 1, 1, 17, 64},
                                         {2, 2, 2, 33, 64},
                                         {1, 4, 2, 65, 64},
                                         {1, 2, 2, 97, 128},
                                         {1, 2, 2, 64, 32}}) {
    SCOPED_TRACE(name(c));
    const Qkv x = random_qkv(c, at::kBFloat16, ++seed);
    const at::Tensor ref = exact(x);
    const at::Tensor got = cpu_attention(x.q, x.k, x.v, CpuAttentionPath::kAmxBf16);
    const at::Tensor vdp = cpu_attention(x.q, x.k, x.v, CpuAttentionPath::kAvx512Bf16);
    EXPECT_LT(max_err(got, ref), 2e-2);
    // bfloat16 outputs of one sum in two orders: at most a step or two of bfloat16 apart.
    EXPECT_LT((got.to(at::kFloat) - vdp.to(at::kFloat)).abs().max().item<double>(), 2e-2);
    EXPECT_LE(mean_err(got, ref), 1.2 * mean_err(vdp, ref) + 1e-5);
  }
}

// The packed panels are allocated uninitialised and only their padding is zeroed: a call whose K
// and V are NaN leaves NaN in the blocks the allocator hands the next call of the same panel sizes,
// whose V rows past N (100 keys of a 128-key pad) must still come out as zeros, or their zero
// probabilities turn every output NaN. Every path this CPU runs, against the exact result. (K's
// padded keys and V's columns past hd are zeroed too, but a NaN there would not show: those scores
// are masked and those sums never stored.)
TEST(UnitCpuAttention, ReusedPanelsKeepTheirPaddingZero) {
  int ran = 0;
  for (CpuAttentionPath path : {CpuAttentionPath::kAvx512, CpuAttentionPath::kAvx2,
                                CpuAttentionPath::kAvx512Bf16, CpuAttentionPath::kAmxBf16}) {
    const bool bf16 = path == CpuAttentionPath::kAvx512Bf16 || path == CpuAttentionPath::kAmxBf16;
    const int64_t hd = path == CpuAttentionPath::kAmxBf16 ? 32 : 40;
    const at::ScalarType dtype = bf16 ? at::kBFloat16 : at::kFloat;
    if (!cpu_attention_runs(path, dtype, hd)) continue;
    ++ran;
    SCOPED_TRACE(core::attention::to_string(path));
    for (int round = 0; round < 3; ++round) {
      const Qkv poison = random_qkv({1, 2, 2, 128, hd}, dtype, 50);
      const at::Tensor nan = at::full_like(poison.k, NAN);
      cpu_attention(poison.q, nan, nan, path);
      const Qkv x = random_qkv({1, 2, 2, 100, hd}, dtype, 51);
      const at::Tensor got = cpu_attention(x.q, x.k, x.v, path);
      ASSERT_TRUE(at::isfinite(got.to(at::kFloat)).all().item<bool>()) << "round " << round;
      EXPECT_LT(max_err(got, exact(x)), bf16 ? 2e-2 : 2e-5);
    }
  }
  if (ran == 0) GTEST_SKIP() << "no kernel path runs on this CPU";
}

// q, k, v as v1 takes them from its fused qkv GEMM (strided views of one [B, N, 3, heads, hd]
// tensor), and grouped kv heads, give the same bytes as contiguous, expanded inputs.
TEST(UnitCpuAttention, StridedAndGroupedInputsGiveTheSameBytes) {
  for (CpuAttentionPath path : {CpuAttentionPath::kAvx512, CpuAttentionPath::kAvx2,
                                CpuAttentionPath::kAvx512Bf16, CpuAttentionPath::kAmxBf16}) {
    const at::ScalarType dtype =
        path == CpuAttentionPath::kAvx512Bf16 || path == CpuAttentionPath::kAmxBf16 ? at::kBFloat16
                                                                                    : at::kFloat;
    if (!cpu_attention_runs(path, dtype, 64)) continue;
    SCOPED_TRACE(core::attention::to_string(path));
    at::manual_seed(3);
    const at::Tensor qkv = at::randn({2, 100, 3, 4, 64}).to(dtype);
    const at::Tensor q5 = qkv.permute({2, 0, 3, 1, 4});
    const at::Tensor strided = cpu_attention(q5[0], q5[1], q5[2], path);
    const at::Tensor packed =
        cpu_attention(q5[0].contiguous(), q5[1].contiguous(), q5[2].contiguous(), path);
    EXPECT_TRUE(at::equal(strided, packed));

    const at::Tensor k2 = q5[1].narrow(1, 0, 2), v2 = q5[2].narrow(1, 0, 2);
    const at::Tensor grouped = cpu_attention(q5[0], k2, v2, path);
    const at::Tensor expanded =
        cpu_attention(q5[0], k2.repeat_interleave(2, 1), v2.repeat_interleave(2, 1), path);
    EXPECT_TRUE(at::equal(grouped, expanded));
  }
}
