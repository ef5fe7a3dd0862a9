// The float32 network's fused passes (v2/cpu_ops.hpp over cpu/aten_arith.hpp) against the LibTorch
// op sequences they replace, bit for bit: RMSNorm, the residual add with the next norm, Sapiens2's
// q/k norm with its bf16 RoPE, the SwiGLU gate, and the whole Sapiens2 float32 network with the
// fusion on and off.
//
// LibTorch's arithmetic depends on its build for the process (AVX512, AVX2 or DEFAULT; see
// cpu/aten_arith.hpp), so ctest runs this binary three times: as the CPU is, and under
// ATEN_CPU_CAPABILITY=avx2 and =default (tests/CMakeLists.txt). Every case holds bits, never a
// tolerance, on shapes with and without a vector tail; and each family of inputs is checked to be
// sensitive, i.e. an order or formula other than LibTorch's gives other bits on it, so a change
// of the fused arithmetic cannot pass unseen.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "core/attention/cpu_attention.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "core/cpu/aten_arith.hpp"
#include "core/v2/cpu_ops.hpp"
#include "core/v2/sapiens2.hpp"
#include "sapiens_seg/error.hpp"
#include "test_util.hpp"

using namespace sapiens_seg;
namespace arith = core::cpu::aten_arith;
using sapiens_seg::test::fixture;

namespace {

constexpr double kEps = 1e-6;  // Sapiens2's RMSNorm eps
// The dtypes of the fused passes: float32, and bfloat16 (each op rounded to bf16, as LibTorch's
// bf16 kernels compute).
const std::vector<at::ScalarType> kDtypes{at::kFloat, at::kBFloat16};

// Bit equality (NaN payloads and signed zeros included), with where the first difference is.
::testing::AssertionResult same_bits(const at::Tensor& got, const at::Tensor& want) {
  if (got.sizes() != want.sizes()) {
    return ::testing::AssertionFailure()
           << "shapes differ: " << got.sizes() << " vs " << want.sizes();
  }
  if (got.scalar_type() != want.scalar_type()) {
    return ::testing::AssertionFailure() << "dtypes differ";
  }
  const auto bits = got.element_size() == 2 ? at::kShort : at::kInt;
  const at::Tensor a = got.contiguous().view(bits), b = want.contiguous().view(bits);
  const at::Tensor ne = a.ne(b);
  const int64_t n = ne.sum().item<int64_t>();
  if (n == 0) return ::testing::AssertionSuccess();
  const int64_t i = ne.flatten().nonzero()[0][0].item<int64_t>();
  return ::testing::AssertionFailure()
         << n << " of " << a.numel() << " values differ; first at flat index " << i << ": "
         << got.contiguous().flatten()[i].item<float>() << " vs "
         << want.contiguous().flatten()[i].item<float>();
}

int64_t count_different(const at::Tensor& a, const at::Tensor& b) {
  const auto bits = a.element_size() == 2 ? at::kShort : at::kInt;
  return a.contiguous().view(bits).ne(b.contiguous().view(bits)).sum().item<int64_t>();
}

// Activations as the network has them: mostly O(1), some rows much larger (the residual stream
// grows), a few exact zeros and negative zeros.
at::Tensor activations(at::IntArrayRef shape, uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  const int64_t D = shape.back();
  at::Tensor x = at::randn(shape) * 3 + 0.25;
  const at::Tensor rows = x.view({-1, D});
  rows.mul_(at::exp(at::randn({rows.size(0), 1}) * 2));  // rows of very different scales
  x.view(-1).narrow(0, 0, std::min<int64_t>(x.numel(), 5)).zero_();
  if (x.numel() > 7) x.view(-1)[6] = -0.0;
  return x;
}

// The module's RMSNorm (LibTorch's op).
at::Tensor rms_ref(const at::Tensor& x, const at::Tensor& w) {
  return at::rms_norm(x, {x.size(-1)}, w, kEps);
}

// A plain left-to-right sum of squares: what a fused pass that ignored LibTorch's order would do.
at::Tensor rms_naive(const at::Tensor& x, const at::Tensor& w) {
  const int64_t D = x.size(-1);
  at::Tensor xc = x.contiguous(), y = at::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t r = 0; r < xc.numel() / D; ++r) {
    float s = 0;
    for (int64_t d = 0; d < D; ++d) s += xp[r * D + d] * xp[r * D + d];
    const float inv = 1.0f / std::sqrt(s / static_cast<float>(D) + static_cast<float>(kEps));
    for (int64_t d = 0; d < D; ++d) yp[r * D + d] = (xp[r * D + d] * inv) * wp[d];
  }
  return y;
}

// Sapiens2's module: RoPE in bf16 over [B, heads, N, hd] (v2/sapiens2.cpp's apply_rope).
at::Tensor rope_ref(const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin,
                    int64_t pre) {
  const at::Tensor b = t.to(at::kBFloat16);
  at::Tensor p = b.narrow(2, pre, b.size(2) - pre);
  p = p.mul(cos).add(core::v2::rotate_half(p).mul(sin));
  return at::cat({b.narrow(2, 0, pre), p}, 2).to(t.scalar_type());
}

const char* isa_name() {
  return arith::to_string(arith::libtorch_isa());
}

}  // namespace

// The library follows LibTorch's build, including one lowered by ATEN_CPU_CAPABILITY.
TEST(UnitFusedPasses, FollowsLibTorchsBuild) {
  const std::string cap = at::get_cpu_capability();
  EXPECT_EQ(std::string(isa_name()), cap == "AVX512" || cap == "AVX2" ? cap : "DEFAULT");
  if (const char* env = std::getenv("ATEN_CPU_CAPABILITY"); env && std::string(env) == "avx2") {
    EXPECT_EQ(arith::libtorch_isa(), arith::Isa::kAvx2);
  }
  if (const char* env = std::getenv("ATEN_CPU_CAPABILITY"); env && std::string(env) == "default") {
    EXPECT_EQ(arith::libtorch_isa(), arith::Isa::kDefault);
  }
  std::printf("LibTorch's build: %s (%lld float lanes)\n", isa_name(),
              static_cast<long long>(arith::lanes(arith::libtorch_isa())));
}

// at::rms_norm's seven ops in one pass: rows of every length class (whole vectors in 4 chains, a
// cascade level boundary, a scalar tail after the vectors, shorter than a vector).
TEST(UnitFusedPasses, RmsNormIsLibTorchsBitForBit) {
  int64_t naive_differs = 0;
  for (const auto dtype : kDtypes) {
    for (const int64_t D : {1024, 1280, 1536, 2432, 64, 80, 76, 20, 40, 16, 8, 7, 3, 1, 4100}) {
      for (const int64_t rows : {1, 37, 3081}) {
        if (rows == 3081 && D > 1536) continue;  // keep the run short
        const at::Tensor x = activations({rows, D}, 100 + D + rows).to(dtype);
        const at::Tensor w = (at::rand({D}) + 0.5).to(dtype);
        const at::Tensor want = rms_ref(x, w);
        at::Tensor got = at::empty_like(x);
        core::v2::fused_rms_norm(got, x, w, kEps);
        EXPECT_TRUE(same_bits(got, want))
            << "D " << D << " rows " << rows << " " << dtype << " " << isa_name();
        // In place, as the final norm may run.
        at::Tensor inplace = x.clone();
        core::v2::fused_rms_norm(inplace, inplace, w, kEps);
        EXPECT_TRUE(same_bits(inplace, want)) << "in place, D " << D << " " << dtype;
        if (D >= 64 && dtype == at::kFloat) naive_differs += count_different(rms_naive(x, w), want);
      }
    }
  }
  // The inputs tell LibTorch's summation order from a plain one.
  EXPECT_GT(naive_differs, 0);
  // A 3-D map (the tokens [B, N, C]) is rows like any other.
  const at::Tensor x3 = activations({2, 57, 80}, 7);
  const at::Tensor w = at::rand({80}) + 0.5;
  at::Tensor y3 = at::empty_like(x3);
  core::v2::fused_rms_norm(y3, x3, w, kEps);
  EXPECT_TRUE(same_bits(y3, rms_ref(x3, w)));
  test::expect_error([&] { core::v2::fused_rms_norm(y3, x3.transpose(0, 1), w, kEps); },
                     ErrorCode::kInvalidInput, {"contiguous"});
  test::expect_error([&] { core::v2::fused_rms_norm(y3, x3, w.narrow(0, 0, 79), kEps); },
                     ErrorCode::kInvalidInput, {"weight"});
}

// x + p.mul(gamma) (the attention branch's LayerScale and residual) and x + p (the MLP's), each
// with the following at::rms_norm, in one pass; in place into p as the network runs it.
TEST(UnitFusedPasses, ResidualAddAndNormAreLibTorchsBitForBit) {
  for (const auto dtype : kDtypes) {
    for (const int64_t D : {1024, 80, 20, 7}) {
      const at::Tensor x = activations({2, 41, D}, 300 + D).to(dtype);
      const at::Tensor p = (activations({2, 41, D}, 400 + D) * 0.1).to(dtype);
      const at::Tensor gamma = (at::rand({D}) + 0.5).to(dtype), w = (at::rand({D}) + 0.5).to(dtype);
      for (const bool with_gamma : {true, false}) {
        const at::Tensor z_want = with_gamma ? x + p.mul(gamma) : x + p;
        const at::Tensor h_want = rms_ref(z_want, w);
        at::Tensor z = p.clone(), h = at::empty_like(x);
        core::v2::fused_add_rms_norm(z, x, z, with_gamma ? gamma : at::Tensor(), w, kEps, h);
        EXPECT_TRUE(same_bits(z, z_want)) << "D " << D << " gamma " << with_gamma << " " << dtype;
        EXPECT_TRUE(same_bits(h, h_want)) << "D " << D << " gamma " << with_gamma << " " << dtype;
        // Without a norm (the last block of a range): only the add.
        at::Tensor z2 = at::empty_like(x);
        core::v2::fused_add_rms_norm(z2, x, p, with_gamma ? gamma : at::Tensor(), at::Tensor(),
                                     kEps, at::Tensor());
        EXPECT_TRUE(same_bits(z2, z_want)) << "D " << D;
      }
      if (dtype != at::kFloat) continue;
      // A contracted multiply-add (x + p * gamma rounded once) gives other bits on these inputs.
      at::Tensor fused = at::empty_like(x);
      const at::Tensor gx = gamma.expand_as(x).contiguous();
      for (int64_t i = 0; i < x.numel(); ++i) {
        fused.data_ptr<float>()[i] =
            std::fma(p.data_ptr<float>()[i], gx.data_ptr<float>()[i], x.data_ptr<float>()[i]);
      }
      EXPECT_GT(count_different(fused, x + p.mul(gamma)), 0) << "D " << D;
    }
  }
  const at::Tensor x = at::randn({4, 8});
  test::expect_error(
      [&] { core::v2::fused_add_rms_norm(x, x, x, at::Tensor(), at::ones({8}), kEps, x); },
      ErrorCode::kInvalidInput, {"alias"});
}

// The q and k of a Sapiens2 block: per-head RMSNorm on the projection's transposed view, the
// module's bf16 RoPE (prefix tokens only rounded), grouped-query expansion by repeat_interleave.
TEST(UnitFusedPasses, QkNormAndRopeAreTheModulesBitForBit) {
  struct Case {
    int64_t B, N, heads, hd, pre, repeat, gh, gw;
  };
  // 0.4b's head dim 64 with GQA (kv = heads / 2) and the tiny fixture's 20 (a vector and a tail);
  // 5b's 76 and 0.8b's 80; a grid that is not square; a batch of two.
  for (const Case c : {Case{1, 9 + 48, 4, 64, 9, 1, 8, 6}, Case{2, 9 + 48, 2, 64, 9, 2, 8, 6},
                       Case{2, 9 + 12, 4, 20, 9, 1, 4, 3}, Case{1, 9 + 12, 2, 20, 9, 2, 3, 4},
                       Case{1, 9 + 20, 3, 76, 9, 1, 5, 4}, Case{1, 9 + 30, 2, 80, 9, 2, 6, 5}}) {
    const std::string what = "B " + std::to_string(c.B) + " heads " + std::to_string(c.heads) +
                             " hd " + std::to_string(c.hd) + " repeat " + std::to_string(c.repeat);
    for (const auto dtype : kDtypes) {
      const at::Tensor proj =
          activations({c.B, c.N, c.heads * c.hd}, 500 + c.hd + c.heads).to(dtype);
      const at::Tensor w = (at::rand({c.hd}) + 0.5).to(dtype);
      const auto bf = at::TensorOptions().dtype(at::kBFloat16);
      const at::Tensor periods =
          at::pow(c10::Scalar(100), at::arange(c.hd / 4, bf).mul(2).div(c.hd / 2));
      const auto [cos, sin] = core::v2::rope_tables(periods, c.gh, c.gw);
      // The module: heads as [B, heads, N, hd] views, rms_norm, RoPE, then the expansion.
      const at::Tensor t = proj.view({c.B, c.N, c.heads, c.hd}).transpose(1, 2);
      at::Tensor want = rope_ref(rms_ref(t, w), cos, sin, c.pre);
      if (c.repeat > 1) want = want.repeat_interleave(c.repeat, 1);
      at::Tensor got = at::full({c.B, c.heads * c.repeat, c.N, c.hd}, 7.0, proj.options());
      core::v2::fused_qk_norm_rope(got, proj, c.heads, w, kEps, cos, sin, c.pre, c.repeat);
      EXPECT_TRUE(same_bits(got, want)) << what << " " << dtype;
      // Token-major, as the network writes q: the same values at other addresses.
      const at::Tensor tokens =
          at::full({c.B, c.N, c.heads * c.repeat, c.hd}, 7.0, proj.options()).transpose(1, 2);
      core::v2::fused_qk_norm_rope(tokens, proj, c.heads, w, kEps, cos, sin, c.pre, c.repeat);
      EXPECT_TRUE(same_bits(tokens, want)) << what << " token-major " << dtype;
      if (dtype != at::kFloat) continue;
      // The module's three bf16 roundings matter here: RoPE with the products kept in float32 and
      // only the sum rounded gives other bits.
      const at::Tensor tb = rms_ref(t, w).to(at::kBFloat16).to(at::kFloat);
      const at::Tensor pb = tb.narrow(2, c.pre, c.N - c.pre);
      const at::Tensor loose =
          (pb * cos.to(at::kFloat) + core::v2::rotate_half(pb) * sin.to(at::kFloat))
              .to(at::kBFloat16)
              .to(at::kFloat);
      EXPECT_GT(count_different(
                    loose, rope_ref(rms_ref(t, w), cos, sin, c.pre).narrow(2, c.pre, c.N - c.pre)),
                0)
          << what;
    }
  }
  const at::Tensor proj = at::randn({1, 5, 8});
  const auto bf = at::TensorOptions().dtype(at::kBFloat16);
  test::expect_error(
      [&] {
        core::v2::fused_qk_norm_rope(at::empty({1, 2, 5, 4}), proj, 2, at::ones({4}), kEps,
                                     at::zeros({5, 4}, bf), at::zeros({4, 4}, bf), 0, 1);
      },
      ErrorCode::kInvalidInput, {"cos and sin"});
  test::expect_error(
      [&] {
        core::v2::fused_qk_norm_rope(at::empty({1, 2, 4, 5}).transpose(2, 3), proj, 2,
                                     at::ones({4}), kEps, at::zeros({5, 4}, bf),
                                     at::zeros({5, 4}, bf), 0, 1);
      },
      ErrorCode::kInvalidInput, {"contiguous rows"});
}

// silu(g[:, :F]) * g[:, F:]: SLEEF's exp in pairs of vectors, std::exp in each run's tail, where
// LibTorch's threads split the map; checked at 1, 2 and 3 threads on maps whose thread boundaries
// fall inside a row.
TEST(UnitFusedPasses, SwigluIsTheModulesBitForBitAtEveryThreadCount) {
  const int threads = at::get_num_threads();
  int64_t tail_formula_matters = 0;
  for (const int nt : {1, 2, 3}) {
    at::set_num_threads(nt);
    // 0.4b's width; widths with a tail after the pairs of vectors; maps under and over the grain.
    for (const auto& [rows, F] : std::vector<std::pair<int64_t, int64_t>>{{3081, 4096},
                                                                          {37, 1000},
                                                                          {57, 320},
                                                                          {131, 40},
                                                                          {77, 60},
                                                                          {5, 7},
                                                                          {1100, 33},
                                                                          {3, 4096}}) {
      for (const auto dtype : kDtypes) {
        const at::Tensor g3 = (activations({1, rows, 2 * F}, 600 + F + rows) * 2).to(dtype);
        const auto halves = g3.chunk(2, -1);
        const at::Tensor want = at::silu(halves[0]).mul(halves[1]).view({rows, F});
        at::Tensor got = at::full({rows + 2, F}, 5.0, g3.options());
        core::v2::fused_swiglu(got.narrow(0, 0, rows), g3.view({rows, 2 * F}));
        EXPECT_TRUE(same_bits(got.narrow(0, 0, rows), want))
            << rows << " x " << F << " " << dtype << " at " << nt << " threads, " << isa_name();
        EXPECT_TRUE(got.narrow(0, rows, 2).eq(5.0).all().item<bool>());
      }
      const at::Tensor g3 = activations({1, rows, 2 * F}, 600 + F + rows) * 2;
      const auto halves = g3.chunk(2, -1);
      // The scalar tail's exp differs from the vector one on some of these values: computing
      // every element the vector way would give other bits.
      if (nt == 1 && F == 1000) {
        const at::Tensor a = halves[0].reshape({-1}).contiguous();
        const at::Tensor s_vec = a / (1 + at::exp(-a));  // at::exp: LibTorch's vector exp
        at::Tensor s_std = at::empty_like(a);
        const float* ap = a.data_ptr<float>();
        float* sp = s_std.data_ptr<float>();
        for (int64_t i = 0; i < a.numel(); ++i) sp[i] = ap[i] / (1.0f + std::exp(-ap[i]));
        tail_formula_matters += count_different(s_std, s_vec);
      }
    }
  }
  at::set_num_threads(threads);
  EXPECT_GT(tail_formula_matters, 0);
  test::expect_error(
      [] {
        core::v2::fused_swiglu(at::empty({2, 3}), at::randn({2, 8}));
      },
      ErrorCode::kInvalidInput, {"[rows, 2F]"});
}

// The MLP's gate a pair of column chunks at a time: every chunk width (multiples of the vector
// pair, odd ones, a last narrower chunk, the whole width) gives the whole pass's bits, at 1, 2 and
// 3 threads, where the thread boundaries fall inside rows and rows have a scalar tail.
TEST(UnitFusedPasses, SwigluInColumnChunksIsTheWholePassBitForBit) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor pool = activations({1, 1, 1 << 16}, 77).reshape({-1}) * 4;
  const at::Tensor s_vec = pool / (1 + at::exp(-pool));  // at::exp: LibTorch's vector exp
  at::Tensor s_std = at::empty_like(pool);
  for (int64_t i = 0; i < pool.numel(); ++i) {
    const float v = pool[i].item<float>();
    s_std[i] = v / (1.0f + std::exp(-v));
  }
  const at::Tensor disputed = pool.masked_select(s_vec.ne(s_std));
  ASSERT_GT(disputed.numel(), 16) << "no values whose SiLU the two exps round apart";
  for (const int nt : {1, 2, 3}) {
    at::set_num_threads(nt);
    for (const auto& [rows, F] : std::vector<std::pair<int64_t, int64_t>>{
             {3081, 4096}, {37, 1000}, {131, 40}, {1100, 33}, {3, 4096}}) {
      for (const auto dtype : kDtypes) {
        at::Tensor g =
            (activations({1, rows, 2 * F}, 700 + F + rows) * 2).to(dtype).view({rows, 2 * F});
        // float32: every gate value one whose SiLU the vector and the scalar exp round apart, so
        // that an element given the other exp than in the whole pass changes the bits.
        if (dtype == at::kFloat)
          g.narrow(1, 0, F).copy_(disputed.repeat(rows * F / disputed.numel() + 1)
                                      .narrow(0, 0, rows * F)
                                      .view({rows, F}));
        at::Tensor want = at::empty({rows, F}, g.options());
        core::v2::fused_swiglu(want, g);
        for (const int64_t width : {int64_t{16}, int64_t{512}, int64_t{37}, F}) {
          at::Tensor got = at::full({rows, F}, 5.0, g.options());
          for (int64_t j = 0; j < F; j += width) {
            const int64_t w = std::min(width, F - j);
            core::v2::fused_swiglu_columns(got, g.narrow(1, j, w).contiguous(),
                                           g.narrow(1, F + j, w).contiguous(), j);
          }
          EXPECT_TRUE(same_bits(got, want))
              << rows << " x " << F << " " << dtype << " in chunks of " << width << " at " << nt
              << " threads, " << isa_name();
        }
      }
    }
  }
  at::set_num_threads(threads);
  test::expect_error(
      [] {
        core::v2::fused_swiglu_columns(at::empty({2, 8}), at::randn({2, 4}), at::randn({2, 4}), 6);
      },
      ErrorCode::kInvalidInput, {"[col, col + w)"});
}

// The whole network in float32 and bfloat16: the fused blocks and final norm against the module's
// ops one by one (SAPIENS_SEG_CPU_FUSE=off), bit for bit, on the tiny fixture at both of its input
// sizes (tests/fixtures: grid 8 x 6 at batch 2, and the real 64 x 48 grid).
TEST(UnitFusedPasses, Sapiens2NetworkIsBitIdenticalWithTheFusionOnAndOff) {
  const core::TensorMap t = core::v2::to_original_names(
      core::SafetensorsFile::open(fixture("s2_tiny.safetensors")).all());
  for (const auto dtype : kDtypes) {
    // LibTorch's bf16 attention reaches AMX tiles through code of its AVX512 build only (under a
    // lowered ATEN_CPU_CAPABILITY it throws "pack_vnni2 is only supported when avx512 is
    // supported"): there the bf16 network runs the library's attention kernel, both ways alike, or
    // is skipped where that cannot run either.
    std::string attention = "";
    if (dtype == at::kBFloat16 && arith::libtorch_isa() != arith::Isa::kAvx512) {
      if (!core::attention::cpu_attention_runs(core::attention::CpuAttentionPath::kAvx512Bf16,
                                               at::kBFloat16, 20)) {
        continue;
      }
      attention = "kernel";
    }
    if (!attention.empty()) ::setenv("SAPIENS_SEG_CPU_ATTENTION", attention.c_str(), 1);
    for (const auto& [B, h, w] :
         std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 128, 96}, {1, 1024, 768}}) {
      core::v2::ConfigHints hints;
      hints.input_h = h;
      hints.input_w = w;
      const core::v2::Network net(t, core::v2::infer_config(t, hints), at::kCPU, dtype);
      at::manual_seed(11);
      const at::Tensor x = at::randn({B, 3, h, w});
      const at::Tensor tokens = net.embed(x);
      ::setenv("SAPIENS_SEG_CPU_FUSE", "off", 1);
      const at::Tensor ref_blocks = net.blocks(tokens, 0, net.config().depth);
      const at::Tensor ref_norm = net.final_norm(ref_blocks);
      const at::Tensor ref_mid = net.blocks(tokens, 3, 9);  // a range that starts and ends inside
      ::setenv("SAPIENS_SEG_CPU_FUSE", "on", 1);
      const at::Tensor tokens_before = tokens.clone();
      const at::Tensor got_blocks = net.blocks(tokens, 0, net.config().depth);
      EXPECT_TRUE(same_bits(got_blocks, ref_blocks)) << h << "x" << w << " " << dtype;
      EXPECT_TRUE(same_bits(net.final_norm(got_blocks), ref_norm)) << h << "x" << w << " " << dtype;
      EXPECT_TRUE(same_bits(net.blocks(tokens, 3, 9), ref_mid)) << h << "x" << w << " " << dtype;
      EXPECT_TRUE(same_bits(tokens, tokens_before)) << "the caller's tokens were written";
      // float32's MLP by column chunks (F = 320: chunks that divide it and a narrower last one).
      // The first call at a shape checks the BLAS's chunks against the whole GEMM and computes by
      // chunks only where they match; either way the bits are the module's.
      if (dtype == at::kFloat) {
        const int64_t M = tokens.size(0) * tokens.size(1), C = tokens.size(2);
        for (const int64_t width : {64, 96}) {
          ::setenv("SAPIENS_SEG_CPU_MLP_COLUMNS", std::to_string(width).c_str(), 1);
          EXPECT_TRUE(same_bits(net.blocks(tokens, 0, net.config().depth), ref_blocks))
              << h << "x" << w << " in chunks of " << width;
          const auto exact = core::v2::mlp_column_split_exact(M, C, int64_t{2} * 320, width,
                                                              at::get_num_threads());
          ASSERT_TRUE(exact.has_value()) << "the first call did not check the chunks";
          // Later calls take the chunks (or not) without checking again.
          EXPECT_TRUE(same_bits(net.blocks(tokens, 0, net.config().depth), ref_blocks));
          std::printf("w12 in chunks of %lld at %lld tokens: %s\n", static_cast<long long>(width),
                      static_cast<long long>(M), *exact ? "exact, used" : "not exact, whole");
        }
        ::setenv("SAPIENS_SEG_CPU_MLP_COLUMNS", "many", 1);
        test::expect_error([&] { net.blocks(tokens, 0, 1); }, ErrorCode::kInvalidInput,
                           {"SAPIENS_SEG_CPU_MLP_COLUMNS"});
        ::unsetenv("SAPIENS_SEG_CPU_MLP_COLUMNS");
      }
      ::unsetenv("SAPIENS_SEG_CPU_FUSE");
    }
    ::unsetenv("SAPIENS_SEG_CPU_ATTENTION");
  }
  ::setenv("SAPIENS_SEG_CPU_FUSE", "sometimes", 1);
  const core::v2::Network net(t, core::v2::infer_config(t, {}), at::kCPU, at::kFloat);
  test::expect_error(
      [&] {
        net.final_norm(at::randn({1, 4, 80}));
      },
      ErrorCode::kInvalidInput, {"SAPIENS_SEG_CPU_FUSE"});
  ::unsetenv("SAPIENS_SEG_CPU_FUSE");
}
