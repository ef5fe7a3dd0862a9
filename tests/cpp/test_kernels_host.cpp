// Host-side logic of the kernels backend, on the CPU: the mode's availability decision, the
// head-dim padding rule and its weight padding, plan/graph keys and argument checks, cuDNN's
// attention-support decision, the CUDA-graph runner's bookkeeping (with captures that fail on
// purpose), the patch
// matrix, the sub-pixel index arithmetic of the head, the per-pixel upsample + argmax code that
// the CUDA kernel runs, and Sapiens2's kernels schedule (repacked weights, grouped heads, padded
// head dims) run on ATen ops against the portable network. The device code itself is checked by
// test_kernels_gpu.cpp.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <memory>
#include <optional>
#include <stdexcept>
#include <unordered_set>
#include <vector>

#include <filesystem>

#include "core/backends/backends.hpp"
#include "core/backends/cuda_graphs.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "core/checkpoint/torchscript.hpp"
#include "core/kernel_ops.hpp"
#include "core/tensor_ops.hpp"
#include "core/v1/kernels_schedule.hpp"
#include "core/v2/kernels_schedule.hpp"
#include "core/v2/sapiens2.hpp"
#include "kernels/cudnn_hacc/attention.hpp"
#include "kernels/fastbb/fastbb.hpp"
#include "kernels/fastbb/sapiens2_math.hpp"
#include "kernels/seg_up/head.hpp"
#include "kernels/seg_up/upsample_argmax.hpp"
#include "sapiens_seg/error.hpp"
#include "test_util.hpp"

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
  EXPECT_EQ(k.qkv_stride,
            (std::array<int64_t, 4>{int64_t{197} * 3 * 4 * 64, 64, int64_t{3} * 4 * 64, 1}));
  EXPECT_EQ(k.o_stride, (std::array<int64_t, 4>{int64_t{197} * 4 * 64, 64, int64_t{4} * 64, 1}));

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

// Sapiens2's grouped-query blocks: [B, S, H + 2*Hk, D] with fewer key/value heads.
TEST(UnitKernelsAttention, PackedQkvKeyGroupedHeads) {
  const auto half = at::TensorOptions().dtype(at::kHalf);
  const at::Tensor qkv = at::empty({2, 57, 8 + 2 * 2, 80}, half);
  const at::Tensor out = at::empty({2, 57, 8, 80}, half);
  const cudnn_hacc::SdpaKey k = cudnn_hacc::packed_qkv_key(qkv, out, 0.1f);
  EXPECT_EQ(k.h, 8);
  EXPECT_EQ(k.hk, 2);
  EXPECT_EQ(k.qkv_stride, (std::array<int64_t, 4>{int64_t{57} * 12 * 80, 80, int64_t{12} * 80, 1}));
  EXPECT_EQ(k.k_offset, 8 * 80);
  EXPECT_EQ(k.v_offset, 10 * 80);
  // v1's [B, S, 3, H, D] is the case Hk = H.
  const cudnn_hacc::SdpaKey m =
      cudnn_hacc::packed_qkv_key(at::empty({2, 57, 3, 8, 80}, half), out, 0.1f);
  EXPECT_EQ(m.hk, 8);
  EXPECT_EQ(m.k_offset, 8 * 80);
  EXPECT_EQ(m.v_offset, 16 * 80);
  EXPECT_FALSE(m == k);
  EXPECT_EQ(m, cudnn_hacc::packed_qkv_key(at::empty({2, 57, 24, 80}, half), out, 0.1f));
  // Slots that do not split into H + 2*Hk, and Hk that does not divide H.
  EXPECT_THROW(cudnn_hacc::packed_qkv_key(at::empty({2, 57, 13, 80}, half), out, 0.1f), c10::Error);
  EXPECT_THROW(cudnn_hacc::packed_qkv_key(at::empty({2, 57, 6 + 2 * 4, 80}, half),
                                          at::empty({2, 57, 6, 80}, half), 0.1f),
               c10::Error);
}

TEST(UnitKernelsAttention, PadHeadRowsKeepsEachHeadsRows) {
  at::manual_seed(4);
  const at::Tensor w = at::randn({int64_t{5} * 76, 12}), b = at::randn({int64_t{5} * 76});
  const at::Tensor wp = cudnn_hacc::pad_head_rows(w, 5, 76, 80);
  const at::Tensor bp = cudnn_hacc::pad_head_rows(b, 5, 76, 80);
  ASSERT_EQ(wp.sizes(), (at::IntArrayRef{int64_t{5} * 80, 12}));
  ASSERT_EQ(bp.sizes(), (at::IntArrayRef{int64_t{5} * 80}));
  for (int64_t s = 0; s < 5; ++s) {
    EXPECT_EQ(max_diff(wp.narrow(0, s * 80, 76), w.narrow(0, s * 76, 76)), 0.0);
    EXPECT_EQ(wp.narrow(0, s * 80 + 76, 4).abs().max().item<float>(), 0.f);
    EXPECT_EQ(max_diff(bp.narrow(0, s * 80, 76), b.narrow(0, s * 76, 76)), 0.0);
    EXPECT_EQ(bp.narrow(0, s * 80 + 76, 4).abs().max().item<float>(), 0.f);
  }
  EXPECT_TRUE(cudnn_hacc::pad_head_rows(w, 5, 76, 76).is_same(w));
  EXPECT_THROW(cudnn_hacc::pad_head_rows(w, 4, 76, 80), c10::Error);
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

TEST(UnitKernelsSapiens2Steps, ChecksArguments) {
  const auto half = at::TensorOptions().dtype(at::kHalf);
  const at::Tensor x = at::empty({8, 64}, half), w = at::empty({64}, half);
  EXPECT_NO_THROW(fastbb::check_rms_norm_args(x, w, x));
  EXPECT_THROW(fastbb::check_rms_norm_args(x, at::empty({32}, half), x), c10::Error);
  EXPECT_THROW(fastbb::check_rms_norm_args(x, w.to(at::kBFloat16), x), c10::Error);
  EXPECT_THROW(fastbb::rms_norm(x, w, 1e-6, x), c10::Error);  // CPU tensors

  const at::Tensor h = at::empty({8, 128}, half);
  EXPECT_NO_THROW(fastbb::check_swiglu_args(h, x));
  EXPECT_THROW(fastbb::check_swiglu_args(h, at::empty({8, 65}, half)), c10::Error);
  EXPECT_THROW(fastbb::check_swiglu_args(at::empty({8, 127}, half), x), c10::Error);
  EXPECT_THROW(fastbb::swiglu(h, x), c10::Error);

  EXPECT_NO_THROW(fastbb::check_scale_add_args(x, x, w));
  EXPECT_THROW(fastbb::check_scale_add_args(x, at::empty({8, 32}, half), w), c10::Error);
  EXPECT_THROW(fastbb::check_scale_add_args(x, x, at::empty({32}, half)), c10::Error);
  EXPECT_THROW(fastbb::check_scale_add_args(x, x.to(at::kFloat), w), c10::Error);
  EXPECT_THROW(fastbb::scale_add_(x, x, w), c10::Error);

  // qkv [B, N, H + 2*kv, D] with 9 prefix tokens, hd 76 padded to 80.
  const at::Tensor qkv = at::empty({2, 9 + 12, 8 + 2 * 2, 80}, half);
  const at::Tensor nw = at::empty({76}, half);
  const auto bf = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor cos = at::empty({12, 76}, bf), sin = at::empty({12, 76}, bf);
  const fastbb::QkRope p{8, 2, 76, 9, 1e-6};
  EXPECT_NO_THROW(fastbb::check_qk_norm_rope_args(qkv, nw, nw, cos, sin, p));
  fastbb::QkRope wrong = p;
  wrong.k_heads = 3;  // 8 + 2*3 != 12 slots
  EXPECT_THROW(fastbb::check_qk_norm_rope_args(qkv, nw, nw, cos, sin, wrong), c10::Error);
  wrong = p;
  wrong.head_dim = 88;  // wider than the slot
  EXPECT_THROW(fastbb::check_qk_norm_rope_args(qkv, nw, nw, cos, sin, wrong), c10::Error);
  wrong = p;
  wrong.prefix = 8;  // tables cover 12 patch tokens, not 13
  EXPECT_THROW(fastbb::check_qk_norm_rope_args(qkv, nw, nw, cos, sin, wrong), c10::Error);
  EXPECT_THROW(fastbb::check_qk_norm_rope_args(qkv, nw, nw, cos.to(at::kHalf), sin, p),
               c10::Error);  // the tables are bfloat16
  EXPECT_THROW(fastbb::check_qk_norm_rope_args(qkv, at::empty({64}, half), nw, cos, sin, p),
               c10::Error);
  EXPECT_THROW(fastbb::qk_norm_rope_(qkv, nw, nw, cos, sin, p), c10::Error);  // CPU tensors
}

TEST(UnitKernelsPatchEmbed, PatchMatrixTimesWeightIsTheConvolution) {
  at::manual_seed(3);
  const at::Tensor img = at::randn({2, 3, 48, 32});
  const at::Tensor w = at::randn({20, 3, 16, 16}), b = at::randn({20});
  const at::Tensor conv = at::conv2d(img, w, b, {16, 16}).flatten(2).transpose(1, 2);  // [B,N,C]
  const at::Tensor p = fastbb::patches(img, 16);
  ASSERT_EQ(p.sizes(), (at::IntArrayRef{int64_t{2} * 3 * 2, 768}));
  const at::Tensor got = at::addmm(b, p, w.reshape({20, -1}).t()).view({2, 6, 20});
  EXPECT_LT(max_diff(got, conv), 1e-3);
  EXPECT_THROW(fastbb::patches(at::randn({1, 3, 40, 32}), 16), c10::Error);
}

// The head's transposed convolutions as four parity GEMMs over the zero-bordered input, with
// the tap table, row offsets and bands of input rows head_forward uses (the last band shorter
// when the bands do not divide the rows), against ConvTranspose2d(k4, s2, p1).
TEST(UnitKernelsHead, SubpixelDeconvolutionMatchesConvTranspose) {
  at::manual_seed(5);
  for (auto [H, W] : {std::pair<int64_t, int64_t>{4, 3}, {3, 5}, {1, 1}, {8, 6}, {7, 4}}) {
    const int64_t Cin = 6, Cout = 5;
    const at::Tensor x = at::randn({1, Cin, H, W}, at::kDouble);
    const at::Tensor w = at::randn({Cin, Cout, 4, 4}, at::kDouble);
    const at::Tensor ref = at::conv_transpose2d(x, w, {}, /*stride=*/2, /*padding=*/1);
    const at::Tensor taps = w.permute({2, 3, 1, 0}).contiguous();  // as prepare_head lays it out
    for (const int64_t band : {0, 1, 2, 3}) {
      const at::Tensor got =
          seg_up::subpixel_deconv_reference(x[0].permute({1, 2, 0}).contiguous(), taps, band);
      ASSERT_EQ(got.sizes(), (at::IntArrayRef{2 * H, 2 * W, Cout}));
      EXPECT_LT(max_diff(got.permute({2, 0, 1}), ref[0]), 1e-10)
          << H << "x" << W << " band " << band;
    }
  }
  EXPECT_EQ(seg_up::deconv_band_rows(192), 84);  // 84 * 194 rows of 768 halves: 25 MB
  EXPECT_EQ(seg_up::deconv_band_rows(20000), 1);
}

TEST(UnitKernelsHead, PrepareHeadLayouts) {
  at::manual_seed(9);
  const int64_t C = 16, HC = 8, K = 28;
  const std::vector<at::Tensor> deconv{at::randn({C, HC, 4, 4}), at::randn({HC, HC, 4, 4}),
                                       at::randn({HC, HC, 4, 4})};
  std::vector<at::Tensor> conv_w, conv_b;
  for (int s = 0; s < 3; ++s) {
    conv_w.push_back(at::randn({HC, HC, 1, 1}));
    conv_b.push_back(at::randn({HC}));
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
  EXPECT_EQ(h.upscale(), 8);
  // A stage whose input width is not the previous stage's output is refused.
  std::vector<at::Tensor> bad = deconv;
  bad[1] = at::randn({HC + 1, HC, 4, 4});
  EXPECT_THROW(
      seg_up::prepare_head(bad, conv_w, conv_b, seg_w, seg_b, c10::Device(c10::kCPU), at::kHalf),
      c10::Error);
  EXPECT_THROW(seg_up::prepare_head(deconv, conv_w, conv_b, at::randn({K, HC + 1, 1, 1}), seg_b,
                                    c10::Device(c10::kCPU), at::kHalf),
               c10::Error);
}

// head_forward's schedule (prepared weights, sub-pixel taps, normalisation where the next layer
// reads) on ATen ops against the networks' own heads: v1's three deconvolutions of one width and
// three 1x1 convolutions, and Sapiens2's four deconvolutions of falling widths and two.
TEST(UnitKernelsHead, ReferenceScheduleEqualsTheNetworksHeads) {
  at::manual_seed(8);
  struct Shape {
    std::vector<int64_t> deconv, conv;
  };
  for (const Shape& shape : {Shape{{8, 8, 8}, {8, 8, 8}}, Shape{{16, 12, 8, 8}, {6, 6}}}) {
    const int64_t C = 10, K = 5, gh = 3, gw = 2;
    std::vector<at::Tensor> deconv, conv_w, conv_b;
    int64_t in = C;
    for (int64_t out : shape.deconv) {
      deconv.push_back(at::randn({in, out, 4, 4}) * 0.3);
      in = out;
    }
    for (int64_t out : shape.conv) {
      conv_w.push_back(at::randn({out, in, 1, 1}) * 0.3);
      conv_b.push_back(at::randn({out}));
      in = out;
    }
    const at::Tensor seg_w = at::randn({K, in, 1, 1}), seg_b = at::randn({K});
    const at::Tensor feat = at::randn({gh * gw, C});

    auto norm_silu = [](const at::Tensor& y) {
      return at::silu(at::instance_norm(y, {}, {}, {}, {}, true, 0.1, 1e-5, false));
    };
    at::Tensor x = feat.view({1, gh, gw, C}).permute({0, 3, 1, 2});
    for (const auto& w : deconv) x = norm_silu(at::conv_transpose2d(x, w, {}, 2, 1));
    for (size_t s = 0; s < conv_w.size(); ++s) x = norm_silu(at::conv2d(x, conv_w[s], conv_b[s]));
    const at::Tensor ref = at::conv2d(x, seg_w, seg_b)[0];  // [K, u*gh, u*gw]

    const seg_up::HeadWeights hw = seg_up::prepare_head(deconv, conv_w, conv_b, seg_w, seg_b,
                                                        c10::Device(c10::kCPU), at::kFloat);
    const int64_t u = hw.upscale();
    EXPECT_EQ(u, int64_t{1} << shape.deconv.size());
    const at::Tensor got = seg_up::head_forward_reference(hw, feat, gh, gw);
    ASSERT_EQ(got.sizes(), (at::IntArrayRef{u * gh * u * gw, 8}));
    EXPECT_EQ(got.narrow(1, K, 3).abs().max().item<float>(), 0.f);  // the padded classes
    const at::Tensor logits = got.narrow(1, 0, K).view({u * gh, u * gw, K}).permute({2, 0, 1});
    EXPECT_LT(max_diff(logits, ref), 1e-4) << shape.deconv.size() << " deconvolutions";
  }
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
  try {
    core::make_kernels_v2(core::TensorMap{}, core::v2::Config{}, c10::Device(c10::kCPU), at::kHalf);
    FAIL() << "expected Error(kBackendUnavailable)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBackendUnavailable);
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

// ---- Sapiens2's kernels schedule, on ATen ops ---------------------------------------------

namespace {

core::TensorMap s2_tiny_tensors() {
  return core::v2::to_original_names(
      core::SafetensorsFile::open(test::fixture("s2_tiny.safetensors")).all());
}

}  // namespace

// The schedule the kernels backend runs for Sapiens2 (q/k/v in one packed GEMM with head dim 20
// padded to 24, grouped key/value heads in blocks 8 and 9, the four-stage head in seg_up's
// layout), each step on ATen ops, gives the portable network's logits in float32.
TEST(UnitKernelsSchedule, Sapiens2ScheduleOnAtenEqualsThePortableNetwork) {
  if (!std::filesystem::exists(test::fixture("s2_tiny.safetensors"))) {
    GTEST_SKIP() << "s2_tiny.safetensors not built (tests/fixtures/sapiens2.py)";
  }
  namespace schedule = core::v2::kernels_schedule;
  const core::TensorMap t = s2_tiny_tensors();
  core::v2::ConfigHints hints;
  hints.input_h = 128;
  hints.input_w = 96;
  const core::v2::Config cfg = core::v2::infer_config(t, hints);
  ASSERT_EQ(cfg.head_dim, 20);
  ASSERT_NE(cfg.kv_heads[8], cfg.heads);  // the fixture has grouped-query blocks

  const c10::Device cpu(c10::kCPU);
  const schedule::Weights w = schedule::prepare(t, cfg, cpu, at::kFloat);
  EXPECT_EQ(w.padded_head_dim, 24);
  EXPECT_EQ(w.blocks[8].qkv_w.size(0), (cfg.heads + 2 * cfg.kv_heads[8]) * 24);
  EXPECT_EQ(w.blocks[0].qkv_w.size(0), 3 * cfg.heads * 24);
  EXPECT_EQ(w.blocks[0].proj_w.size(1), cfg.heads * 24);
  EXPECT_EQ(w.blocks[0].gamma.size(0), cfg.embed_dim);
  EXPECT_EQ(w.head.upscale(), 16);
  // One attention configuration per distinct key/value head count, each checked at load.
  const auto keys = schedule::attention_keys(w, cfg, at::kBFloat16, 0);
  std::unordered_set<std::int64_t> kv(cfg.kv_heads.begin(), cfg.kv_heads.end());
  ASSERT_EQ(keys.size(), kv.size());
  for (const auto& k : keys) {
    EXPECT_EQ(kv.count(k.hk), 1u);
    EXPECT_EQ(k.b, 1);
    EXPECT_EQ(k.h, cfg.heads);
    EXPECT_EQ(k.s, cfg.prefix_tokens() + (128 / cfg.patch) * (96 / cfg.patch));
    EXPECT_EQ(k.d, 24);
    EXPECT_EQ(k.dtype, kernels::DType::kBF16);
  }

  at::manual_seed(12);
  const at::Tensor x = at::randn({2, 3, 128, 96});
  const core::v2::Network net(t, cfg, cpu, at::kFloat);
  const at::Tensor want = net.forward(x);
  const auto ops = core::aten_kernel_ops();
  const at::Tensor got = schedule::forward(w, cfg, *ops, x);
  ASSERT_EQ(got.sizes(), want.sizes());
  // Sapiens2 rounds q and k to bfloat16 for RoPE even in a float32 model, so float32 results
  // that differ in the last bit (another GEMM blocking, the patch embedding as a GEMM) round to
  // different bfloat16 values here and there, and a random network spreads that. The bar is
  // therefore the network's own spread under a last-bit perturbation of its input (about 1e-7
  // relative): the schedule must stay within twice it. A wrong index, grouping or padding
  // gives differences of the order of the logits.
  const at::Tensor noise =
      (net.forward(x + x * 1e-7 * at::randn_like(x)) - want).abs().to(at::kDouble);
  const at::Tensor diff = (got - want).abs().to(at::kDouble);
  const double n_max = noise.max().item<double>(), n_mean = noise.mean().item<double>();
  const double d_max = diff.max().item<double>(), d_mean = diff.mean().item<double>();
  const double agree = got.argmax(1).eq(want.argmax(1)).to(at::kDouble).mean().item<double>();
  std::printf(
      "schedule on ATen vs portable, float32: max |diff| %.3g, mean %.3g, labels %.3f %%; "
      "the network against itself, input perturbed by 1e-7: max %.3g, mean %.3g "
      "(|logit| max %.3g)\n",
      d_max, d_mean, 100 * agree, n_max, n_mean, want.abs().max().item<double>());
  EXPECT_LE(d_max, 2 * n_max);
  EXPECT_LE(d_mean, 2 * n_mean);
  EXPECT_GE(agree, 0.995);  // the product's float16 label bar; near-ties of a random network

  // The same schedule in bfloat16 against the portable network in bfloat16: the head's fused
  // normalisation rounds once where the portable head rounds after each op, and bfloat16
  // spreads that further than float32 does, so this bar is loose; printed for the record.
  const schedule::Weights wb = schedule::prepare(t, cfg, cpu, at::kBFloat16);
  const at::Tensor gb = schedule::forward(wb, cfg, *ops, x).to(at::kFloat);
  const at::Tensor pb = core::v2::Network(t, cfg, cpu, at::kBFloat16).forward(x).to(at::kFloat);
  const double agree_bf16 = gb.argmax(1).eq(pb.argmax(1)).to(at::kDouble).mean().item<double>();
  std::printf("schedule on ATen vs portable, bfloat16: mean |diff| %.3g, labels %.2f %% equal\n",
              (gb - pb).abs().mean().item<double>(), 100 * agree_bf16);
  EXPECT_GT(agree_bf16, 0.9);
  EXPECT_THROW(schedule::forward(w, cfg, *ops, at::randn({1, 3, 64, 96})), Error);
}

// The schedule the kernels backend runs for Sapiens v1 (patch embedding as a GEMM with the
// position embedding as its residual, packed qkv read as [B, N, 3H, D], fused residual adds,
// exact GELU, the head in seg_up's layout), each step on ATen ops, against the portable
// network in float32. v1 has no bfloat16 step, so the bar is float32 round-off. tiny_a also
// runs read as 16 heads of 4 (both paths take the head count from the config), so the head-dim
// padding (4 -> 8) is on the path too.
TEST(UnitKernelsSchedule, V1ScheduleOnAtenEqualsThePortableNetwork) {
  namespace schedule = core::v1::kernels_schedule;
  struct Case {
    std::string name;
    int64_t heads;  // 0: the traced graph's
    int64_t batch;
  };
  int ran = 0;
  for (const Case& k : {Case{"tiny_a", 0, 2}, Case{"tiny_a", 16, 1}, Case{"tiny_b", 0, 1}}) {
    const std::string file = test::fixture(k.name + "_torchscript.pt2");
    if (!std::filesystem::exists(file)) {
      std::printf("%s not built: case skipped\n", file.c_str());
      continue;
    }
    const core::TorchScriptCheckpoint ckpt = core::open_torchscript(file);
    core::v1::ConfigHints hints;
    if (k.heads > 0) {
      hints.heads = k.heads;
    } else if (ckpt.heads_from_graph) {
      hints.heads = *ckpt.heads_from_graph;
    }
    const core::v1::Config cfg = core::v1::infer_config(ckpt.tensors, hints);
    const c10::Device cpu(c10::kCPU);
    const schedule::Weights w = schedule::prepare(ckpt.tensors, cfg, cpu, at::kFloat);
    EXPECT_EQ(w.head.upscale(), 8);
    if (k.heads == 16) {
      EXPECT_EQ(w.head_dim, 4);
      EXPECT_EQ(w.padded_head_dim, 8);
      EXPECT_EQ(w.blocks[0].qkv_w.size(0), 3 * 16 * 8);
    }
    at::manual_seed(13);
    const at::Tensor x = at::randn({k.batch, 3, cfg.input_h, cfg.input_w});
    const at::Tensor want = core::make_portable_v1(ckpt, cfg, cpu, at::kFloat)->forward(x);
    const auto ops = core::aten_kernel_ops();
    const at::Tensor got = schedule::forward(w, cfg, *ops, x);
    ASSERT_EQ(got.sizes(), want.sizes());
    const double scale = want.abs().max().item<double>(), d = max_diff(got, want);
    std::printf(
        "v1 schedule on ATen vs portable, %s (%lld heads) float32: max |diff| %.3g "
        "(|logit| max %.3g)\n",
        k.name.c_str(), static_cast<long long>(cfg.heads), d, scale);
    EXPECT_LE(d, 1e-4 * std::max(scale, 1.0)) << k.name << " " << cfg.heads;
    EXPECT_THROW(schedule::forward(w, cfg, *ops, at::randn({1, 3, 32, 32})), Error);
    // The two halves the speed check times apart are the whole pass.
    const at::Tensor feat = schedule::backbone(w, cfg, *ops, x);
    ASSERT_EQ(feat.sizes(),
              (at::IntArrayRef{k.batch * (cfg.input_h / cfg.patch) * (cfg.input_w / cfg.patch),
                               cfg.embed_dim}));
    EXPECT_TRUE(schedule::head(w, cfg, *ops, feat, k.batch).equal(got)) << k.name;
    EXPECT_THROW(schedule::head(w, cfg, *ops, feat, k.batch + 1), c10::Error);
    // The attention configuration cuDNN checks at load: one image, every token, padded heads.
    const auto keys = schedule::attention_keys(w, cfg, at::kHalf, 0);
    ASSERT_EQ(keys.size(), 1u);
    EXPECT_EQ(keys[0],
              cudnn_hacc::packed_key(1, cfg.heads, cfg.heads,
                                     (cfg.input_h / cfg.patch) * (cfg.input_w / cfg.patch),
                                     w.padded_head_dim, kernels::DType::kF16,
                                     static_cast<float>(1.0 / std::sqrt(double(w.head_dim))), 0));
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "no v1 fixture built (tests/fixtures/make_fixtures.py)";
}

// ---- cuDNN's attention support, decided at load ----------------------------------------------

TEST(UnitKernelsAttention, CudnnVersionStrings) {
  EXPECT_EQ(cudnn_hacc::cudnn_version_string(91900), "9.19.0");
  EXPECT_EQ(cudnn_hacc::cudnn_version_string(92601), "9.26.1");
  EXPECT_EQ(cudnn_hacc::cudnn_version_string(8907), "8.9.7");
}

TEST(UnitKernelsAttention, SupportDecisionNamesVersionShapeAndGpu) {
  cudnn_hacc::SdpaSupport s;
  s.cudnn_runtime = 91900;
  s.cudnn_compiled = 91900;
  s.sm_major = 9;
  s.sm_minor = 0;
  s.key = cudnn_hacc::packed_key(1, 16, 16, 3072, 64, kernels::DType::kF16, 0.125f, 0);
  EXPECT_EQ(cudnn_hacc::sdpa_unsupported_reason(s), "");  // the frontend built a plan

  s.frontend_error = "cuDNN attention: check_support failed: no valid engine configs";
  const std::string why = cudnn_hacc::sdpa_unsupported_reason(s);
  for (const char* part : {"cuDNN 9.19.0 cannot run this model's fused attention", "batch 1",
                           "16 query heads", "16 key/value heads", "3072 tokens", "head dim 64",
                           "float16", "compute capability 9.0", "no valid engine configs"}) {
    EXPECT_NE(why.find(part), std::string::npos) << "'" << part << "' not in: " << why;
  }
  s.key.dtype = kernels::DType::kBF16;
  s.key.hk = 4;
  EXPECT_NE(cudnn_hacc::sdpa_unsupported_reason(s).find("4 key/value heads, 3072 tokens, head "
                                                        "dim 64, bfloat16"),
            std::string::npos);

  // A GPU older than Ampere is refused whatever the frontend said.
  s.frontend_error.clear();
  s.sm_major = 7;
  s.sm_minor = 5;
  EXPECT_NE(cudnn_hacc::sdpa_unsupported_reason(s).find("needs compute capability 8.0 or newer, "
                                                        "this GPU has 7.5"),
            std::string::npos);

  // A cuDNN of another major version than the headers (a cuDNN 8 library under cuDNN 9 headers).
  s.sm_major = 9;
  s.cudnn_runtime = 8907;
  EXPECT_NE(cudnn_hacc::sdpa_unsupported_reason(s).find("loaded cuDNN 8.9.7 is not the major "
                                                        "version this build was compiled against "
                                                        "(cuDNN 9.19.0)"),
            std::string::npos);
}

TEST(UnitKernelsAttention, PackedKeyEqualsTheKeyOfPackedTensors) {
  const at::Tensor qkv = at::empty({2, 197, 3, 4, 64}, at::kHalf);
  const at::Tensor out = at::empty({2, 197, 4, 64}, at::kHalf);
  EXPECT_EQ(cudnn_hacc::packed_qkv_key(qkv, out, 0.125f),
            cudnn_hacc::packed_key(2, 4, 4, 197, 64, kernels::DType::kF16, 0.125f, -1));
  const at::Tensor gqa = at::empty({1, 57, 8 + 2 * 2, 80}, at::kBFloat16);
  const at::Tensor gout = at::empty({1, 57, 8, 80}, at::kBFloat16);
  EXPECT_EQ(cudnn_hacc::packed_qkv_key(gqa, gout, 0.1f),
            cudnn_hacc::packed_key(1, 8, 2, 57, 80, kernels::DType::kBF16, 0.1f, -1));
}

// ---- the CUDA-graph runner's bookkeeping ----------------------------------------------------

namespace {

// What a captured shape holds, counting how many are alive (a graph and its memory pool).
struct FakeGraph {
  static inline int alive = 0;
  FakeGraph() { ++alive; }
  FakeGraph(const FakeGraph&) = delete;
  FakeGraph& operator=(const FakeGraph&) = delete;
  ~FakeGraph() { --alive; }
};
struct FakePayload {
  std::unique_ptr<FakeGraph> graph;
};

using Cache = core::GraphCache<FakePayload>;

// Serves one call as the CUDA-graph runner does: a known shape is found, a new one captured
// (failing for batch 3, as a pass with a host synchronisation fails). Returns whether the call
// replayed a graph.
bool serve(Cache& cache, std::int64_t batch, int* evictions = nullptr) {
  const std::vector<std::int64_t> sizes = {batch, 3, 64, 48};
  Cache::Entry* e = cache.find(sizes, /*dtype=*/5);
  if (!e) {
    e = &cache.add(
        sizes, 5, "[" + std::to_string(batch) + ",3,64,48] Half",
        [&](FakePayload& p) {
          p.graph = std::make_unique<FakeGraph>();  // begun, then the pass fails
          if (batch == 3)
            throw core::CaptureFailed(
                "operation not permitted when stream is "
                "capturing\nsecond line");
        },
        [&] {
          if (evictions) ++*evictions;
        });
  }
  cache.count_call(*e);
  return e->payload.has_value();
}

}  // namespace

TEST(UnitKernelsGraphs, CountsCapturesFailuresAndReplays) {
  FakeGraph::alive = 0;
  {
    Cache cache(/*max_entries=*/4);
    int evictions = 0;
    EXPECT_TRUE(serve(cache, 1, &evictions));
    EXPECT_TRUE(serve(cache, 1, &evictions));
    EXPECT_FALSE(serve(cache, 3, &evictions));  // the capture fails: this call runs eagerly
    EXPECT_FALSE(serve(cache, 3, &evictions));  // and so does every later one: no new attempt
    EXPECT_TRUE(serve(cache, 2, &evictions));
    const core::GraphStats& st = cache.stats();
    EXPECT_EQ(st.captured, 2u);
    EXPECT_EQ(st.eager, 1u);
    EXPECT_EQ(st.replays, 3u);
    EXPECT_EQ(st.eager_calls, 2u);
    EXPECT_EQ(st.evicted, 0u);
    EXPECT_EQ(evictions, 0);
    ASSERT_EQ(st.failures.size(), 1u);
    // The reason names the shape and keeps the message's first line.
    EXPECT_EQ(st.failures[0], "[3,3,64,48] Half: operation not permitted when stream is capturing");
    EXPECT_EQ(st.summary(),
              "captured 2, eager 1 ([3,3,64,48] Half: operation not permitted when stream is "
              "capturing), evicted 0, 3 replays, 2 eager calls");
    // The failed attempt's graph is gone already; the two captured ones live.
    EXPECT_EQ(FakeGraph::alive, 2);
  }
  EXPECT_EQ(FakeGraph::alive, 0);
}

TEST(UnitKernelsGraphs, EvictsTheLeastRecentlyUsedShape) {
  FakeGraph::alive = 0;
  Cache cache(/*max_entries=*/2);
  int evictions = 0;
  for (const std::int64_t b : {1, 1, 2, 3, 1, 2}) serve(cache, b, &evictions);
  const core::GraphStats& st = cache.stats();
  // 1 and 2 captured; 3 fails (an eager entry, taking 1's place); 1 again (taking 2's); 2 again
  // (taking 3's): the eager entry leaves like any other.
  EXPECT_EQ(st.captured, 4u);
  EXPECT_EQ(st.eager, 1u);
  EXPECT_EQ(st.evicted, 3u);
  EXPECT_EQ(evictions, 3);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(FakeGraph::alive, 2);  // evicted graphs are released with their entries
  // Most recently used first: 3 is no longer known, so it is tried (and fails) again.
  EXPECT_FALSE(serve(cache, 3, &evictions));
  EXPECT_EQ(cache.stats().eager, 2u);
}

TEST(UnitKernelsGraphs, TheCallsOwnErrorsPropagateAndRecordNothing) {
  FakeGraph::alive = 0;
  Cache cache(2);
  const std::vector<std::int64_t> sizes = {1, 3, 64, 48};
  EXPECT_THROW(cache.add(
                   sizes, 5, "[1,3,64,48] Half",
                   [](FakePayload& p) {
                     p.graph = std::make_unique<FakeGraph>();
                     throw std::runtime_error("CUDA out of memory");
                   },
                   [] {}),
               std::runtime_error);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.stats().captured + cache.stats().eager, 0u);
  EXPECT_EQ(FakeGraph::alive, 0);
  EXPECT_EQ(cache.find(sizes, 5), nullptr);
}

TEST(UnitKernelsGraphs, ARunnerWithoutGraphsHasNoCounts) {
  struct CpuRunner final : core::Runner {
    at::Tensor forward(const at::Tensor& x) const override { return x; }
    const Backend& backend() const override { return b; }
    Backend b{"portable", "cpu", "float32"};
  };
  // On the CPU with_cuda_graphs hands the runner back as it is.
  const auto r = core::with_cuda_graphs(std::make_unique<CpuRunner>(), 4);
  EXPECT_FALSE(core::cuda_graph_stats(*r).has_value());
}

// ---- the element arithmetic of fastbb's Sapiens2 kernels, run on the host -------------------

namespace {

namespace kn = sapiens_seg::kernels;

// Calls f with the element type of t (float, __half or __nv_bfloat16) as a value of that type.
template <typename F>
void with_element_type(at::ScalarType t, F&& f) {
  if (t == at::kFloat) {
    f(float{});
  } else if (t == at::kHalf) {
    f(__half{});
  } else {
    f(__nv_bfloat16{});
  }
}

// Fraction of elements that differ, and the largest difference relative to the reference's
// largest magnitude.
std::pair<double, double> mismatch(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return {g.ne(w).to(at::kDouble).mean().item<double>(),
          (g - w).abs().max().item<double>() / std::max(w.abs().max().item<double>(), 1e-30)};
}

// rstd of every row of x's last dim, as at::rms_norm's composite computes it (float statistics).
at::Tensor rstd_of(const at::Tensor& x, double eps) {
  return at::rsqrt(x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true) + eps);
}

}  // namespace

// RMSNorm's output element (x * rstd * w, one rounding) and the layer scale's (x + y * gamma,
// two roundings) against ATen, with rstd computed as ATen computes it: the kernels' rounding
// sequence, not only their precision. Rounding after the normalisation and again after the
// weight (the sequence first written) differs from ATen on ~26 % of bfloat16 elements; the
// bar is 1 %.
TEST(UnitKernelsSapiens2Math, RmsNormAndScaleAddRoundLikeAten) {
  at::manual_seed(31);
  for (at::ScalarType t : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor x = (at::randn({64, 80}) * 3 + 0.5).to(t);
    const at::Tensor w = (at::randn({80}) * 0.5 + 1).to(t);
    const at::Tensor want = at::rms_norm(x, {80}, w, 1e-6);
    const at::Tensor xf = x.to(at::kFloat), wf = w.to(at::kFloat), r = rstd_of(x, 1e-6);
    at::Tensor got = at::empty({64, 80});
    with_element_type(t, [&](auto tag) {
      using T = decltype(tag);
      const auto xa = xf.accessor<float, 2>();
      const auto wa = wf.accessor<float, 1>();
      const auto ra = r.accessor<float, 2>();
      auto ga = got.accessor<float, 2>();
      for (int64_t i = 0; i < 64; ++i) {
        for (int64_t j = 0; j < 80; ++j) {
          ga[i][j] = kn::Elem<T>::to(fastbb::rms_norm_element<T>(xa[i][j], ra[i][0], wa[j]));
        }
      }
    });
    const auto [frac, rel] = mismatch(got, want.to(at::kFloat));
    std::printf("rms_norm element %s: %.3f %% differ from at::rms_norm, max %.2g\n",
                c10::toString(t), 100 * frac, rel);
    EXPECT_LE(frac, 0.01) << t;
    EXPECT_LE(rel, t == at::kFloat ? 1e-6 : 1e-2) << t;

    const at::Tensor y = at::randn({64, 80}).to(t), g = (at::rand({80}) * 0.1).to(t);
    const at::Tensor want_s = x + y.mul(g);
    at::Tensor got_s = at::empty({64, 80});
    with_element_type(t, [&](auto tag) {
      using T = decltype(tag);
      const at::Tensor yf = y.to(at::kFloat), gf = g.to(at::kFloat);
      const auto xa = xf.accessor<float, 2>();
      const auto ya = yf.accessor<float, 2>();
      const auto gam = gf.accessor<float, 1>();
      auto oa = got_s.accessor<float, 2>();
      for (int64_t i = 0; i < 64; ++i) {
        for (int64_t j = 0; j < 80; ++j) {
          oa[i][j] = kn::Elem<T>::to(fastbb::scale_add_element<T>(xa[i][j], ya[i][j], gam[j]));
        }
      }
    });
    EXPECT_TRUE(got_s.equal(want_s.to(at::kFloat))) << "scale_add " << t;
  }
}

// SwiGLU's element against silu(gate) * up in ATen: the exponential may differ in its last bit
// between libm and ATen's vectorised one (in float32 ~3 % of the elements differ by an ulp; on
// the device expf may be 2 ulps off), so the 16-bit types are held to 2 % differing elements
// and float32 to its relative error.
TEST(UnitKernelsSapiens2Math, SwiGluRoundsLikeAten) {
  at::manual_seed(32);
  for (at::ScalarType t : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor h = (at::randn({32, int64_t{2} * 96}) * 3).to(t);
    const auto halves = h.chunk(2, -1);
    const at::Tensor want = at::silu(halves[0]).mul(halves[1]).to(at::kFloat);
    const at::Tensor a = halves[0].to(at::kFloat).contiguous();
    const at::Tensor b = halves[1].to(at::kFloat).contiguous();
    at::Tensor got = at::empty({32, 96});
    with_element_type(t, [&](auto tag) {
      using T = decltype(tag);
      const auto aa = a.accessor<float, 2>();
      const auto ba = b.accessor<float, 2>();
      auto ga = got.accessor<float, 2>();
      for (int64_t i = 0; i < 32; ++i) {
        for (int64_t j = 0; j < 96; ++j) {
          ga[i][j] = kn::Elem<T>::to(fastbb::swiglu_element<T>(aa[i][j], ba[i][j]));
        }
      }
    });
    const auto [frac, rel] = mismatch(got, want);
    std::printf("swiglu element %s: %.3f %% differ from ATen, max %.2g\n", c10::toString(t),
                100 * frac, rel);
    if (t != at::kFloat) EXPECT_LE(frac, 0.02) << t;
    EXPECT_LE(rel, t == at::kFloat ? 1e-6 : 1e-2) << t;
  }
}

// The q/k norm + RoPE pair against the schedule's ATen step (the portable network's op
// sequence): the same values, but for the rare bfloat16 rounding that the last bit of rstd can
// flip (ATen's reductions and this test's differ in order).
TEST(UnitKernelsSapiens2Math, QkNormRopePairRoundsLikeThePortableNetwork) {
  at::manual_seed(33);
  namespace schedule = core::v2::kernels_schedule;
  const auto ref = core::aten_kernel_ops();
  const int64_t B = 2, pre = 9, gh = 4, gw = 3, P = gh * gw, N = pre + P, H = 4, kv = 2, hd = 20;
  const auto bf = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor periods = at::pow(c10::Scalar(100), at::arange(hd / 4, bf).mul(2).div(hd / 2));
  const auto [cos, sin] = core::v2::rope_tables(periods, gh, gw);
  const at::Tensor cf = cos.to(at::kFloat), sf = sin.to(at::kFloat);
  for (at::ScalarType t : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor qkv = (at::randn({B, N, H + 2 * kv, hd}) * 2).to(t);
    const at::Tensor qw = (at::randn({hd}) * 0.3 + 1).to(t), kw = (at::randn({hd}) * 0.3 + 1).to(t);
    at::Tensor want = qkv.clone();
    ref->qk_norm_rope(want, qw, kw, cos, sin, {H, kv, hd, pre, 1e-6});

    const at::Tensor xf = qkv.to(at::kFloat), r = rstd_of(qkv, 1e-6);
    const at::Tensor qwf = qw.to(at::kFloat), kwf = kw.to(at::kFloat);
    at::Tensor got = xf.clone();
    with_element_type(t, [&](auto tag) {
      using T = decltype(tag);
      const auto xa = xf.accessor<float, 4>();
      const auto ra = r.accessor<float, 4>();
      const auto ca = cf.accessor<float, 2>();
      const auto sa = sf.accessor<float, 2>();
      auto ga = got.accessor<float, 4>();
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t n = 0; n < N; ++n) {
          for (int64_t h = 0; h < H + kv; ++h) {
            const auto wa = (h < H ? qwf : kwf).accessor<float, 1>();
            const bool rot = n >= pre;
            const int64_t p = rot ? n - pre : 0;
            for (int64_t j = 0; j < hd / 2; ++j) {
              const int64_t k = j + hd / 2;
              const fastbb::QkPair o = fastbb::qk_norm_rope_pair<T>(
                  xa[b][n][h][j], xa[b][n][h][k], ra[b][n][h][0], wa[j], wa[k], rot, ca[p][j],
                  sa[p][j], ca[p][k], sa[p][k]);
              ga[b][n][h][j] = o.a;
              ga[b][n][h][k] = o.b;
            }
          }
        }
      }
    });
    const auto [frac, rel] = mismatch(got, want.to(at::kFloat));
    std::printf("qk norm + rope pair %s: %.3f %% differ from the portable ops, max %.2g\n",
                c10::toString(t), 100 * frac, rel);
    EXPECT_LE(frac, 0.01) << t;
    EXPECT_LE(rel, 1e-2) << t;
  }
}
