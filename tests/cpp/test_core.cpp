// Unit tests of the core (LibTorch only): post-processing, configuration checks, backends.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "core/backends.hpp"
#include "core/checkpoint.hpp"
#include "core/tensor_ops.hpp"
#include "core/v1/vit_seg.hpp"
#include "sapiens_seg/error.hpp"
#include "test_util.hpp"

using namespace sapiens_seg;
using sapiens_seg::test::fixture;

namespace {

// Expects `fn` to throw Error with `code` and a message containing every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, ErrorCode code, std::initializer_list<const char*> parts) {
  try {
    fn();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const char* p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

core::v1::Config config_of(const core::TorchScriptCheckpoint& ck) {
  core::v1::ConfigHints h;
  if (ck.heads_from_graph) h.heads = *ck.heads_from_graph;
  return core::v1::infer_config(ck.tensors, h);
}

}  // namespace

TEST(UnitUpsampleArgmax, MatchesATenInterpolateAndArgmax) {
  at::manual_seed(0);
  const std::vector<std::array<int, 4>> cases = {
      {28, 128, 96, 300}, {28, 16, 12, 33}, {5, 40, 30, 1000}, {28, 64, 48, 20}, {3, 7, 9, 64}};
  for (const auto& [K, h, w, H] : cases) {
    const int W = H * 3 / 4 + 7;
    const at::Tensor logits = at::randn({K, h, w});
    std::vector<std::uint8_t> labels(static_cast<size_t>(H) * W);
    std::vector<float> full(static_cast<size_t>(K) * H * W);
    core::upsample_argmax(logits, H, W, labels.data(), full.data());

    // Independent path: ATen's own bilinear kernel, then argmax.
    const at::Tensor ref = at::upsample_bilinear2d(logits.unsqueeze(0), {H, W}, false)[0];
    const at::Tensor got = at::from_blob(full.data(), {K, H, W}, at::kFloat);
    const double max_diff = (ref - got).abs().max().item<double>();
    EXPECT_LE(max_diff, 1e-5) << K << "x" << h << "x" << w << " -> " << H << "x" << W;

    const at::Tensor ref_labels = ref.argmax(0).to(at::kByte);
    const at::Tensor got_labels = at::from_blob(labels.data(), {H, W}, at::kByte);
    const at::Tensor differ = ref_labels.ne(got_labels);
    // A label may differ only where the two best classes are within float rounding.
    const auto top2 = std::get<0>(ref.topk(2, 0));
    const at::Tensor gap = top2[0] - top2[1];
    EXPECT_EQ(differ.logical_and(gap.gt(1e-5)).sum().item<int64_t>(), 0);
    std::printf("upsample %dx%dx%d -> %dx%d: max |diff| %.3g, %lld near-tie labels differ\n", K, h,
                w, H, W, max_diff, static_cast<long long>(differ.sum().item<int64_t>()));
  }
}

TEST(UnitUpsampleArgmax, LabelsOnlyEqualsWithFullLogits) {
  at::manual_seed(1);
  const at::Tensor logits = at::randn({28, 32, 24});
  std::vector<std::uint8_t> a(100 * 77), b(100 * 77);
  std::vector<float> full(28 * 100 * 77);
  core::upsample_argmax(logits, 100, 77, a.data());
  core::upsample_argmax(logits, 100, 77, b.data(), full.data());
  EXPECT_EQ(a, b);
}

TEST(UnitUpsampleArgmax, TiesGoToTheLowerClass) {
  const at::Tensor logits = at::zeros({4, 8, 8});
  std::vector<std::uint8_t> labels(64, 99);
  core::upsample_argmax(logits, 8, 8, labels.data());
  for (auto l : labels) EXPECT_EQ(l, 0);
}

TEST(UnitNormalize, DemoMeanStdPerChannel) {
  std::vector<std::uint8_t> px = {0, 128, 255, 10, 20, 30};  // two RGB pixels in a 1x2 image
  const std::array<float, 3> mean{123.5f, 116.5f, 103.5f}, std{58.5f, 57.0f, 57.5f};
  const at::Tensor t = core::normalize_rgb(px.data(), 1, 2, 6, mean, std);
  ASSERT_EQ(t.sizes(), at::IntArrayRef({3, 1, 2}));
  EXPECT_FLOAT_EQ(t[0][0][0].item<float>(), (0.0f - 123.5f) / 58.5f);
  EXPECT_FLOAT_EQ(t[1][0][0].item<float>(), (128.0f - 116.5f) / 57.0f);
  EXPECT_FLOAT_EQ(t[2][0][1].item<float>(), (30.0f - 103.5f) / 57.5f);
}

TEST(UnitBackends, DeviceAndDtypeRules) {
  EXPECT_TRUE(core::resolve_device("cpu").is_cpu());
  expect_error([] { core::resolve_device("tpu:0"); }, ErrorCode::kInvalidInput, {"tpu:0"});
  if (!at::hasCUDA()) {
    expect_error([] { core::resolve_device("cuda"); }, ErrorCode::kBackendUnavailable,
                 {"no CUDA device"});
    EXPECT_TRUE(core::resolve_device("").is_cpu());
  }
  EXPECT_EQ(core::resolve_dtype(DType::kDefault, c10::Device(c10::kCPU)), at::kFloat);
  expect_error([] { core::resolve_dtype(DType::kFloat16, c10::Device(c10::kCPU)); },
               ErrorCode::kBackendUnavailable, {"float16"});
  EXPECT_FALSE(core::kernels_unavailable_reason(c10::Device(c10::kCPU)).empty());
}

TEST(UnitCheckpoint, ConfigFromShapesAndGraph) {
  const auto a = core::open_torchscript(fixture("tiny_a_torchscript.pt2"));
  ASSERT_TRUE(a.heads_from_graph.has_value());
  const auto ca = config_of(a);
  EXPECT_EQ(ca.embed_dim, 64);
  EXPECT_EQ(ca.depth, 2);
  EXPECT_EQ(ca.heads, 2);
  EXPECT_EQ(ca.mlp, 256);
  EXPECT_EQ(ca.head_channels, 32);
  EXPECT_EQ(ca.num_classes, 28);
  EXPECT_EQ(ca.grid_h, 16);
  EXPECT_EQ(ca.grid_w, 12);
  EXPECT_EQ(ca.input_h, 256);
  EXPECT_EQ(ca.input_w, 192);
  const auto b = core::open_torchscript(fixture("tiny_b_torchscript.pt2"));
  const auto cb = config_of(b);
  EXPECT_EQ(cb.embed_dim, 128);
  EXPECT_EQ(cb.head_dim(), 64);
  EXPECT_EQ(cb.input_h, 1024);
  EXPECT_EQ(cb.input_w, 768);
}

TEST(UnitCheckpoint, EveryBrokenFileHasItsOwnError) {
  const auto load = [](const char* name) {
    return [name] { config_of(core::open_torchscript(fixture(name))); };
  };
  expect_error(load("broken_truncated.pt2"), ErrorCode::kFormatError, {"truncated"});
  expect_error(load("broken_not_zip.pt2"), ErrorCode::kFormatError, {"not a TorchScript archive"});
  expect_error(load("broken_missing_tensor.pt2"), ErrorCode::kFormatError,
               {"missing tensors (1)", "decode_head.conv_layers.0.bias"});
  expect_error(load("broken_unexpected_tensor.pt2"), ErrorCode::kFormatError,
               {"unexpected tensors (1)", "backbone.cls_token"});
  expect_error(load("broken_wrong_shape.pt2"), ErrorCode::kFormatError,
               {"wrong shape (1)", "backbone.layers.1.ln2.weight [65] (expected [64])"});
  expect_error(load("broken_wrong_dtype.pt2"), ErrorCode::kFormatError,
               {"wrong dtype (1)", "backbone.ln1.weight Double"});
  expect_error(load("does_not_exist.pt2"), ErrorCode::kNotFound, {"does_not_exist.pt2"});
}

TEST(UnitCheckpoint, HeadsNeedAHint) {
  const auto a = core::open_torchscript(fixture("tiny_a_torchscript.pt2"));
  expect_error([&] { core::v1::infer_config(a.tensors, {}); }, ErrorCode::kFormatError,
               {"head count"});
}

TEST(UnitNetwork, OtherInputSizesResizeThePositionEmbedding) {
  const auto a = core::open_torchscript(fixture("tiny_a_torchscript.pt2"));
  core::v1::ConfigHints h;
  h.heads = *a.heads_from_graph;
  h.input_h = 320;
  h.input_w = 240;
  const auto cfg = core::v1::infer_config(a.tensors, h);
  const core::v1::Network net(a.tensors, cfg, c10::Device(c10::kCPU), at::kFloat);
  const at::Tensor y = net.forward(at::randn({1, 3, 320, 240}));
  EXPECT_EQ(y.sizes(), at::IntArrayRef({1, 28, 160, 120}));
  EXPECT_TRUE(y.isfinite().all().item<bool>());
  h.input_h = 300;  // not a multiple of the patch
  expect_error([&] { core::v1::infer_config(a.tensors, h); }, ErrorCode::kInvalidInput,
               {"multiple of the patch"});
}

TEST(UnitNetwork, BFloat16StaysCloseToFloat32) {
  const auto b = core::open_torchscript(fixture("tiny_a_torchscript.pt2"));
  const auto cfg = config_of(b);
  const core::v1::Network f32(b.tensors, cfg, c10::Device(c10::kCPU), at::kFloat);
  const core::v1::Network bf16(b.tensors, cfg, c10::Device(c10::kCPU), at::kBFloat16);
  at::manual_seed(3);
  const at::Tensor x = at::randn({1, 3, 256, 192});
  const at::Tensor a = f32.forward(x), c = bf16.forward(x).to(at::kFloat);
  const double mean_diff = (a - c).abs().mean().item<double>();
  const double agree = a.argmax(1).eq(c.argmax(1)).to(at::kFloat).mean().item<double>();
  std::printf("bf16 vs fp32 (Tiny-A, random input): mean |diff| %.4f, argmax agreement %.4f\n",
              mean_diff, agree);
  EXPECT_LT(mean_diff, 0.1);
  EXPECT_GT(agree, 0.9);
}
