// Host-side logic of the kernels backend, on the CPU: the mode's availability decision, the
// head-dim padding rule and its weight padding, plan/graph keys and argument checks, the patch
// matrix, the sub-pixel index arithmetic of the head, and the per-pixel upsample + argmax code
// that the CUDA kernel runs. The device code itself is checked by test_kernels_gpu.cpp.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <unordered_set>
#include <vector>

#include "core/backends.hpp"
#include "core/tensor_ops.hpp"
#include "kernels/cudnn_hacc/attention.hpp"
#include "kernels/fastbb/fastbb.hpp"
#include "kernels/seg_up/head.hpp"
#include "kernels/seg_up/upsample_argmax.hpp"
#include "sapiens_seg/error.hpp"

using namespace sapiens_seg;
namespace cudnn_hacc = sapiens_seg::kernels::cudnn_hacc;
namespace fastbb = sapiens_seg::kernels::fastbb;
namespace seg_up = sapiens_seg::kernels::seg_up;

namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace

TEST(UnitKernelsAvailability, EachReasonIsReported) {
  core::KernelsProbe p;
  EXPECT_NE(core::kernels_unavailable_reason_for(p).find("not compiled into this build"),
            std::string::npos);
  p.compiled = true;
  EXPECT_EQ(core::kernels_unavailable_reason_for(p), "no CUDA device is available");
  p.cuda_available = true;
  EXPECT_NE(core::kernels_unavailable_reason_for(p).find("CUDA devices only (device is cpu)"),
            std::string::npos);
  p.device = c10::Device(c10::kCUDA, 1);
  p.major = 7;
  p.minor = 5;
  EXPECT_EQ(core::kernels_unavailable_reason_for(p),
            "cuda:1 has compute capability 7.5; the kernels backend needs 8.0 or newer");
  for (auto [major, minor] : {std::pair{8, 0}, {8, 6}, {8, 9}, {9, 0}, {12, 0}}) {
    p.major = major;
    p.minor = minor;
    EXPECT_EQ(core::kernels_unavailable_reason_for(p), "") << major << "." << minor;
  }
}

TEST(UnitKernelsAvailability, ThisBuildHasThemCompiledIn) {
  EXPECT_TRUE(core::kernels_compiled());
  if (!at::hasCUDA()) {
    EXPECT_EQ(core::kernels_unavailable_reason(c10::Device(c10::kCPU)),
              "no CUDA device is available");
    EXPECT_EQ(core::cuda_capability(0), (std::pair<int, int>{0, 0}));
  }
  // Whatever the machine, the CPU never runs the kernels.
  EXPECT_FALSE(core::kernels_unavailable_reason(c10::Device(c10::kCPU)).empty());
}

TEST(UnitKernelsAttention, HeadDimPaddingRule) {
  // Sapiens v1 0.3b/1b: 64, 0.6b: 80, 2b: 60; Sapiens2 5b: 76.
  EXPECT_EQ(cudnn_hacc::padded_head_dim(64), 64);
  EXPECT_EQ(cudnn_hacc::padded_head_dim(80), 80);
  EXPECT_EQ(cudnn_hacc::padded_head_dim(60), 64);
  EXPECT_EQ(cudnn_hacc::padded_head_dim(76), 80);
  EXPECT_EQ(cudnn_hacc::padded_head_dim(1), 8);
  EXPECT_EQ(cudnn_hacc::padded_head_dim(256), 256);
  EXPECT_THROW(cudnn_hacc::padded_head_dim(0), c10::Error);
  EXPECT_THROW(cudnn_hacc::padded_head_dim(257), c10::Error);
}

// Padding folded into the weights must leave the attention block's output unchanged: the
// padded Q and K columns are zero, so are V's (hence the output's), and the projection ignores
// them.
TEST(UnitKernelsAttention, WeightPaddingLeavesTheBlockUnchanged) {
  at::manual_seed(7);
  for (int64_t hd : {60, 64, 76, 80}) {
    const int64_t H = 3, C = H * hd, B = 2, N = 11, hdp = cudnn_hacc::padded_head_dim(hd);
    const at::Tensor x = at::randn({B, N, C}, at::kDouble);
    const at::Tensor wqkv = at::randn({3 * C, C}, at::kDouble) / std::sqrt(double(C));
    const at::Tensor bqkv = at::randn({3 * C}, at::kDouble);
    const at::Tensor wproj = at::randn({C, C}, at::kDouble) / std::sqrt(double(C));
    const double scale = 1.0 / std::sqrt(double(hd));

    auto block = [&](const at::Tensor& w, const at::Tensor& b, const at::Tensor& p, int64_t d) {
      const at::Tensor qkv = at::linear(x, w, b).view({B, N, 3, H, d}).permute({2, 0, 3, 1, 4});
      const at::Tensor s = at::matmul(qkv[0], qkv[1].transpose(-1, -2)) * scale;
      const at::Tensor o = at::matmul(s.softmax(-1), qkv[2]);  // [B, H, N, d]
      return std::pair{at::linear(o.transpose(1, 2).reshape({B, N, H * d}), p), o};
    };
    const auto [ref, o_ref] = block(wqkv, bqkv, wproj, hd);
    const at::Tensor wq = cudnn_hacc::pad_qkv_weight(wqkv, H, hd, hdp);
    const at::Tensor bq = cudnn_hacc::pad_qkv_bias(bqkv, H, hd, hdp);
    const at::Tensor wp = cudnn_hacc::pad_proj_weight(wproj, H, hd, hdp);
    ASSERT_EQ(wq.sizes(), (at::IntArrayRef{3 * H * hdp, C}));
    ASSERT_EQ(bq.sizes(), (at::IntArrayRef{3 * H * hdp}));
    ASSERT_EQ(wp.sizes(), (at::IntArrayRef{C, H * hdp}));
    const auto [got, o_pad] = block(wq, bq, wp, hdp);
    EXPECT_LT(max_diff(got, ref), 1e-9) << "hd " << hd;
    if (hdp > hd) {
      EXPECT_EQ(o_pad.narrow(-1, hd, hdp - hd).abs().max().item<double>(), 0.0) << "hd " << hd;
    } else {
      EXPECT_TRUE(wq.is_same(wqkv) && wp.is_same(wproj)) << "no copy when nothing is padded";
    }
  }
}

TEST(UnitKernelsAttention, PackedQkvKeyChecksAndStrides) {
  const auto half = at::TensorOptions().dtype(at::kHalf);
  const at::Tensor qkv = at::empty({2, 197, 3, 4, 64}, half);
  const at::Tensor out = at::empty({2, 197, 4, 64}, half);
  const cudnn_hacc::SdpaKey k = cudnn_hacc::packed_qkv_key(qkv, out, 0.125f);
  EXPECT_EQ(k.b, 2);
  EXPECT_EQ(k.h, 4);
  EXPECT_EQ(k.s, 197);
  EXPECT_EQ(k.d, 64);
  // Q/K/V as [B, H, S, D] views into [B, S, 3, H, D]; O as [B, S, H, D].
  EXPECT_EQ(k.qkv_stride, (std::array<int64_t, 4>{197 * 3 * 4 * 64, 64, 3 * 4 * 64, 1}));
  EXPECT_EQ(k.o_stride, (std::array<int64_t, 4>{197 * 4 * 64, 64, 4 * 64, 1}));

  EXPECT_THROW(cudnn_hacc::packed_qkv_key(qkv.to(at::kFloat), out.to(at::kFloat), 0.1f),
               c10::Error);  // no float32 path
  EXPECT_THROW(cudnn_hacc::packed_qkv_key(at::empty({2, 197, 3, 4, 60}, half),
                                          at::empty({2, 197, 4, 60}, half), 0.1f),
               c10::Error);  // unpadded head dim 60
  EXPECT_THROW(cudnn_hacc::packed_qkv_key(qkv, at::empty({2, 196, 4, 64}, half), 0.1f), c10::Error);
  EXPECT_THROW(cudnn_hacc::packed_qkv_key(qkv.transpose(0, 1), out, 0.1f), c10::Error);
  EXPECT_THROW(cudnn_hacc::packed_qkv_key(qkv, out.to(at::kBFloat16), 0.1f), c10::Error);

  // Keys: equal shapes hash and compare equal; any difference makes a new graph.
  std::unordered_set<cudnn_hacc::SdpaKey, cudnn_hacc::SdpaKeyHash> keys;
  keys.insert(k);
  keys.insert(cudnn_hacc::packed_qkv_key(at::empty({2, 197, 3, 4, 64}, half),
                                         at::empty({2, 197, 4, 64}, half), 0.125f));
  EXPECT_EQ(keys.size(), 1u);
  keys.insert(cudnn_hacc::packed_qkv_key(qkv, out, 0.1f));
  keys.insert(cudnn_hacc::packed_qkv_key(qkv.to(at::kBFloat16), out.to(at::kBFloat16), 0.125f));
  keys.insert(cudnn_hacc::packed_qkv_key(at::empty({1, 197, 3, 4, 64}, half),
                                         at::empty({1, 197, 4, 64}, half), 0.125f));
  EXPECT_EQ(keys.size(), 4u);
}

TEST(UnitKernelsGemm, LinearKeyChecksOperands) {
  const auto half = at::TensorOptions().dtype(at::kHalf);
  const at::Tensor x = at::empty({300, 256}, half), w = at::empty({384, 256}, half);
  const at::Tensor b = at::empty({384}, half), out = at::empty({300, 384}, half);
  const fastbb::GemmKey k =
      fastbb::linear_key(x, w, b, at::Tensor(), fastbb::Activation::kNone, out);
  EXPECT_EQ(k.m, 300);
  EXPECT_EQ(k.n, 384);
  EXPECT_EQ(k.k, 256);
  EXPECT_EQ(k.ldx, 256);
  EXPECT_EQ(k.ldo, 384);
  EXPECT_TRUE(k.bias);
  EXPECT_FALSE(k.residual);
  EXPECT_EQ(k.align_x, 16);

  using A = fastbb::Activation;
  EXPECT_THROW(fastbb::linear_key(x, at::empty({384, 255}, half), b, {}, A::kNone, out),
               c10::Error);                                                      // K mismatch
  EXPECT_THROW(fastbb::linear_key(x, w.t(), b, {}, A::kNone, out), c10::Error);  // layout
  EXPECT_THROW(fastbb::linear_key(x, w, at::empty({383}, half), {}, A::kNone, out), c10::Error);
  EXPECT_THROW(fastbb::linear_key(x, w.to(at::kBFloat16), b, {}, A::kNone, out), c10::Error);
  EXPECT_THROW(fastbb::linear_key(x, w, b, at::empty({300, 383}, half), A::kNone, out), c10::Error);
  EXPECT_THROW(fastbb::linear_key(x.t(), at::empty({384, 300}, half), b, {}, A::kNone, out),
               c10::Error);  // x must have unit column stride
  EXPECT_THROW(fastbb::linear_key(x.to(at::kDouble), w.to(at::kDouble), {}, {}, A::kNone,
                                  out.to(at::kDouble)),
               c10::Error);  // unsupported dtype
  // The erf GELU runs over a contiguous output only.
  const at::Tensor wide = at::empty({300, 400}, half);
  EXPECT_THROW(fastbb::linear_key(x, w, b, {}, A::kGeluErf, wide.narrow(1, 0, 384)), c10::Error);

  // Row blocks of a bigger buffer: the row stride is kept, the pointer's alignment is reported.
  const at::Tensor big = at::empty({1000, 256}, half);
  const fastbb::GemmKey kb = fastbb::linear_key(big.narrow(0, 3, 300), w, {}, {}, A::kNone, out);
  EXPECT_EQ(kb.ldx, 256);
  EXPECT_EQ(kb.align_x, 16);  // 3 rows of 512 bytes
  const at::Tensor odd = at::empty({1000, 257}, half);
  const fastbb::GemmKey ko =
      fastbb::linear_key(odd.narrow(0, 1, 300).narrow(1, 0, 256), w, {}, {}, A::kNone, out);
  EXPECT_EQ(ko.ldx, 257);
  EXPECT_EQ(ko.align_x, 2);

  // In place: residual == out, with out's layout.
  const fastbb::GemmKey kr = fastbb::linear_key(x, w, b, out, A::kNone, out);
  EXPECT_TRUE(kr.residual);
  EXPECT_EQ(kr.ldc, kr.ldo);

  std::unordered_set<fastbb::GemmKey, fastbb::GemmKeyHash> keys{k, kb, ko, kr};
  keys.insert(fastbb::linear_key(x, w, b, at::Tensor(), A::kNone, out));
  EXPECT_EQ(keys.size(), 4u);
  keys.insert(fastbb::linear_key(x, w, b, at::Tensor(), A::kGeluTanhEpilogue, out));
  EXPECT_EQ(keys.size(), 5u);
}

TEST(UnitKernelsLayerNorm, ChecksArguments) {
  const auto half = at::TensorOptions().dtype(at::kHalf);
  const at::Tensor x = at::empty({8, 64}, half), w = at::empty({64}, half);
  EXPECT_NO_THROW(fastbb::check_layer_norm_args(x, w, w, x));
  EXPECT_THROW(fastbb::check_layer_norm_args(x, at::empty({63}, half), w, x), c10::Error);
  EXPECT_THROW(fastbb::check_layer_norm_args(x, w, w.to(at::kFloat), x), c10::Error);
  EXPECT_THROW(
      fastbb::check_layer_norm_args(x.t(), at::empty({8}, half), at::empty({8}, half), x.t()),
      c10::Error);
  EXPECT_THROW(fastbb::check_layer_norm_args(x, w, w, at::empty({8, 65}, half)), c10::Error);
  // The launch itself refuses CPU tensors.
  EXPECT_THROW(fastbb::layer_norm(x, w, w, 1e-6, x), c10::Error);
}

TEST(UnitKernelsPatchEmbed, PatchMatrixTimesWeightIsTheConvolution) {
  at::manual_seed(3);
  const at::Tensor img = at::randn({2, 3, 48, 32});
  const at::Tensor w = at::randn({20, 3, 16, 16}), b = at::randn({20});
  const at::Tensor conv = at::conv2d(img, w, b, {16, 16}).flatten(2).transpose(1, 2);  // [B,N,C]
  const at::Tensor p = fastbb::patches(img, 16);
  ASSERT_EQ(p.sizes(), (at::IntArrayRef{2 * 3 * 2, 768}));
  const at::Tensor got = at::addmm(b, p, w.reshape({20, -1}).t()).view({2, 6, 20});
  EXPECT_LT(max_diff(got, conv), 1e-3);
  EXPECT_THROW(fastbb::patches(at::randn({1, 3, 40, 32}), 16), c10::Error);
}

// The head's transposed convolutions as four parity GEMMs over the zero-bordered input, with
// the tap table and row offsets head_forward uses, against ConvTranspose2d(k4, s2, p1).
TEST(UnitKernelsHead, SubpixelDeconvolutionMatchesConvTranspose) {
  at::manual_seed(5);
  for (auto [H, W] : {std::pair<int64_t, int64_t>{4, 3}, {3, 5}, {1, 1}, {8, 6}}) {
    const int64_t Cin = 6, Cout = 5;
    const at::Tensor x = at::randn({1, Cin, H, W}, at::kDouble);
    const at::Tensor w = at::randn({Cin, Cout, 4, 4}, at::kDouble);
    const at::Tensor ref = at::conv_transpose2d(x, w, {}, /*stride=*/2, /*padding=*/1);
    const at::Tensor taps = w.permute({2, 3, 1, 0}).contiguous();  // as prepare_head lays it out
    const at::Tensor got =
        seg_up::subpixel_deconv_reference(x[0].permute({1, 2, 0}).contiguous(), taps);
    ASSERT_EQ(got.sizes(), (at::IntArrayRef{2 * H, 2 * W, Cout}));
    EXPECT_LT(max_diff(got.permute({2, 0, 1}), ref[0]), 1e-10) << H << "x" << W;
  }
}

TEST(UnitKernelsHead, PrepareHeadLayouts) {
  at::manual_seed(9);
  const int64_t C = 16, HC = 8, K = 28;
  std::array<at::Tensor, 3> deconv{at::randn({C, HC, 4, 4}), at::randn({HC, HC, 4, 4}),
                                   at::randn({HC, HC, 4, 4})};
  std::array<at::Tensor, 3> conv_w, conv_b;
  for (int s = 0; s < 3; ++s) {
    conv_w[s] = at::randn({HC, HC, 1, 1});
    conv_b[s] = at::randn({HC});
  }
  const at::Tensor seg_w = at::randn({K, HC, 1, 1}), seg_b = at::randn({K});
  const seg_up::HeadWeights h =
      seg_up::prepare_head(deconv, conv_w, conv_b, seg_w, seg_b, c10::Device(c10::kCPU), at::kHalf);
  EXPECT_EQ(h.classes, K);
  ASSERT_EQ(h.seg_w.sizes(), (at::IntArrayRef{32, HC}));
  EXPECT_EQ(h.seg_w.narrow(0, K, 4).abs().max().item<float>(), 0.f);
  EXPECT_EQ(h.seg_b.narrow(0, K, 4).abs().max().item<float>(), 0.f);
  EXPECT_EQ(h.seg_w.scalar_type(), at::kHalf);
  ASSERT_EQ(h.deconv[0].sizes(), (at::IntArrayRef{4, 4, HC, C}));
  // Tap (ky, kx) of deconvolution 0 is the Linear weight [out, in] = w[:, :, ky, kx]^T.
  EXPECT_LT(max_diff(h.deconv[0][1][3], deconv[0].select(3, 3).select(2, 1).t().to(at::kHalf)),
            1e-6);
  EXPECT_EQ(h.conv_w[2].sizes(), (at::IntArrayRef{HC, HC}));
}

// The per-pixel code of the CUDA upsample + argmax kernel, run on the host, gives exactly the
// labels of the CPU path (core::upsample_argmax), up- and down-sampling, odd sizes included.
TEST(UnitKernelsUpsampleArgmax, PerPixelCodeEqualsTheCpuPath) {
  at::manual_seed(11);
  struct Case {
    int h, w, H, W;
  };
  for (const Case c : {Case{7, 5, 33, 47}, Case{64, 48, 30, 20}, Case{16, 12, 128, 96},
                       Case{1, 1, 3, 2}, Case{512, 384, 1000, 750}}) {
    const int K = 28;
    // Coarse random logits, upsampled a little, so that many neighbouring pixels agree.
    const at::Tensor logits = at::randn({K, c.h, c.w}).mul_(3).contiguous();
    std::vector<std::uint8_t> ref(static_cast<size_t>(c.H) * c.W);
    core::upsample_argmax(logits, c.H, c.W, ref.data());
    const at::Tensor cl = logits.permute({1, 2, 0}).contiguous();  // [h, w, K] as the head writes
    const float* p = cl.const_data_ptr<float>();
    auto load = [&](int k, int row, int col) { return p[(int64_t(row) * c.w + col) * K + k]; };
    int64_t differ = 0;
    for (int y = 0; y < c.H; ++y) {
      const seg_up::Tap ty = seg_up::bilinear_tap(y, c.h, c.H);
      for (int x = 0; x < c.W; ++x) {
        const seg_up::Tap tx = seg_up::bilinear_tap(x, c.w, c.W);
        differ += seg_up::blend_argmax(load, K, ty, tx) != ref[size_t(y) * c.W + x];
      }
    }
    EXPECT_EQ(differ, 0) << c.h << "x" << c.w << " -> " << c.H << "x" << c.W;
  }
}

TEST(UnitKernelsUpsampleArgmax, TapsFollowPyTorchsHalfPixelRule) {
  // 2x upsampling: out 0 -> src -0.25 clamped to 0; out 1 -> 0.25; last -> clamps at the border.
  auto t0 = seg_up::bilinear_tap(0, 4, 8);
  EXPECT_EQ(t0.i0, 0);
  EXPECT_EQ(t0.i1, 1);
  EXPECT_FLOAT_EQ(t0.l1, 0.f);
  auto t1 = seg_up::bilinear_tap(1, 4, 8);
  EXPECT_FLOAT_EQ(t1.l1, 0.25f);
  auto t7 = seg_up::bilinear_tap(7, 4, 8);
  EXPECT_EQ(t7.i0, 3);
  EXPECT_EQ(t7.i1, 3);
}

TEST(UnitKernelsRunner, KernelsRunnerRefusesToRunWithoutAGpu) {
  if (at::hasCUDA()) GTEST_SKIP() << "this machine has a GPU; the gpu tests cover it";
  core::TorchScriptCheckpoint ckpt;
  core::v1::Config cfg;
  try {
    core::make_kernels_v1(ckpt, cfg, c10::Device(c10::kCPU), at::kHalf);
    FAIL() << "expected Error(kBackendUnavailable)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBackendUnavailable);
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}
