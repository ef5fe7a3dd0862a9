// The kernels backend on a GPU (ctest label `gpu`; tools/gpu/gpu_check.sh runs it on the GPU
// machine). Every test skips, saying why, where no CUDA device of compute capability 8.0 or
// newer is present.
//
//  - each kernel against its ATen reference computed in float32 (float64 for the statistics),
//    for every element type it supports and every head dim (60, 64, 76, 80), on random inputs,
//    with the output poisoned (NaN, or 255 for labels) before each run so that an element the
//    kernel never writes fails the comparison; errors are relative to the reference's largest
//    magnitude, with a bound per element type;
//  - the float32 references without TF32: LibTorch 2.11 runs float32 convolutions in TF32 by
//    default (about 1e-3 off per layer), so a test environment switches TF32 off for cuDNN and
//    cuBLAS before any test, and the decoder-head references run in float64 on the CPU;
//  - the head's banded deconvolutions at the real 0.3b geometry (84-row bands with a partial
//    last band) and with bands forced small;
//  - CUDA graphs: replays equal eager runs, every kernels-mode shape is captured, and a capture
//    that fails leaves its shape eager, says why, and gives its memory pool back;
//  - whole-network parity of the portable and kernels modes in float16 against the reference
//    logits of the authors' network (fixtures tiny_b and wide_0.3b; for Sapiens2, s2_tiny
//    against the float32 portable network on the CPU, which equals the authors' module bit for
//    bit, see sapiens2.parity): mean |diff| <= 0.05, 99th percentile <= 0.25, labels agreeing
//    on >= 99.5 % of the pixels.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "core/backends/backends.hpp"
#include "core/backends/cuda_graphs.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "core/checkpoint/torchscript.hpp"
#include "core/kernel_ops.hpp"
#include "core/resize/resize.hpp"
#include "core/tensor_ops.hpp"
#include "core/v1/kernels_schedule.hpp"
#include "core/v2/kernels_schedule.hpp"
#include "core/v2/sapiens2.hpp"
#include "kernels/cudnn_hacc/attention.hpp"
#include "kernels/fastbb/fastbb.hpp"
#include "kernels/seg_up/head.hpp"
#include "sapiens_seg/error.hpp"
#include "test_util.hpp"

using namespace sapiens_seg;
namespace fs = std::filesystem;
namespace cudnn_hacc = sapiens_seg::kernels::cudnn_hacc;
namespace fastbb = sapiens_seg::kernels::fastbb;
namespace seg_up = sapiens_seg::kernels::seg_up;

namespace {

std::string gpu_unavailable() {
  if (!at::hasCUDA()) {
    return "no CUDA device here: these tests run on a machine with an NVIDIA GPU "
           "(tools/gpu/gpu_check.sh)";
  }
  const auto [major, minor] = core::cuda_capability(0);
  if (major < core::kKernelsMinMajor) {
    return "cuda:0 has compute capability " + std::to_string(major) + "." + std::to_string(minor) +
           "; the kernels need 8.0 or newer";
  }
  return "";
}

#define REQUIRE_GPU()                           \
  do {                                          \
    const std::string why_ = gpu_unavailable(); \
    if (!why_.empty()) GTEST_SKIP() << why_;    \
  } while (0)

const c10::Device kGpu(c10::kCUDA, 0);

// Relative error bound per element type (of the reference's largest magnitude).
double bound(at::ScalarType t) {
  return t == at::kFloat ? 1e-4 : t == at::kHalf ? 6e-3 : 4e-2;
}

double rel_err(const at::Tensor& got, const at::Tensor& ref) {
  const at::Tensor g = got.to(at::kCPU, at::kDouble), r = ref.to(at::kCPU, at::kDouble);
  const double scale = std::max(r.abs().max().item<double>(), 1e-6);
  const double d = (g - r).abs().max().item<double>();  // NaN (poison) propagates
  return std::isnan(d) ? std::numeric_limits<double>::infinity() : d / scale;
}

at::Tensor poisoned(at::IntArrayRef sizes, at::ScalarType t) {
  return at::full(sizes, std::numeric_limits<float>::quiet_NaN(),
                  at::TensorOptions().dtype(t).device(kGpu));
}

const at::ScalarType kAllTypes[] = {at::kFloat, at::kHalf, at::kBFloat16};

// Before any test: float32 references on the GPU in IEEE float32. LibTorch 2.11 lets cuDNN's
// convolutions use TF32 by default (cuBLAS's matmuls not, but that default has moved between
// versions), which puts a float32 reference itself ~1e-3 off. These two setters exist in the
// LibTorch of the GPU machine (2.11) and of the development machine (2.15).
class NoTf32 : public ::testing::Environment {
 public:
  void SetUp() override {
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
    std::printf("tf32 cudnn=%d cublas=%d (float32 references in IEEE float32)\n",
                int(at::globalContext().allowTF32CuDNN()),
                int(at::globalContext().allowTF32CuBLAS()));
  }
};
[[maybe_unused]] const auto* const kNoTf32 = ::testing::AddGlobalTestEnvironment(new NoTf32);

// Prints a CUDA-graph runner's counts as the summary of tools/gpu/gpu_check.sh collects them.
core::GraphStats print_graphs(const std::string& what, const core::Runner& r) {
  const auto st = core::cuda_graph_stats(r);
  std::printf("graphs %s: %s\n", what.c_str(),
              st ? st->summary().c_str() : "not a CUDA-graph runner");
  return st.value_or(core::GraphStats{});
}

// The head of the authors' module (ConvTranspose2d k4 s2 p1 without bias, InstanceNorm2d, SiLU,
// 1x1 convolutions) in float64 on the CPU, from the weights as the kernels see them (rounded to
// `t`): a reference without TF32 or float32 rounding, for a head run in float32 or less.
at::Tensor head_reference_f64(const std::vector<at::Tensor>& deconv,
                              const std::vector<at::Tensor>& conv_w,
                              const std::vector<at::Tensor>& conv_b, const at::Tensor& seg_w,
                              const at::Tensor& seg_b, const at::Tensor& feat, int64_t gh,
                              int64_t gw, at::ScalarType t) {
  const auto r = [t](const at::Tensor& w) { return w.to(t).to(at::kCPU, at::kDouble); };
  auto norm_silu = [](const at::Tensor& y) {
    return at::silu(at::instance_norm(y, {}, {}, {}, {}, true, 0.1, 1e-5, false));
  };
  at::Tensor x = r(feat).view({1, gh, gw, feat.size(1)}).permute({0, 3, 1, 2});
  for (std::size_t s = 0; s < deconv.size(); ++s) {
    x = at::conv_transpose2d(s == 0 ? x : norm_silu(x), r(deconv[s]), {}, 2, 1);
  }
  for (std::size_t s = 0; s < conv_w.size(); ++s) {
    x = at::conv2d(norm_silu(x), r(conv_w[s]), r(conv_b[s]));
  }
  return at::conv2d(norm_silu(x), r(seg_w), r(seg_b))[0];  // [K, u*gh, u*gw]
}

}  // namespace

TEST(GpuKernels, ReferencesRunWithoutTf32) {
  REQUIRE_GPU();
  EXPECT_FALSE(at::globalContext().allowTF32CuDNN());
  EXPECT_FALSE(at::globalContext().allowTF32CuBLAS());
  // A float32 1x1 convolution (a GEMM for cuDNN, no Winograd or FFT rounding) then agrees with
  // float64 to float32 rounding (~1e-6 of the largest output), not TF32's 10-bit mantissa (a few
  // 1e-4 over 512 channels).
  at::manual_seed(10);
  const at::Tensor x = at::randn({1, 512, 32, 24}), w = at::randn({256, 512, 1, 1}) * 0.05;
  const at::Tensor ref = at::conv2d(x.to(at::kDouble), w.to(at::kDouble));
  const at::Tensor got = at::conv2d(x.to(kGpu), w.to(kGpu));
  const double e = rel_err(got, ref);
  std::printf("tf32 probe: float32 1x1 convolution vs float64, rel err %.3g\n", e);
  EXPECT_LE(e, 1e-5);
}

TEST(GpuKernels, DeviceIsUsable) {
  REQUIRE_GPU();
  EXPECT_EQ(core::kernels_unavailable_reason(kGpu), "");
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(0);
  std::printf("device: %s, compute capability %d.%d\n", p->name, p->major, p->minor);
}

TEST(GpuKernels, LayerNorm) {
  REQUIRE_GPU();
  at::manual_seed(1);
  for (at::ScalarType t : kAllTypes) {
    for (auto [M, C] : {std::pair<int64_t, int64_t>{3072, 1024}, {33, 1536}, {7, 60}, {5, 1}}) {
      // Non-zero mean, as the residual stream has: the fp32 two-pass statistics must hold.
      const at::Tensor x = (at::randn({M, C}) * 3 + 5).to(kGpu, t);
      const at::Tensor w = at::randn({C}).to(kGpu, t), b = at::randn({C}).to(kGpu, t);
      const at::Tensor ref =
          at::layer_norm(x.to(at::kFloat), {C}, w.to(at::kFloat), b.to(at::kFloat), 1e-6);
      const at::Tensor out = poisoned({M, C}, t);
      fastbb::layer_norm(x, w, b, 1e-6, out);
      EXPECT_LE(rel_err(out, ref), bound(t)) << t << " " << M << "x" << C;
      // In place (x == out) is allowed.
      const at::Tensor y = x.clone();
      fastbb::layer_norm(y, w, b, 1e-6, y);
      EXPECT_LE(rel_err(y, ref), bound(t)) << "in place " << t;
    }
  }
}

TEST(GpuKernels, GeluErf) {
  REQUIRE_GPU();
  at::manual_seed(2);
  for (at::ScalarType t : kAllTypes) {
    for (int64_t n : {int64_t{3072} * 4096, int64_t{1001}}) {
      const at::Tensor x = (at::randn({n}) * 3).to(kGpu, t);
      const at::Tensor ref = at::gelu(x.to(at::kFloat));  // approximate="none": erf
      const at::Tensor y = x.clone();
      fastbb::gelu_erf_(y);
      EXPECT_LE(rel_err(y, ref), bound(t)) << t << " n=" << n;
    }
  }
}

TEST(GpuKernels, GemmEpilogues) {
  REQUIRE_GPU();
  at::manual_seed(3);
  fastbb::Gemm gemm(kGpu);
  using A = fastbb::Activation;
  struct Shape {
    int64_t M, K, N;
  };
  for (at::ScalarType t : kAllTypes) {
    for (const Shape s : {Shape{300, 256, 384}, Shape{3072, 1024, 3072}, Shape{33, 80, 28}}) {
      const auto f = [&](at::IntArrayRef sz, double sc) {
        return (at::randn(sz) * sc).to(kGpu, t);
      };
      const at::Tensor x = f({s.M, s.K}, 1.0), w = f({s.N, s.K}, 1.0 / std::sqrt(double(s.K)));
      const at::Tensor b = f({s.N}, 1.0), r = f({s.M, s.N}, 1.0);
      const at::Tensor xf = x.to(at::kFloat), wf = w.to(at::kFloat), bf = b.to(at::kFloat);
      const at::Tensor lin = at::addmm(bf, xf, wf.t());
      const std::string what = std::string(c10::toString(t)) + " " + std::to_string(s.M) + "x" +
                               std::to_string(s.K) + "x" + std::to_string(s.N);

      at::Tensor out = poisoned({s.M, s.N}, t);
      gemm.linear(x, w, b, {}, A::kNone, out);
      EXPECT_LE(rel_err(out, lin), bound(t)) << "bias " << what;

      out = poisoned({s.M, s.N}, t);
      gemm.linear(x, w, {}, {}, A::kNone, out);
      EXPECT_LE(rel_err(out, at::mm(xf, wf.t())), bound(t)) << "no bias " << what;

      out = poisoned({s.M, s.N}, t);
      gemm.linear(x, w, b, {}, A::kGeluErf, out);
      EXPECT_LE(rel_err(out, at::gelu(lin)), bound(t)) << "bias+gelu(erf) " << what;

      // cuBLASLt documents its GELU epilogue as the tanh form of GELU, not as an exact tanh:
      // with the hardware tanh.approx.f32 (relative error about 2^-11) GELU moves by up to
      // ~2.5e-4 of |x|, i.e. of the reference's largest magnitude, beyond float32's 1e-4.
      out = poisoned({s.M, s.N}, t);
      gemm.linear(x, w, b, {}, A::kGeluTanhEpilogue, out);
      EXPECT_LE(rel_err(out, at::gelu(lin, "tanh")), std::max(bound(t), 1e-3))
          << "bias+gelu(tanh) " << what;

      out = poisoned({s.M, s.N}, t);
      gemm.linear(x, w, b, r, A::kNone, out);
      EXPECT_LE(rel_err(out, lin + r.to(at::kFloat)), bound(t)) << "bias+residual " << what;

      out = r.clone();  // in place: the residual stream update
      gemm.linear(x, w, b, out, A::kNone, out);
      EXPECT_LE(rel_err(out, lin + r.to(at::kFloat)), bound(t)) << "in-place residual " << what;

      // A row block of a larger buffer (the head's shifted tap blocks).
      const at::Tensor big = f({s.M + 5, s.K}, 1.0);
      out = poisoned({s.M, s.N}, t);
      gemm.linear(big.narrow(0, 3, s.M), w, {}, {}, A::kNone, out);
      EXPECT_LE(rel_err(out, at::mm(big.narrow(0, 3, s.M).to(at::kFloat), wf.t())), bound(t))
          << "offset rows " << what;
    }
  }
  EXPECT_GT(gemm.plans_cached(), 0u);
}

TEST(GpuKernels, AttentionEveryHeadDim) {
  REQUIRE_GPU();
  at::manual_seed(4);
  cudnn_hacc::Attention attn(kGpu);
  for (at::ScalarType t : {at::kHalf, at::kBFloat16}) {
    for (int64_t hd : {60, 64, 76, 80}) {
      for (auto [B, S, H] : {std::tuple<int64_t, int64_t, int64_t>{2, 197, 3}, {1, 3072, 4}}) {
        const int64_t hdp = cudnn_hacc::padded_head_dim(hd);
        const at::Tensor q = at::randn({B, S, H, hd}), k = at::randn({B, S, H, hd}),
                         v = at::randn({B, S, H, hd});
        // Packed [B, S, 3, H, hdp], zero-padded as the padded qkv weights produce it.
        const at::Tensor packed =
            at::constant_pad_nd(at::stack({q, k, v}, 2), {0, hdp - hd}).to(kGpu, t).contiguous();
        const float scale = static_cast<float>(1.0 / std::sqrt(double(hd)));
        const at::Tensor out = poisoned({B, S, H, hdp}, t);
        attn.packed_qkv(packed, out, scale);
        const auto up = [&](const at::Tensor& a) {  // the values the kernel saw, as fp32
          return a.to(kGpu, t).to(at::kFloat).transpose(1, 2);
        };
        const at::Tensor ref =
            at::scaled_dot_product_attention(up(q), up(k), up(v), {}, 0.0, false, double(scale))
                .transpose(1, 2);  // [B, S, H, hd]
        const std::string what =
            std::string(c10::toString(t)) + " hd " + std::to_string(hd) + " S " + std::to_string(S);
        EXPECT_LE(rel_err(out.narrow(3, 0, hd), ref), bound(t)) << what;
        if (hdp > hd) {
          EXPECT_EQ(out.narrow(3, hd, hdp - hd).abs().max().item<float>(), 0.f)
              << "padding columns " << what;
        }
      }
    }
  }
  const std::size_t graphs = attn.graphs_cached();
  EXPECT_EQ(graphs, 2u * 4u * 2u);  // one per (dtype, head dim, shape)
  // Same shape again: the cached graph, no new build.
  const at::Tensor qkv = at::randn({2, 197, 3, 3, 64}).to(kGpu, at::kHalf);
  attn.packed_qkv(qkv, at::empty({2, 197, 3, 64}, qkv.options()), 0.125f);
  EXPECT_EQ(attn.graphs_cached(), graphs);
}

TEST(GpuKernels, InstanceNormStatsAndSilu) {
  REQUIRE_GPU();
  at::manual_seed(5);
  for (at::ScalarType t : kAllTypes) {
    for (auto [P, C] : {std::pair<int64_t, int64_t>{196608, 96}, {1000, 33}, {12, 768}}) {
      const at::Tensor x = (at::randn({P, C}) * 2 + 10).to(kGpu, t);  // |mean| >> std
      const auto [scale, shift] = seg_up::channel_stats(x, 1e-5);
      const auto [var, mean] = at::var_mean(x.to(at::kDouble), {0}, 0, false);
      const at::Tensor rstd = (var + 1e-5).rsqrt();
      EXPECT_LE(rel_err(scale, rstd), 1e-4) << t << " " << P << "x" << C;
      EXPECT_LE(rel_err(shift, -mean * rstd), 1e-3) << t << " " << P << "x" << C;
      const at::Tensor y = x.clone();
      seg_up::norm_silu_(y, scale, shift);
      const at::Tensor ref =
          at::silu((x.to(at::kFloat) - mean.to(at::kFloat)) * rstd.to(at::kFloat));
      EXPECT_LE(rel_err(y, ref), bound(t)) << t;
    }
  }
}

namespace {

// A head of random weights (C input channels, HC hidden, K classes), its GPU form and its float64
// reference.
struct RandomHead {
  std::vector<at::Tensor> deconv, conv_w, conv_b;
  at::Tensor seg_w, seg_b;

  seg_up::HeadWeights prepare(at::ScalarType t) const {
    return seg_up::prepare_head(deconv, conv_w, conv_b, seg_w, seg_b, kGpu, t);
  }
  at::Tensor reference(const at::Tensor& feat, int64_t gh, int64_t gw, at::ScalarType t) const {
    return head_reference_f64(deconv, conv_w, conv_b, seg_w, seg_b, feat, gh, gw, t);
  }
};

RandomHead random_head(int64_t C, int64_t HC, int64_t K) {
  RandomHead h;
  h.deconv = {at::randn({C, HC, 4, 4}) * 0.1, at::randn({HC, HC, 4, 4}) * 0.1,
              at::randn({HC, HC, 4, 4}) * 0.1};
  for (int s = 0; s < 3; ++s) {
    h.conv_w.push_back(at::randn({HC, HC, 1, 1}) * 0.2);
    h.conv_b.push_back(at::randn({HC}));
  }
  h.seg_w = at::randn({K, HC, 1, 1}) * 0.2;
  h.seg_b = at::randn({K});
  return h;
}

}  // namespace

// The whole head on the GPU against the head of the authors' module in float64 on the CPU
// (ConvTranspose2d, InstanceNorm2d, SiLU, 1x1 convolutions), from the same rounded weights.
TEST(GpuKernels, DecoderHead) {
  REQUIRE_GPU();
  at::manual_seed(6);
  fastbb::Gemm gemm(kGpu);
  const int64_t C = 64, HC = 32, K = 28;
  for (at::ScalarType t : kAllTypes) {
    for (auto [gh, gw] : {std::pair<int64_t, int64_t>{4, 3}, {16, 12}}) {
      const RandomHead head = random_head(C, HC, K);
      const seg_up::HeadWeights hw = head.prepare(t);
      const at::Tensor feat = at::randn({gh * gw, C}).to(kGpu, t);
      const at::Tensor ref = head.reference(feat, gh, gw, t);

      const at::Tensor got = seg_up::head_forward(gemm, hw, feat.contiguous(), gh, gw);
      ASSERT_EQ(got.sizes(), (at::IntArrayRef{64 * gh * gw, 32}));
      const at::Tensor logits = got.narrow(1, 0, K).view({8 * gh, 8 * gw, K}).permute({2, 0, 1});
      // Six normalisations deep: the half types get a looser bound.
      EXPECT_LE(rel_err(logits, ref), t == at::kFloat ? 1e-3 : 6 * bound(t))
          << t << " " << gh << "x" << gw;
    }
  }
}

// The head's deconvolutions run over bands of input rows. At the 0.3b geometry (a 64x48 grid)
// the third deconvolution's rows are 192 wide, so its bands are 84 rows and the last of its 256
// rows is a partial band of 4; forced bands of 5 rows make every stage banded, with partial last
// bands of different heights. Each against the float64 reference.
TEST(GpuKernels, DecoderHeadBands) {
  REQUIRE_GPU();
  at::manual_seed(11);
  fastbb::Gemm gemm(kGpu);
  ASSERT_EQ(seg_up::deconv_band_rows(4 * 48), 84);
  const int64_t C = 64, HC = 32, K = 28;
  const RandomHead head = random_head(C, HC, K);
  struct Case {
    int64_t gh, gw, band_rows;
  };
  for (at::ScalarType t : {at::kFloat, at::kHalf}) {
    const seg_up::HeadWeights hw = head.prepare(t);
    for (const Case c : {Case{64, 48, 0}, Case{13, 11, 5}, Case{64, 48, 84}}) {
      const at::Tensor feat = at::randn({c.gh * c.gw, C}).to(kGpu, t);
      const at::Tensor ref = head.reference(feat, c.gh, c.gw, t);
      const at::Tensor got =
          seg_up::head_forward(gemm, hw, feat.contiguous(), c.gh, c.gw, c.band_rows);
      const at::Tensor logits =
          got.narrow(1, 0, K).view({8 * c.gh, 8 * c.gw, K}).permute({2, 0, 1});
      const double e = rel_err(logits, ref);
      std::printf("head bands %s %lldx%lld band_rows %lld: rel err %.3g\n", c10::toString(t),
                  static_cast<long long>(c.gh), static_cast<long long>(c.gw),
                  static_cast<long long>(c.band_rows), e);
      EXPECT_LE(e, t == at::kFloat ? 1e-3 : 6 * bound(t))
          << t << " " << c.gh << "x" << c.gw << " bands of " << c.band_rows;
    }
  }
}

TEST(GpuKernels, UpsampleArgmaxEqualsTheCpuPath) {
  REQUIRE_GPU();
  at::manual_seed(7);
  for (at::ScalarType t : kAllTypes) {
    for (auto [h, w, H, W] : {std::tuple<int, int, int, int>{512, 384, 3000, 4000},
                              {512, 384, 1024, 768},
                              {64, 48, 33, 47},
                              {7, 5, 1, 1}}) {
      const int K = 28, ld = 32;
      const at::Tensor cl = (at::randn({h, w, ld}) * 3).to(kGpu, t);
      at::Tensor labels = at::full({H, W}, 255, at::TensorOptions().dtype(at::kByte).device(kGpu));
      seg_up::upsample_argmax(cl, K, labels);
      // The CPU path on the same values (as float32): the same arithmetic, so equal labels.
      const at::Tensor logits =
          cl.narrow(2, 0, K).to(at::kCPU, at::kFloat).permute({2, 0, 1}).contiguous();
      std::vector<std::uint8_t> ref(static_cast<size_t>(H) * W);
      core::upsample_argmax(logits, H, W, ref.data());
      const at::Tensor got = labels.cpu();
      const int64_t differ =
          (got != at::from_blob(ref.data(), {H, W}, at::kByte)).sum().item<int64_t>();
      EXPECT_EQ(differ, 0) << t << " " << h << "x" << w << " -> " << H << "x" << W;
    }
  }
}

// The device pipeline's steps on the GPU against the same steps on the CPU: the resizes of both
// families (INTER_LINEAR, INTER_AREA and both INTER_CUBIC flavours: integer or exactly rounded
// float arithmetic, so equal bytes) and the labels, through seg_up's fused kernel and the ATen
// band path.
TEST(GpuPipeline, DeviceStepsEqualTheirCpuRuns) {
  REQUIRE_GPU();
  at::manual_seed(8);
  const std::array<float, 3> zero{0, 0, 0}, one{1, 1, 1};
  // Shrinking, enlarging, mixed, an integer factor, the network size.
  for (auto [h, w, H, W] : {std::tuple<int, int, int, int>{3000, 4000, 1024, 768},
                            {300, 211, 1024, 768},
                            {600, 1000, 1024, 768},
                            {1500, 700, 1024, 768},
                            {2048, 1536, 1024, 768},
                            {1024, 768, 1024, 768}}) {
    const at::Tensor img = at::randint(0, 256, {h, w, 3}, at::kByte);
    for (const auto interp : {core::Interp::kLinear, core::Interp::kArea, core::Interp::kCubic}) {
      for (const auto flavor : {core::CubicFlavor::kWheel, core::CubicFlavor::kOpenCV}) {
        if (interp != core::Interp::kCubic && flavor == core::CubicFlavor::kOpenCV) continue;
        // The host code is the reference: tests/python/test_resize.py holds it to the wheel.
        at::Tensor host = at::empty({H, W, 3}, at::kByte);
        core::resize_u8({img.data_ptr<std::uint8_t>(), h, w, 3, 0},
                        {host.data_ptr<std::uint8_t>(), H, W, 3, 0}, interp, flavor);
        const at::Tensor cpu = core::normalize_rgb(host.data_ptr<std::uint8_t>(), H, W,
                                                   static_cast<std::size_t>(W) * 3, zero, one);
        const at::Tensor gpu =
            core::resize_normalize(img.to(kGpu), H, W, zero, one, interp, flavor).cpu();
        const at::Tensor d = (cpu - gpu).abs();
        const double share = d.gt(0).to(at::kFloat).mean().item<double>();
        std::printf("%s resize on the GPU %dx%d -> %dx%d: max |diff| %.0f, %.4f %% differ\n",
                    core::to_string(interp), h, w, H, W, d.max().item<double>(), 100 * share);
        EXPECT_EQ(d.max().item<double>(), 0.0) << core::to_string(interp);
      }
    }
  }
  for (at::ScalarType t : kAllTypes) {
    for (auto [h, w, H, W] : {std::tuple<int, int, int, int>{512, 384, 3000, 4000},
                              {512, 384, 1024, 768},
                              {7, 5, 1, 1}}) {
      const at::Tensor logits = (at::randn({28, h, w}) * 3).to(kGpu, t);
      std::vector<std::uint8_t> want(static_cast<size_t>(H) * W);
      std::vector<float> full(static_cast<size_t>(28) * H * W);
      core::upsample_argmax(logits.to(at::kCPU, at::kFloat).contiguous(), H, W, want.data(),
                            full.data());
      const at::Tensor ref = at::from_blob(want.data(), {H, W}, at::kByte);
      for (const bool fused : {true, false}) {
        const at::Tensor got =
            core::upsample_argmax_labels(logits, H, W, int64_t{64} << 20, fused).cpu();
        EXPECT_EQ(got.ne(ref).sum().item<int64_t>(), 0)
            << t << " " << h << "x" << w << " -> " << H << "x" << W << " fused " << fused;
      }
    }
  }
}

// ---- Sapiens2's steps ------------------------------------------------------------------------

namespace schedule = core::v2::kernels_schedule;

TEST(GpuKernels, RmsNormAndSwiGlu) {
  REQUIRE_GPU();
  at::manual_seed(21);
  const auto ref = core::aten_kernel_ops();
  for (at::ScalarType t : kAllTypes) {
    // 78 columns take the scalar path for every type (not a multiple of 4 or 8 elements).
    for (auto [M, C] : {std::pair<int64_t, int64_t>{37, 80}, {5, 1536}, {3, 78}}) {
      const at::Tensor x = (at::randn({M, C}) * 3 + 1).to(kGpu, t);
      const at::Tensor w = (at::randn({C}) * 0.5 + 1).to(kGpu, t);
      const at::Tensor want = at::empty({M, C}, x.options().dtype(at::kFloat));
      ref->rms_norm(x.to(at::kFloat), w.to(at::kFloat), 1e-6, want);
      const at::Tensor got = poisoned({M, C}, t);
      fastbb::rms_norm(x, w, 1e-6, got);
      EXPECT_LE(rel_err(got, want), bound(t)) << "rms_norm " << t << " " << M << "x" << C;
      const at::Tensor inplace = x.clone();
      fastbb::rms_norm(inplace, w, 1e-6, inplace);
      EXPECT_LE(rel_err(inplace, want), bound(t)) << "rms_norm in place " << t;

      const at::Tensor h = (at::randn({M, 2 * C}) * 2).to(kGpu, t);
      const at::Tensor gw = at::empty({M, C}, x.options().dtype(at::kFloat));
      ref->swiglu(h.to(at::kFloat), gw);
      const at::Tensor g = poisoned({M, C}, t);
      fastbb::swiglu(h, g);
      EXPECT_LE(rel_err(g, gw), bound(t)) << "swiglu " << t << " " << M << "x" << C;

      const at::Tensor y = at::randn({M, C}).to(kGpu, t);
      const at::Tensor gamma = (at::rand({C}) * 1e-2).to(kGpu, t);
      const at::Tensor sw = x.to(at::kFloat) + y.to(at::kFloat) * gamma.to(at::kFloat);
      const at::Tensor sx = x.clone();
      fastbb::scale_add_(sx, y, gamma);
      EXPECT_LE(rel_err(sx, sw), bound(t)) << "scale_add_ " << t << " " << M << "x" << C;
    }
  }
}

// The fused q/k RMSNorm + RoPE against the portable network's op sequence in the same dtype
// (the rotation is bfloat16 arithmetic in both, whatever the model dtype, so the reference is
// not float32 here): per-element differences are bfloat16 roundings that the two orders of
// summation in the norm can flip, hence one bound of 1e-2 for every type. Value heads and the
// padding columns must come out untouched.
TEST(GpuKernels, QkNormRopeMatchesThePortableOps) {
  REQUIRE_GPU();
  at::manual_seed(22);
  const auto ref = core::aten_kernel_ops();
  const int64_t B = 2, pre = 9, gh = 4, gw = 3, N = pre + gh * gw;
  for (at::ScalarType t : kAllTypes) {
    for (auto [H, kv, hd] :
         {std::tuple<int64_t, int64_t, int64_t>{4, 4, 64}, {8, 2, 76}, {5, 5, 20}, {6, 1, 80}}) {
      const int64_t hdp = cudnn_hacc::padded_head_dim(hd), slots = H + 2 * kv;
      at::Tensor qkv = (at::randn({B, N, slots, hdp}) * 2).to(kGpu, t);
      qkv.narrow(3, hd, hdp - hd).zero_();
      const at::Tensor qw = (at::randn({hd}) * 0.3 + 1).to(kGpu, t);
      const at::Tensor kw = (at::randn({hd}) * 0.3 + 1).to(kGpu, t);
      const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(kGpu);
      const at::Tensor periods =
          at::pow(c10::Scalar(100), at::arange(hd / 4, bf).mul(2).div(hd / 2));
      const auto [cos, sin] = core::v2::rope_tables(periods, gh, gw);
      at::Tensor want = qkv.clone();
      ref->qk_norm_rope(want, qw, kw, cos, sin, {H, kv, hd, pre, 1e-6});
      at::Tensor got = qkv.clone();
      fastbb::qk_norm_rope_(got, qw, kw, cos, sin, {H, kv, hd, pre, 1e-6});
      const std::string what = std::string(c10::toString(t)) + " H " + std::to_string(H) + " kv " +
                               std::to_string(kv) + " hd " + std::to_string(hd);
      EXPECT_LE(rel_err(got.narrow(2, 0, H + kv), want.narrow(2, 0, H + kv)), 1e-2) << what;
      EXPECT_TRUE(got.narrow(2, H + kv, kv).equal(qkv.narrow(2, H + kv, kv))) << what;
      if (hdp > hd) {
        EXPECT_EQ(got.narrow(3, hd, hdp - hd).abs().max().item<float>(), 0.f) << what;
      }
    }
  }
}

TEST(GpuKernels, GroupedQueryAttention) {
  REQUIRE_GPU();
  at::manual_seed(23);
  cudnn_hacc::Attention attn(kGpu);
  const auto ref = core::aten_kernel_ops();
  const int64_t B = 2, S = 9 + 48;
  for (at::ScalarType t : {at::kHalf, at::kBFloat16}) {
    for (auto [H, kv, hd] :
         {std::tuple<int64_t, int64_t, int64_t>{8, 2, 64}, {8, 8, 80}, {12, 4, 76}, {6, 1, 64}}) {
      const int64_t hdp = cudnn_hacc::padded_head_dim(hd);
      at::Tensor qkv = at::randn({B, S, H + 2 * kv, hdp}).to(kGpu, t);
      qkv.narrow(3, hd, hdp - hd).zero_();
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
      const at::Tensor out = poisoned({B, S, H, hdp}, t);
      attn.packed_qkv(qkv, out, scale);
      const at::Tensor want = at::empty({B, S, H, hdp}, qkv.options().dtype(at::kFloat));
      ref->attention(qkv.to(at::kFloat), want, scale);
      const std::string what = std::string(c10::toString(t)) + " H " + std::to_string(H) + " kv " +
                               std::to_string(kv) + " hd " + std::to_string(hd);
      EXPECT_LE(rel_err(out, want), bound(t)) << what;
    }
  }
}

// seg_up's head with Sapiens2-like stage widths (four deconvolutions of falling widths, 1x1
// convolutions that change the width, which runs the non-tiled path) against its ATen schedule
// in float32 from the same rounded weights.
TEST(GpuKernels, DecoderHeadSapiens2Widths) {
  REQUIRE_GPU();
  at::manual_seed(24);
  fastbb::Gemm gemm(kGpu);
  const int64_t C = 64, K = 29, gh = 6, gw = 5;
  const std::vector<int64_t> widths = {64, 32, 32, 16};
  for (at::ScalarType t : kAllTypes) {
    std::vector<at::Tensor> deconv, conv_w, conv_b;
    int64_t in = C;
    for (int64_t out : widths) {
      deconv.push_back((at::randn({in, out, 4, 4}) * 0.1).to(t));
      in = out;
    }
    for (int64_t out : {24, 16}) {  // widths that change, and one that does not (16 -> 16)
      conv_w.push_back((at::randn({out, in, 1, 1}) * 0.2).to(t));
      conv_b.push_back(at::randn({out}).to(t));
      in = out;
    }
    const at::Tensor seg_w = (at::randn({K, in, 1, 1}) * 0.2).to(t), seg_b = at::randn({K}).to(t);
    const seg_up::HeadWeights hw =
        seg_up::prepare_head(deconv, conv_w, conv_b, seg_w, seg_b, kGpu, t);
    const seg_up::HeadWeights hf =
        seg_up::prepare_head(deconv, conv_w, conv_b, seg_w, seg_b, kGpu, at::kFloat);
    const at::Tensor feat = at::randn({gh * gw, C}).to(kGpu, t);
    const at::Tensor want = seg_up::head_forward_reference(hf, feat.to(at::kFloat), gh, gw);
    const at::Tensor got = seg_up::head_forward(gemm, hw, feat.contiguous(), gh, gw);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LE(rel_err(got.narrow(1, 0, K), want.narrow(1, 0, K)),
              t == at::kFloat ? 1e-3 : 6 * bound(t))
        << t;
  }
}

TEST(GpuKernels, KernelsModeRefusesFloat32) {
  REQUIRE_GPU();
  core::TorchScriptCheckpoint ckpt;
  core::v1::Config cfg;
  try {
    core::make_kernels_v1(ckpt, cfg, kGpu, at::kFloat);
    FAIL() << "expected Error(kBackendUnavailable)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBackendUnavailable);
    EXPECT_NE(std::string(e.what()).find("float16 or bfloat16"), std::string::npos) << e.what();
  }
}

// ---- whole-network parity against the reference logits of the authors' network ------------

namespace {

struct Parity {
  double mean = 0, p99 = 0, agree = 0;
};

at::Tensor npy_tensor(const test::Array& a, at::ScalarType t) {
  return at::from_blob(const_cast<std::uint8_t*>(a.bytes.data()), a.shape, t).clone();
}

// Logits [K, h, w] (fp32 CPU) against the reference dir's logits and image-size labels.
Parity compare(const at::Tensor& logits, const fs::path& dir) {
  const at::Tensor ref = npy_tensor(test::read_npy((dir / "logits.npy").string()), at::kFloat);
  const auto labels = test::read_npy((dir / "labels.npy").string());
  const at::Tensor d = (logits - ref).abs().flatten().to(at::kDouble);
  Parity p;
  p.mean = d.mean().item<double>();
  p.p99 = std::get<0>(d.sort())
              .select(0, static_cast<int64_t>(0.99 * double(d.numel() - 1)))
              .item<double>();
  const int H = static_cast<int>(labels.shape[0]), W = static_cast<int>(labels.shape[1]);
  std::vector<std::uint8_t> got(static_cast<size_t>(H) * W);
  core::upsample_argmax(logits.contiguous(), H, W, got.data());
  int64_t same = 0;
  for (size_t i = 0; i < got.size(); ++i) same += got[i] == labels.as<std::uint8_t>()[i];
  p.agree = double(same) / double(got.size());
  return p;
}

class GpuParity : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(GpuParity, PortableAndKernelsInFloat16MatchTheReference) {
  REQUIRE_GPU();
  const std::string name = GetParam();
  const fs::path file = test::fixture(name + "_torchscript.pt2");
  if (!fs::exists(file)) {
    GTEST_SKIP() << file << " not built (tests/fixtures/make_fixtures.py --only " << name
                 << ", or tests/fixtures/gpu.py on the GPU machine)";
  }
  const core::TorchScriptCheckpoint ckpt = core::open_torchscript(file.string());
  ASSERT_TRUE(ckpt.heads_from_graph.has_value());
  core::v1::ConfigHints hints;
  hints.heads = *ckpt.heads_from_graph;
  const core::v1::Config cfg = core::v1::infer_config(ckpt.tensors, hints);
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(test::fixture("ref/" + name))) {
    if (e.is_directory() && fs::exists(e.path() / "logits.npy") && e.path().filename() != "batch") {
      dirs.push_back(e.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  ASSERT_FALSE(dirs.empty());

  const auto portable = core::make_portable_v1(ckpt, cfg, kGpu, at::kHalf);
  const auto kernels = core::make_kernels_v1(ckpt, cfg, kGpu, at::kHalf);
  for (const auto& dir : dirs) {
    const at::Tensor x =
        npy_tensor(test::read_npy((dir / "input.npy").string()), at::kFloat).unsqueeze(0);
    for (const auto* runner : {portable.get(), kernels.get()}) {
      const at::Tensor y = runner->forward(x)[0];
      const Parity p = compare(y, dir);
      std::printf("parity %s %s %s fp16: mean |diff| %.4f, p99 %.4f, labels %.3f %%\n",
                  name.c_str(), dir.filename().c_str(), runner->backend().mode.c_str(), p.mean,
                  p.p99, 100 * p.agree);
      const std::string what = runner->backend().mode + " " + dir.filename().string();
      EXPECT_LE(p.mean, 0.05) << what;
      EXPECT_LE(p.p99, 0.25) << what;
      EXPECT_GE(p.agree, 0.995) << what;
    }
  }
  // A batch of two equals the single images (kernels).
  if (dirs.size() >= 2) {
    const at::Tensor a = npy_tensor(test::read_npy((dirs[0] / "input.npy").string()), at::kFloat);
    const at::Tensor b = npy_tensor(test::read_npy((dirs[1] / "input.npy").string()), at::kFloat);
    const at::Tensor batch = kernels->forward(at::stack({a, b}));
    const double d = (batch[0] - kernels->forward(a.unsqueeze(0))[0]).abs().max().item<double>();
    std::printf("parity %s kernels batch-2 vs single: max |diff| %.4g\n", name.c_str(), d);
    EXPECT_LE(d, 0.05);
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuParity, ::testing::Values("tiny_b", "wide_0.3b"));

// CUDA graphs: replays of a captured forward pass give the eager results, for new inputs of a
// captured shape, for a second shape, and after the oldest graph was evicted.
TEST(GpuGraphs, ReplaysEqualEagerRuns) {
  REQUIRE_GPU();
  const fs::path file = test::fixture("tiny_b_torchscript.pt2");
  const core::TorchScriptCheckpoint ckpt = core::open_torchscript(file.string());
  core::v1::ConfigHints hints;
  hints.heads = *ckpt.heads_from_graph;
  const core::v1::Config cfg = core::v1::infer_config(ckpt.tensors, hints);
  at::manual_seed(9);
  for (const bool kernels : {false, true}) {
    const auto eager = kernels ? core::make_kernels_v1(ckpt, cfg, kGpu, at::kHalf)
                               : core::make_portable_v1(ckpt, cfg, kGpu, at::kHalf);
    const auto graphed =
        core::with_cuda_graphs(kernels ? core::make_kernels_v1(ckpt, cfg, kGpu, at::kHalf)
                                       : core::make_portable_v1(ckpt, cfg, kGpu, at::kHalf),
                               /*max_graphs=*/2);
    for (const int64_t batch : {1, 1, 2, 3, 1, 2}) {
      const at::Tensor x = at::randn({batch, 3, cfg.input_h, cfg.input_w}).to(kGpu);
      const at::Tensor want = eager->forward_device(x).to(at::kFloat);
      const at::Tensor got = graphed->forward_device(x).to(at::kFloat);
      const double d = (got - want).abs().max().item<double>();
      std::printf("graphs %s batch %lld: max |replay - eager| %.3g\n",
                  kernels ? "kernels" : "portable", static_cast<long long>(batch), d);
      EXPECT_LE(d, 1e-2) << (kernels ? "kernels" : "portable") << " batch " << batch;
    }
    // Replay equal to eager proves nothing if nothing was captured (a failed capture runs
    // eagerly): the kernels mode must capture every shape. Batches 1, 1, 2, 3, 1, 2 with room
    // for two graphs: five captures (1 is captured again after its eviction), three evictions.
    const core::GraphStats st =
        print_graphs(std::string("tiny_b ") + (kernels ? "kernels" : "portable"), *graphed);
    if (kernels) {
      EXPECT_EQ(st.eager, 0u) << st.summary();
      EXPECT_EQ(st.captured, 5u) << st.summary();
      EXPECT_EQ(st.evicted, 3u) << st.summary();
      EXPECT_EQ(st.replays, 6u) << st.summary();
    }
  }
}

namespace {

// A pass that synchronises with the host (as .item() does), which no capture can hold, and
// allocates 256 MiB on the way, which a capture would take from its private pool.
class SyncingRunner final : public core::Runner {
 public:
  at::Tensor forward(const at::Tensor& x) const override { return forward_device(x).cpu(); }
  at::Tensor forward_device(const at::Tensor& x) const override {
    const at::Tensor scratch = at::zeros({int64_t{256} << 20}, x.options().dtype(at::kByte));
    const at::Tensor y = x * 2;
    const double s = scratch.sum().item<double>();  // 0, after a host synchronisation
    return y + s;
  }
  c10::Device device() const override { return kGpu; }
  const Backend& backend() const override { return backend_; }

 private:
  Backend backend_{"test", "cuda:0", "float32"};
};

std::int64_t reserved_bytes() {
  c10::cuda::CUDACachingAllocator::emptyCache();
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0).reserved_bytes[0].current;
}

}  // namespace

// A capture that fails is not the call's error: the shape runs eagerly from then on, the counts
// say so and why, and the capture's memory pool goes back to the device (LibTorch 2.11 kept it,
// and went on treating the pool as under capture).
TEST(GpuGraphs, FailedCaptureRunsEagerAndGivesItsPoolBack) {
  REQUIRE_GPU();
  std::printf("graphs: this build releases failed captures' pools itself: %s\n",
              core::cuda_graphs_release_failed_captures_here() ? "yes" : "no (LibTorch does)");
  const at::Tensor x = at::randn({4, 1024}).to(kGpu);
  const std::int64_t before = reserved_bytes();
  {
    const auto graphed = core::with_cuda_graphs(std::make_unique<SyncingRunner>(), 2);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(graphed->forward_device(x).equal(x * 2)) << "call " << i;
    }
    const core::GraphStats st = print_graphs("syncing runner", *graphed);
    EXPECT_EQ(st.captured, 0u);
    EXPECT_EQ(st.eager, 1u);
    EXPECT_EQ(st.eager_calls, 3u);
    ASSERT_EQ(st.failures.size(), 1u);
    EXPECT_NE(st.failures[0].find("[4,1024] Float"), std::string::npos) << st.failures[0];
  }
  const std::int64_t after = reserved_bytes();
  std::printf("graphs: reserved %lld bytes before, %lld after the failed capture\n",
              static_cast<long long>(before), static_cast<long long>(after));
  EXPECT_EQ(after, before) << "the failed capture's pool was not given back";
}

// cuDNN's support for an attention configuration is settled when it is checked (at load, for
// the kernels mode): the 0.3b configuration builds; a head dim that is not a multiple of 8 (what
// the weight padding exists for) is refused with a message naming cuDNN, the shape and the GPU,
// and leaves nothing cached.
TEST(GpuKernels, AttentionSupportIsCheckedBeforeTheFirstCall) {
  REQUIRE_GPU();
  cudnn_hacc::Attention attn(kGpu);
  attn.check_support(
      cudnn_hacc::packed_key(1, 16, 16, 3072, 64, sapiens_seg::kernels::DType::kF16, 0.125f, 0));
  EXPECT_EQ(attn.graphs_cached(), 1u);
  try {
    attn.check_support(
        cudnn_hacc::packed_key(1, 4, 4, 197, 60, sapiens_seg::kernels::DType::kF16, 0.125f, 0));
    ADD_FAILURE() << "head dim 60 was accepted";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    std::printf("attention support: %s\n", what.c_str());
    EXPECT_NE(what.find("cannot run this model's fused attention"), std::string::npos) << what;
    EXPECT_NE(what.find("head dim 60"), std::string::npos) << what;
  }
  EXPECT_EQ(attn.graphs_cached(), 1u);
}

// ---- Sapiens2, whole network ------------------------------------------------------------

namespace {

// Smooth random images, normalised scale: low-resolution noise upsampled bicubically.
at::Tensor smooth_input(int64_t B, int64_t H, int64_t W) {
  const at::Tensor coarse = at::randn({B, 3, 8, 6}) * 1.5;
  return at::upsample_bicubic2d(coarse, {H, W}, /*align_corners=*/false);
}

Parity compare_logits(const at::Tensor& got, const at::Tensor& ref) {
  const at::Tensor d = (got - ref).abs().flatten().to(at::kDouble);
  Parity p;
  p.mean = d.mean().item<double>();
  p.p99 = std::get<0>(d.kthvalue(static_cast<int64_t>(0.99 * double(d.numel() - 1)) + 1))
              .item<double>();
  p.agree = got.argmax(0).eq(ref.argmax(0)).to(at::kDouble).mean().item<double>();
  return p;
}

core::TensorMap s2_tensors(const fs::path& file) {
  return core::v2::to_original_names(core::SafetensorsFile::open(file.string()).all());
}

}  // namespace

TEST(GpuParityV2, PortableAndKernelsInFloat16MatchTheFloat32Network) {
  REQUIRE_GPU();
  const fs::path file = test::fixture("s2_tiny.safetensors");
  if (!fs::exists(file)) {
    GTEST_SKIP() << file << " not built (tests/fixtures/sapiens2.py, or tests/fixtures/gpu.py "
                 << "--only s2_tiny on the GPU machine)";
  }
  const core::TensorMap t = s2_tensors(file);
  const core::v2::Config cfg = core::v2::infer_config(t, {});  // 1024 x 768
  at::manual_seed(25);
  const at::Tensor x = smooth_input(2, cfg.input_h, cfg.input_w);
  const at::Tensor want = core::v2::Network(t, cfg, c10::Device(c10::kCPU), at::kFloat).forward(x);

  const auto portable = core::make_portable_v2(t, cfg, kGpu, at::kHalf);
  const auto kernels = core::make_kernels_v2(t, cfg, kGpu, at::kHalf);
  for (const auto* runner : {portable.get(), kernels.get()}) {
    const at::Tensor y = runner->forward(x);
    for (int64_t b = 0; b < 2; ++b) {
      const Parity p = compare_logits(y[b], want[b]);
      std::printf("parity s2_tiny image %lld %s fp16: mean |diff| %.4f, p99 %.4f, labels %.3f %%\n",
                  static_cast<long long>(b), runner->backend().mode.c_str(), p.mean, p.p99,
                  100 * p.agree);
      EXPECT_LE(p.mean, 0.05) << runner->backend().mode;
      EXPECT_LE(p.p99, 0.25) << runner->backend().mode;
      EXPECT_GE(p.agree, 0.995) << runner->backend().mode;
    }
  }

  // bfloat16: the kernels against the same schedule on ATen ops in bfloat16 on the GPU (a random
  // network is too sensitive for the float16 bars in bfloat16; this holds the kernels to their
  // own reference), and a batch of two equals the single images.
  const auto kb = core::make_kernels_v2(t, cfg, kGpu, at::kBFloat16);
  const schedule::Weights wb = schedule::prepare(t, cfg, kGpu, at::kBFloat16);
  const auto aten = core::aten_kernel_ops();
  const at::Tensor yk = kb->forward_device(x.to(kGpu)).to(at::kFloat);
  const at::Tensor ya = schedule::forward(wb, cfg, *aten, x.to(kGpu)).to(at::kFloat);
  for (int64_t b = 0; b < 2; ++b) {
    const Parity p = compare_logits(yk[b].cpu(), ya[b].cpu());
    std::printf(
        "s2_tiny image %lld kernels bf16 vs ATen schedule bf16: mean |diff| %.4f, p99 %.4f, "
        "labels %.3f %%\n",
        static_cast<long long>(b), p.mean, p.p99, 100 * p.agree);
    EXPECT_LE(p.mean, 0.05);
    EXPECT_GE(p.agree, 0.98);
  }
  // Batch 2 against the single image: other GEMM shapes may pick other algorithms, so the
  // float16 bars apply rather than a maximum.
  const at::Tensor one = kernels->forward(x.narrow(0, 1, 1));
  const Parity pb = compare_logits(one[0], kernels->forward(x)[1]);
  std::printf(
      "parity s2_tiny kernels batch-2 vs single: mean |diff| %.4g, p99 %.4g, labels %.3f %%\n",
      pb.mean, pb.p99, 100 * pb.agree);
  EXPECT_LE(pb.mean, 0.05);
  EXPECT_LE(pb.p99, 0.25);
  EXPECT_GE(pb.agree, 0.995);
}

TEST(GpuGraphs, Sapiens2KernelsReplaysEqualEagerRuns) {
  REQUIRE_GPU();
  const fs::path file = test::fixture("s2_tiny.safetensors");
  if (!fs::exists(file)) GTEST_SKIP() << file << " not built";
  const core::TensorMap t = s2_tensors(file);
  core::v2::ConfigHints hints;
  hints.input_h = 256;
  hints.input_w = 192;
  const core::v2::Config cfg = core::v2::infer_config(t, hints);
  at::manual_seed(26);
  const auto eager = core::make_kernels_v2(t, cfg, kGpu, at::kHalf);
  const auto graphed =
      core::with_cuda_graphs(core::make_kernels_v2(t, cfg, kGpu, at::kHalf), /*max_graphs=*/2);
  for (const int64_t batch : {1, 1, 2, 3, 1}) {
    const at::Tensor x = smooth_input(batch, cfg.input_h, cfg.input_w).to(kGpu);
    const double d =
        (graphed->forward_device(x).to(at::kFloat) - eager->forward_device(x).to(at::kFloat))
            .abs()
            .max()
            .item<double>();
    std::printf("graphs s2 kernels batch %lld: max |replay - eager| %.3g\n",
                static_cast<long long>(batch), d);
    EXPECT_LE(d, 1e-2) << "batch " << batch;
  }
  // Every shape captured: batches 1, 1, 2, 3, 1 with room for two graphs.
  const core::GraphStats st = print_graphs("s2_tiny kernels", *graphed);
  EXPECT_EQ(st.eager, 0u) << st.summary();
  EXPECT_EQ(st.captured, 4u) << st.summary();
  EXPECT_EQ(st.evicted, 2u) << st.summary();
}
