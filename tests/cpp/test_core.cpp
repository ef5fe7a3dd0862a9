// Unit tests of the core (LibTorch only): post-processing, configuration checks, backends, the
// TorchScript archive reader.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/script.h>

#include <unistd.h>
#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include <zlib.h>

#include "core/attention/cpu_attention.hpp"
#include "core/backends/backends.hpp"
#include "core/checkpoint/mapped_file.hpp"
#include "core/checkpoint/torchscript.hpp"
#include "core/checkpoint/torchscript_archive.hpp"
#include "core/checkpoint/zip_codec.hpp"
#include "core/cpu/cpuid.hpp"
#include "core/cpu/cpuinfo.hpp"
#include "core/cpu/gemm.hpp"
#include "core/cpu/row_chunks.hpp"
#include "core/head/cpu_head.hpp"
#include "core/head/winograd.hpp"
#include "core/resize/resize.hpp"
#include "core/resize/wheel_cubic.hpp"
#include "core/tensor_ops.hpp"
#include "core/v1/vit_seg.hpp"
#include "core/v2/sapiens2.hpp"
#include "op_counts.hpp"
#include "sapiens_seg/error.hpp"
#include "test_util.hpp"

using namespace sapiens_seg;
using sapiens_seg::test::fixture;

using sapiens_seg::test::expect_error;

namespace {

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

// The device pipeline's labels (ATen ops in bands of rows, any device) against the CPU path's
// full blend: the same products and sums, so the same labels, whatever the band height, the
// logits' layout (the kernels backend hands over a channels-last view) or their dtype.
TEST(UnitUpsampleArgmax, TensorOpsLabelsEqualTheHostBlend) {
  at::manual_seed(4);
  const std::vector<std::array<int, 5>> cases = {{28, 16, 12, 100, 77}, {5, 40, 30, 17, 13},
                                                 {28, 8, 6, 8, 6},      {3, 1, 1, 9, 4},
                                                 {29, 10, 10, 301, 1},  {28, 64, 48, 1024, 768}};
  for (const auto& [K, h, w, H, W] : cases) {
    const at::Tensor logits = at::randn({K, h, w});
    for (const at::Tensor& lg : {logits, logits.to(at::kBFloat16), logits.to(at::kHalf)}) {
      const at::Tensor f32 = lg.to(at::kFloat).contiguous();
      std::vector<std::uint8_t> want(static_cast<size_t>(H) * W);
      std::vector<float> full(static_cast<size_t>(K) * H * W);
      core::upsample_argmax(f32, H, W, want.data(), full.data());
      const at::Tensor channels_last = lg.permute({1, 2, 0}).contiguous().permute({2, 0, 1});
      for (const at::Tensor& in : {lg, channels_last}) {
        for (const int64_t band : {int64_t{1}, int64_t{200000}, int64_t{64} << 20}) {
          const at::Tensor got = core::upsample_argmax_labels(in, H, W, band);
          ASSERT_EQ(got.sizes(), (std::vector<int64_t>{H, W}));
          ASSERT_EQ(got.scalar_type(), at::kByte);
          const at::Tensor ref = at::from_blob(want.data(), {H, W}, at::kByte);
          EXPECT_EQ(got.ne(ref).sum().item<int64_t>(), 0)
              << K << "x" << h << "x" << w << " -> " << H << "x" << W << " " << lg.scalar_type()
              << " band " << band;
        }
      }
    }
  }
  expect_error(
      [] {
        core::upsample_argmax_labels(at::zeros({2, 3}), 4, 4);
      },
      ErrorCode::kInternal, {"[K, h, w]"});
  expect_error(
      [] {
        core::upsample_argmax_labels(at::zeros({300, 2, 2}), 4, 4);
      },
      ErrorCode::kInternal, {"256 classes"});
}

// The device pipeline's preprocessing on an image already at the network size is exactly
// normalize_rgb (no resize, the same ops); a resize keeps whole grey levels in 0..255.
TEST(UnitTensorOps, ResizeNormalizeWithoutResizeIsNormalizeRgb) {
  at::manual_seed(5);
  const at::Tensor img = at::randint(0, 256, {37, 29, 3}, at::kByte);
  const std::array<float, 3> mean{123.5f, 116.5f, 103.5f}, std{58.5f, 57.0f, 57.5f};
  const at::Tensor want =
      core::normalize_rgb(img.data_ptr<std::uint8_t>(), 37, 29, 29 * 3, mean, std);
  EXPECT_TRUE(at::equal(core::resize_normalize(img, 37, 29, mean, std), want));
  // A strided view (every other column) is read as such.
  const at::Tensor wide = at::randint(0, 256, {37, 58, 3}, at::kByte);
  const at::Tensor view = wide.slice(1, 0, 58, 2);
  const at::Tensor packed = view.contiguous();
  EXPECT_TRUE(
      at::equal(core::resize_normalize(view, 37, 29, mean, std),
                core::normalize_rgb(packed.data_ptr<std::uint8_t>(), 37, 29, 29 * 3, mean, std)));
  const std::array<float, 3> zero{0, 0, 0}, one{1, 1, 1};
  const at::Tensor grey = core::resize_normalize(img, 100, 71, zero, one);
  EXPECT_TRUE(at::equal(grey, grey.round()));
  EXPECT_GE(grey.min().item<float>(), 0.0f);
  EXPECT_LE(grey.max().item<float>(), 255.0f);
  expect_error([&] { core::resize_normalize(img.to(at::kFloat), 10, 10, mean, std); },
               ErrorCode::kInternal, {"uint8"});
}

// The wheel's IPP code path for CPUs this machine is not: the decision replays CPUID bits (the
// bytes of each path are checked against the wheel itself in tests/python/test_resize.py).
TEST(UnitResize, WheelCubicPathForEachKindOfCpu) {
  using core::resize_detail::CpuFeatures;
  using core::resize_detail::ipp_path_for;
  using P = core::resize_detail::IppPath;
  CpuFeatures sse42;  // Nehalem: SSE4.2, no AVX
  sse42.sse42 = true;
  CpuFeatures avx = sse42;  // Sandy Bridge: AVX without AVX2 runs the SSE4.2 library
  avx.avx = avx.osxsave = true;
  avx.xcr0 = 0x7;
  CpuFeatures avx2 = avx;  // Haswell / Zen 2: AVX2 needs FMA, BMI1 and BMI2 as well
  avx2.avx2 = avx2.fma = avx2.bmi1 = avx2.bmi2 = true;
  CpuFeatures skx = avx2;  // Skylake-X: AVX-512 F/CD/BW/DQ/VL, no VPOPCNTDQ
  skx.avx512f = skx.avx512cd = skx.avx512bw = skx.avx512dq = skx.avx512vl = true;
  skx.xcr0 = 0xE7;
  CpuFeatures icx = skx;  // Ice Lake / Zen 4
  icx.avx512_vpopcntdq = true;

  EXPECT_EQ(ipp_path_for(CpuFeatures{}, ""), P::kOwn);  // no SSE4.2: OpenCV skips IPP
  EXPECT_EQ(ipp_path_for(sse42, ""), P::kY8);
  EXPECT_EQ(ipp_path_for(avx, ""), P::kY8);
  EXPECT_EQ(ipp_path_for(avx2, ""), P::kL9);
  CpuFeatures no_bmi2 = avx2;
  no_bmi2.bmi2 = false;
  EXPECT_EQ(ipp_path_for(no_bmi2, ""), P::kY8);
  EXPECT_EQ(ipp_path_for(skx, ""), P::kK0Skx);
  EXPECT_EQ(ipp_path_for(icx, ""), P::kK0Icx);
  // The OS decides too: without the ZMM state the AVX-512 library is out, without YMM AVX2 too.
  CpuFeatures icx_no_zmm = icx;
  icx_no_zmm.xcr0 = 0x7;
  EXPECT_EQ(ipp_path_for(icx_no_zmm, ""), P::kL9);
  CpuFeatures icx_no_ymm = icx;
  icx_no_ymm.xcr0 = 0x3;
  EXPECT_EQ(ipp_path_for(icx_no_ymm, ""), P::kY8);
  // AVX-512 without the AVX2 group still runs the AVX-512 library.
  CpuFeatures k0_only = icx;
  k0_only.bmi2 = false;
  EXPECT_EQ(ipp_path_for(k0_only, ""), P::kK0Icx);
  // OPENCV_IPP, as OpenCV reads it (case, "ne-" prefix).
  EXPECT_EQ(ipp_path_for(icx, "avx512"), P::kK0Skx);
  EXPECT_EQ(ipp_path_for(icx, "AVX2"), P::kL9);
  EXPECT_EQ(ipp_path_for(icx, "ne-sse42"), P::kY8);
  EXPECT_EQ(ipp_path_for(icx, "disabled"), P::kOwn);
  EXPECT_EQ(ipp_path_for(avx2, "avx512"), P::kL9);  // a mask cannot add features
  EXPECT_EQ(ipp_path_for(icx, "nonsense"), P::kK0Icx);
  // This machine's own answer is one of them, and stable.
  EXPECT_EQ(core::resize_detail::wheel_ipp_path(), core::resize_detail::wheel_ipp_path());
  std::printf("this CPU: the wheel's INTER_CUBIC takes %s\n",
              core::resize_detail::to_string(core::resize_detail::wheel_ipp_path()));
}

// The tensor resizes read any strides: a channels-last view, a crop and a transposed view give
// what their packed copies give, and the host code agrees, for every interpolation.
TEST(UnitResize, TensorPathReadsAnyStrides) {
  at::manual_seed(11);
  const at::Tensor chw = at::randint(0, 256, {3, 90, 70}, at::kByte);
  const at::Tensor base = at::randint(0, 256, {90, 140, 3}, at::kByte);
  const std::vector<at::Tensor> views = {chw.permute({1, 2, 0}), base.slice(1, 10, 130),
                                         base.slice(1, 0, 140, 2), base.transpose(0, 1)};
  for (const auto interp : {core::Interp::kLinear, core::Interp::kArea, core::Interp::kCubic}) {
    for (const auto& v : views) {
      const at::Tensor packed = v.contiguous();
      for (const auto& [H, W] : {std::pair{51, 37}, std::pair{203, 149}}) {
        const at::Tensor a = core::resize_tensor(v, H, W, interp);
        const at::Tensor b = core::resize_tensor(packed, H, W, interp);
        EXPECT_TRUE(at::equal(a, b)) << core::to_string(interp);
        at::Tensor host = at::empty({H, W, 3}, at::kByte);
        core::resize_u8({packed.data_ptr<std::uint8_t>(), static_cast<int>(packed.size(0)),
                         static_cast<int>(packed.size(1)), 3, 0},
                        {host.data_ptr<std::uint8_t>(), H, W, 3, 0}, interp);
        EXPECT_TRUE(at::equal(a, host)) << core::to_string(interp) << " host vs tensor";
      }
    }
  }
}

// The vector loops change how many values an instruction computes, never a value: on a CPU with
// AVX2 they must give the portable loops' bytes for every interpolation, channel count, stride,
// vector tail and, for the wheel's cubic, every IPP path (the portable loops are what a CPU
// without AVX2 runs; tests/python/test_resize.py holds the default loops to the wheel itself).
TEST(UnitResize, VectorLoopsEqualThePortableLoops) {
  namespace rd = core::resize_detail;
  if (rd::host_simd() != rd::Simd::kAvx2) GTEST_SKIP() << "this CPU has no AVX2 loops to compare";
  std::mt19937 rng(5);
  const std::vector<std::array<int, 4>> shapes = {
      {480, 640, 1024, 768}, {31, 45, 67, 101}, {100, 100, 50, 50},  {120, 90, 40, 30},
      {97, 203, 51, 77},     {3, 5, 17, 23},    {2, 2, 9, 7},        {256, 130, 128, 65},
      {64, 48, 64, 33},      {70, 70, 70, 70},  {150, 301, 300, 149}};
  for (const auto& [h, w, H, W] : shapes) {
    for (const int cn : {1, 3, 4}) {
      const std::size_t sstride = static_cast<std::size_t>(w) * cn + 13;  // a padded source
      std::vector<std::uint8_t> src(sstride * h);
      for (auto& v : src) v = static_cast<std::uint8_t>(rng());
      const core::PixelsU8 in{src.data(), h, w, cn, sstride};
      for (const auto interp : {core::Interp::kLinear, core::Interp::kArea, core::Interp::kCubic}) {
        for (const auto flavor : {core::CubicFlavor::kWheel, core::CubicFlavor::kOpenCV}) {
          if (interp != core::Interp::kCubic && flavor == core::CubicFlavor::kOpenCV) continue;
          std::vector<std::uint8_t> a(static_cast<std::size_t>(H) * W * cn), b(a.size());
          rd::resize_u8_simd(in, {a.data(), H, W, cn, 0}, interp, flavor, rd::Simd::kPortable);
          rd::resize_u8_simd(in, {b.data(), H, W, cn, 0}, interp, flavor, rd::Simd::kAvx2);
          EXPECT_EQ(a, b) << h << "x" << w << " -> " << H << "x" << W << " cn " << cn << " "
                          << core::to_string(interp) << " flavor " << static_cast<int>(flavor);
        }
      }
      if (cn != 3 || h < 4 || w < 4) continue;  // IPP takes 3-channel sources of 4 x 4 and up
      for (const auto path :
           {rd::IppPath::kK0Icx, rd::IppPath::kK0Skx, rd::IppPath::kL9, rd::IppPath::kY8}) {
        std::vector<std::uint8_t> a(static_cast<std::size_t>(H) * W * 3), b(a.size());
        rd::wheel_cubic_host(src.data(), sstride, h, w, 3, a.data(), W * 3, H, W, path,
                             rd::Simd::kPortable);
        rd::wheel_cubic_host(src.data(), sstride, h, w, 3, b.data(), W * 3, H, W, path,
                             rd::Simd::kAvx2);
        EXPECT_EQ(a, b) << h << "x" << w << " -> " << H << "x" << W << " " << rd::to_string(path);
      }
    }
  }
}

TEST(UnitUpsampleArgmax, LabelsOnlyShortcutOnLargeUpscales) {
  // Smooth logits (a low-resolution field upsampled), as a network gives, at a 12x upscale: the
  // labels-only path blends only where the source pixels disagree, and must agree with the full
  // blend everywhere.
  at::manual_seed(2);
  const at::Tensor logits =
      at::upsample_bilinear2d(at::randn({1, 28, 8, 6}), {48, 36}, false)[0].contiguous();
  const int H = 600, W = 431;
  std::vector<std::uint8_t> fast(static_cast<size_t>(H) * W), full(fast.size());
  std::vector<float> full_logits(static_cast<size_t>(28) * H * W);
  core::upsample_argmax(logits, H, W, fast.data());
  core::upsample_argmax(logits, H, W, full.data(), full_logits.data());
  EXPECT_EQ(fast, full);
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
  EXPECT_EQ(core::resolve_dtype(DType::kFloat32, c10::Device(c10::kCPU)), at::kFloat);
  // The reduced-precision dtypes follow this CPU's capabilities (UnitCpuCaps checks the rule).
  for (const auto& [dt, t] :
       {std::pair{DType::kFloat16, at::kHalf}, std::pair{DType::kBFloat16, at::kBFloat16}}) {
    const std::string why = core::cpu_dtype_unavailable_reason(core::cpu_caps(), t);
    if (why.empty()) {
      EXPECT_EQ(core::resolve_dtype(dt, c10::Device(c10::kCPU)), t);
    } else {
      const std::string name = core::dtype_name(t);
      expect_error([dt = dt] { core::resolve_dtype(dt, c10::Device(c10::kCPU)); },
                   ErrorCode::kBackendUnavailable, {name.c_str()});
    }
  }
  EXPECT_FALSE(core::kernels_unavailable_reason(c10::Device(c10::kCPU)).empty());
}

// ---- the CPU dtype rule, with the detection replaced by other machines' /proc/cpuinfo --------

namespace {

// Flags lines as the kernel prints them (abridged to what matters, plus some noise).
const char* kHaswell =  // AVX2 + FMA, no AVX512 (the machine kind)
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz\n"
    "flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi1 bmi2\n";
const char* kSkylakeX =  // AVX512-core, no BF16
    "vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\n"
    "flags\t\t: sse4_2 avx f16c fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl\n";
const char* kZen4 =  // AVX512-BF16, no AVX512-FP16, no AMX (one of this project's build machines)
    "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
    "flags\t\t: avx f16c fma avx2 avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl "
    "avx512_bf16 avx512vbmi avx512_vnni\n";
const char* kSapphireRapids =  // AVX512-BF16, AVX512-FP16, AMX-BF16 (no AMX-FP16)
    "vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    "flags\t\t: avx f16c fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 "
    "avx512_fp16 amx_bf16 amx_tile amx_int8\n";
const char* kGraniteRapids =  // + AMX-FP16
    "vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) 6980P\n"
    "flags\t\t: avx f16c fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 "
    "avx512_fp16 amx_bf16 amx_tile amx_int8 amx_fp16\n";
// Another of the build machines: an Intel Xeon (family 6, model 207) whose hypervisor hides AMX,
// so only AVX512-BF16 and AVX512-FP16 are left (bfloat16 linear 0.60x float32 there).
const char* kXeonNoAmx =
    "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n"
    "model name\t: Intel(R) Xeon(R) Processor\n"
    "flags\t\t: avx f16c fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx_vnni "
    "avx512_bf16 avx512_vnni avx512_fp16\n";

core::CpuCaps caps_of(const char* text, const std::string& cap = "") {
  core::CpuCaps c = core::parse_cpuinfo(text);
  if (!cap.empty()) {
    c.onednn_cap = core::parse_onednn_isa(cap);
    c.onednn_cap_text = "DNNL_MAX_CPU_ISA=" + cap;
  }
  return c;
}

std::string reason(const core::CpuCaps& c, at::ScalarType t) {
  return core::cpu_dtype_unavailable_reason(c, t);
}

void expect_has(const std::string& text, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(text.find(p), std::string::npos) << p << " in: " << text;
}

}  // namespace

TEST(UnitCpuCaps, ParsesCpuinfo) {
  const auto c = caps_of(kZen4);
  EXPECT_EQ(c.model, "AMD EPYC 9654 96-Core Processor");
  EXPECT_EQ(c.vendor, "AuthenticAMD");
  EXPECT_TRUE(c.amd());
  EXPECT_FALSE(caps_of(kXeonNoAmx).amd());
  EXPECT_EQ(caps_of(kHaswell).vendor, "");
  EXPECT_TRUE(c.avx2 && c.fma && c.avx512_core() && c.avx512_bf16);
  EXPECT_FALSE(c.avx512_fp16 || c.amx_bf16 || c.amx_tile);
  EXPECT_EQ(c.flags(), (std::vector<std::string>{"avx2", "fma", "f16c", "avx512f", "avx512bw",
                                                 "avx512vl", "avx512dq", "avx512_bf16"}));
  const auto h = caps_of(kHaswell);
  EXPECT_TRUE(h.avx2 && h.fma);
  EXPECT_FALSE(h.avx512f || h.avx512_core() || h.avx512_bf16);
  EXPECT_EQ(core::parse_cpuinfo("").model, "unknown");
  EXPECT_TRUE(core::parse_cpuinfo("").flags().empty());
}

TEST(UnitCpuCaps, OnednnCapNames) {
  EXPECT_EQ(core::parse_onednn_isa("avx2"), core::OnednnIsa::kAvx2);
  EXPECT_EQ(core::parse_onednn_isa(" AVX512_CORE_BF16 "), core::OnednnIsa::kAvx512CoreBf16);
  EXPECT_EQ(core::parse_onednn_isa("AVX10_1_512"), core::OnednnIsa::kAvx512CoreFp16);
  EXPECT_EQ(core::parse_onednn_isa("AVX512_CORE_AMX"), core::OnednnIsa::kAvx512CoreAmx);
  EXPECT_EQ(core::parse_onednn_isa("ALL"), core::OnednnIsa::kAll);
  EXPECT_EQ(core::parse_onednn_isa(""), core::OnednnIsa::kAll);
  EXPECT_LT(core::OnednnIsa::kAvx2, core::OnednnIsa::kAvx512CoreBf16);
}

TEST(UnitCpuCaps, Float32RunsEverywhere) {
  for (const char* cpu : {kHaswell, kSkylakeX, kZen4, kSapphireRapids, ""}) {
    EXPECT_EQ(reason(caps_of(cpu, "AVX2"), at::kFloat), "");
  }
}

TEST(UnitCpuCaps, Bfloat16OnlyWithNativeDotProducts) {
  // AVX2 + FMA only: the machine, where LibTorch ran the scalar fallback GEMM.
  const std::string h = reason(caps_of(kHaswell), at::kBFloat16);
  expect_has(h, {"bfloat16", "AVX512-BF16 or AMX-BF16", "AVX2 and FMA, no AVX512", "E5-2680 v3",
                 "use float32"});
  // AVX512 without BF16: oneDNN only emulates bf16 there (slower than float32).
  expect_has(reason(caps_of(kSkylakeX), at::kBFloat16), {"AVX512 (F, BW, VL, DQ)", "AMX-BF16"});
  EXPECT_EQ(reason(caps_of(kZen4), at::kBFloat16), "");
  EXPECT_EQ(reason(caps_of(kSapphireRapids), at::kBFloat16), "");
  // AMX-BF16 alone (no AVX512-BF16 flag) also counts.
  core::CpuCaps amx = caps_of(kSkylakeX);
  amx.amx_tile = amx.amx_bf16 = true;
  EXPECT_EQ(reason(amx, at::kBFloat16), "");
}

TEST(UnitCpuCaps, Bfloat16RefusedWhereItsDotProductsAreNoFasterThanFloat32) {
  // AVX512-BF16 on an Intel core without AMX: the instructions exist, the speed does not.
  expect_has(reason(caps_of(kXeonNoAmx), at::kBFloat16),
             {"bfloat16", "AVX512-BF16 but not AMX-BF16", "GenuineIntel", "0.6x", "use float32"});
  // The same flags on an AMD core run bfloat16 at 2.9x float32 (Zen 4).
  core::CpuCaps amd = caps_of(kXeonNoAmx);
  amd.vendor = "AuthenticAMD";
  EXPECT_EQ(reason(amd, at::kBFloat16), "");
  // An unknown vendor is not taken for AMD.
  core::CpuCaps unknown = caps_of(kZen4);
  unknown.vendor.clear();
  expect_has(reason(unknown, at::kBFloat16), {"unknown vendor", "AMX-BF16"});
}

TEST(UnitCpuCaps, Float16OnlyWithAmxFp16) {
  expect_has(reason(caps_of(kZen4), at::kHalf),
             {"float16", "AVX512-FP16 or AMX-FP16", "AVX512-BF16", "EPYC 9654"});
  expect_has(reason(caps_of(kHaswell), at::kHalf), {"float16", "no AVX512"});
  // AVX512-FP16 alone: float16 GEMMs 1.03x float32, a whole call 0.84x, on the Xeon.
  for (const char* cpu : {kXeonNoAmx, kSapphireRapids}) {
    expect_has(reason(caps_of(cpu), at::kHalf),
               {"float16", "AVX512-FP16 but not AMX-FP16", "0.84x", "use float32"});
  }
  EXPECT_EQ(reason(caps_of(kGraniteRapids), at::kHalf), "");
}

TEST(UnitCpuCaps, OnednnIsaCapRefusesWhatItHides) {
  // DNNL_MAX_CPU_ISA=AVX2 makes oneDNN behave as on an AVX2 CPU, whatever the flags say.
  expect_has(reason(caps_of(kZen4, "AVX2"), at::kBFloat16),
             {"capped", "DNNL_MAX_CPU_ISA=AVX2", "AVX512_CORE_BF16", "AVX512-BF16"});
  expect_has(reason(caps_of(kGraniteRapids, "AVX512_CORE_AMX"), at::kHalf),
             {"capped", "AVX512_CORE_AMX_FP16"});
  EXPECT_EQ(reason(caps_of(kGraniteRapids, "AVX512_CORE_AMX_FP16"), at::kHalf), "");
  // Intel's bfloat16 speed is AMX's: a cap below AMX refuses it (AVX512-BF16 does not count there).
  expect_has(reason(caps_of(kSapphireRapids, "AVX512_CORE_BF16"), at::kBFloat16),
             {"capped", "AVX512_CORE_AMX"});
  EXPECT_EQ(reason(caps_of(kSapphireRapids, "AVX512_CORE_AMX"), at::kBFloat16), "");
  EXPECT_EQ(reason(caps_of(kZen4, "ALL"), at::kBFloat16), "");
  core::CpuCaps off = caps_of(kZen4);
  off.mkldnn_enabled = false;
  expect_has(reason(off, at::kBFloat16), {"oneDNN", "disabled"});
}

TEST(UnitCpuCaps, InfoLinesSayWhy) {
  const auto lines = core::cpu_dtype_lines(caps_of(kHaswell));
  ASSERT_EQ(lines.size(), 3u);
  expect_has(lines[0], {"float32: yes"});
  expect_has(lines[1], {"bfloat16: no:", "AVX512-BF16"});
  expect_has(lines[2], {"float16: no:", "AVX512-FP16"});
  const auto spr = core::cpu_dtype_lines(caps_of(kSapphireRapids));
  expect_has(spr[1], {"bfloat16: yes", "AVX512-BF16 and AMX-BF16"});
  expect_has(spr[2], {"float16: no:", "AMX-FP16"});
  expect_has(core::cpu_dtype_lines(caps_of(kGraniteRapids))[2],
             {"float16: yes", "AVX512-FP16 and AMX-FP16"});
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

// CPUs described by their CPUID bits, for the rules that read them (whatever runs the test).
namespace {

struct TestCpus {
  core::CpuFeatures zen3, zen4, zen5, zen6, zen5_no_zmm, intel_avx512, intel_avx2, intel_amx;
  TestCpus() {
    core::CpuFeatures avx2;
    avx2.osxsave = avx2.avx = avx2.avx2 = avx2.fma = avx2.f16c = true;
    avx2.xcr0 = 0x7;
    core::CpuFeatures avx512 = avx2;
    avx512.avx512f = avx512.avx512bw = avx512.avx512dq = avx512.avx512vl = true;
    avx512.xcr0 = 0xE7;
    zen3 = avx2;
    zen3.amd = true;
    zen3.family = 0x19, zen3.model = 0x01;
    zen4 = avx512;
    zen4.amd = true;
    zen4.family = 0x19, zen4.model = 0x11;
    zen5 = zen4;
    zen5.family = 0x1A, zen5.model = 0x02;
    zen6 = zen5;
    zen6.family = 0x1B;
    zen5_no_zmm = zen5;  // an OS (or VM) that does not save the AVX-512 state
    zen5_no_zmm.xcr0 = 0x7;
    intel_avx512 = avx512;
    intel_avx512.family = 6, intel_avx512.model = 0xCF;
    intel_avx2 = avx2;
    intel_avx2.family = 6, intel_avx2.model = 0x55;
    intel_amx = intel_avx512;
    intel_amx.avx512_bf16 = intel_amx.amx_tile = intel_amx.amx_bf16 = true;
    intel_amx.xcr0 = 0x600E7;
    intel_amx.model = 0x8F;
  }
};

}  // namespace

TEST(UnitNetwork, CpuHeadPathRule) {
  using core::head::cpu_head_path_for;
  using core::head::CpuHeadPath;
  // The measured rule (head_bench).
  const TestCpus c;
  const core::CpuFeatures &avx2 = c.intel_avx2, &intel512 = c.intel_avx512, &amd512 = c.zen4;
  ASSERT_TRUE(intel512.avx512_core());
  constexpr int64_t kV1 = 768, kSapiens2 = 64;
  // Without AVX-512, oneDNN for every float32 head.
  EXPECT_EQ(cpu_head_path_for(avx2, at::kFloat, kV1), CpuHeadPath::kOnednn);
  EXPECT_EQ(cpu_head_path_for(avx2, at::kFloat, kSapiens2), CpuHeadPath::kOnednn);
  // Intel's AVX-512 cores: MKL's GEMMs for v1's wide head, oneDNN for Sapiens2's narrow one.
  EXPECT_EQ(cpu_head_path_for(intel512, at::kFloat, kV1), CpuHeadPath::kGemm);
  EXPECT_EQ(cpu_head_path_for(intel512, at::kFloat, kSapiens2), CpuHeadPath::kOnednn);
  EXPECT_EQ(cpu_head_path_for(intel512, at::kFloat, core::head::kNarrowHeadWidth + 1),
            CpuHeadPath::kGemm);
  // AMD's AVX-512 cores keep the GEMMs (oneDNN not measured faster there).
  EXPECT_EQ(cpu_head_path_for(amd512, at::kFloat, kSapiens2), CpuHeadPath::kGemm);
  // bfloat16 and float16 run the GEMMs, but for bfloat16 on AMX: oneDNN's on the narrow layers.
  core::CpuFeatures amx_off = c.intel_amx;  // an OS that does not save the tile state
  amx_off.xcr0 = 0xE7;
  for (const auto& cpu : {avx2, intel512, amd512, amx_off}) {
    EXPECT_EQ(cpu_head_path_for(cpu, at::kBFloat16, kSapiens2), CpuHeadPath::kGemm);
    EXPECT_EQ(cpu_head_path_for(cpu, at::kHalf, kV1), CpuHeadPath::kGemm);
  }
  ASSERT_TRUE(c.intel_amx.amx_bf16_os());
  EXPECT_EQ(cpu_head_path_for(c.intel_amx, at::kBFloat16, kSapiens2), CpuHeadPath::kMixed);
  EXPECT_EQ(cpu_head_path_for(c.intel_amx, at::kBFloat16, kV1), CpuHeadPath::kMixed);
  EXPECT_EQ(cpu_head_path_for(c.intel_amx, at::kHalf, kV1), CpuHeadPath::kGemm);
  EXPECT_EQ(cpu_head_path_for(c.intel_amx, at::kFloat, kV1), CpuHeadPath::kGemm);

  if (!at::hasMKLDNN()) GTEST_SKIP() << "LibTorch without oneDNN: the GEMM head only";
  // This CPU follows the rule unless the environment forces a path.
  EXPECT_EQ(core::head::cpu_head_path(at::kFloat, kSapiens2),
            cpu_head_path_for(core::host_cpu_features(), at::kFloat, kSapiens2));
  test::with_env("SAPIENS_SEG_CPU_HEAD", "gemm", [] {
    EXPECT_EQ(core::head::cpu_head_path(at::kFloat, kSapiens2), CpuHeadPath::kGemm);
  });
  test::with_env("SAPIENS_SEG_CPU_HEAD", "onednn", [] {
    EXPECT_EQ(core::head::cpu_head_path(at::kBFloat16, kV1), CpuHeadPath::kOnednn);
  });
  test::with_env("SAPIENS_SEG_CPU_HEAD", "mixed", [] {
    EXPECT_EQ(core::head::cpu_head_path(at::kFloat, kV1), CpuHeadPath::kMixed);
  });
  test::with_env("SAPIENS_SEG_CPU_HEAD", "mkl", [] {
    expect_error([] { core::head::cpu_head_path(at::kFloat, kV1); }, ErrorCode::kInvalidInput,
                 {"SAPIENS_SEG_CPU_HEAD", "'mkl'"});
  });
}

// The MLPs' row chunks cover every row once, each a whole chunk but for the last, which takes in
// a remainder shorter than a quarter chunk (Sapiens2 0.4b at 1024x768: 3081 tokens).
TEST(UnitNetwork, MlpRowChunksLeaveNoThinChunk) {
  auto plan = [](int64_t total, int64_t rows) {
    std::vector<int64_t> sizes;
    for (int64_t r = 0, n = 0; r < total; r += n) {
      n = core::cpu::chunk_rows_at(r, total, rows);
      sizes.push_back(n);
    }
    return sizes;
  };
  EXPECT_EQ(plan(3081, 1024), (std::vector<int64_t>{1024, 1024, 1033}));
  EXPECT_EQ(plan(3072, 1024), (std::vector<int64_t>{1024, 1024, 1024}));
  EXPECT_EQ(plan(3328, 1024), (std::vector<int64_t>{1024, 1024, 1024, 256}));
  EXPECT_EQ(plan(300, 1024), (std::vector<int64_t>{300}));
  EXPECT_EQ(core::cpu::largest_chunk_rows(3081, 1024), 1033);
  EXPECT_EQ(core::cpu::largest_chunk_rows(300, 1024), 300);
  for (int64_t total = 1; total < 5000; total += 7) {
    const std::vector<int64_t> sizes = plan(total, 1024);
    int64_t sum = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      sum += sizes[i];
      if (i + 1 < sizes.size()) EXPECT_EQ(sizes[i], 1024) << total;
    }
    EXPECT_EQ(sum, total);
    if (sizes.size() > 1) {
      EXPECT_GE(sizes.back(), 256) << total;
      EXPECT_LT(sizes.back(), 1024 + 256) << total;
    }
    EXPECT_EQ(core::cpu::largest_chunk_rows(total, 1024),
              *std::max_element(sizes.begin(), sizes.end()));
  }
}

// Sapiens2's float32 MLP by column chunks: where measured (AVX2), not on AVX-512 CPUs.
TEST(UnitNetwork, Sapiens2MlpColumnsRule) {
  const TestCpus c;
  EXPECT_EQ(core::v2::mlp_columns_for(c.zen3), 1024);
  EXPECT_EQ(core::v2::mlp_columns_for(c.intel_avx2), 1024);
  EXPECT_EQ(core::v2::mlp_columns_for(c.intel_avx512), 1024);
  EXPECT_EQ(core::v2::mlp_columns_for(c.zen4), 0);
  EXPECT_EQ(core::v2::mlp_columns_for(c.zen5), 0);
}

// Which deconvolutions go by Winograd: float32 on CPUs without AVX-512 (measured there), the
// wide layers only unless forced, never another dtype.
TEST(UnitNetwork, CpuHeadWinogradRule) {
  using core::head::cpu_head_winograd;
  using core::head::cpu_head_winograd_for;
  using core::head::Winograd;
  const TestCpus c;
  EXPECT_EQ(cpu_head_winograd_for(c.zen3, at::kFloat), Winograd::kWide);
  EXPECT_EQ(cpu_head_winograd_for(c.intel_avx2, at::kFloat), Winograd::kWide);
  EXPECT_EQ(cpu_head_winograd_for(c.intel_avx2, at::kBFloat16), Winograd::kOff);
  EXPECT_EQ(cpu_head_winograd_for(c.intel_avx512, at::kFloat), Winograd::kWide);
  EXPECT_EQ(cpu_head_winograd_for(c.intel_avx512, at::kBFloat16), Winograd::kOff);
  EXPECT_EQ(cpu_head_winograd_for(c.zen5, at::kFloat), Winograd::kOff);
  EXPECT_EQ(cpu_head_winograd_for(c.zen4, at::kFloat), Winograd::kOff);
  EXPECT_EQ(cpu_head_winograd(at::kFloat),
            cpu_head_winograd_for(core::host_cpu_features(), at::kFloat));
  test::with_env("SAPIENS_SEG_CPU_WINOGRAD", "on", [] {
    EXPECT_EQ(cpu_head_winograd(at::kFloat), Winograd::kWide);
    EXPECT_EQ(cpu_head_winograd(at::kHalf), Winograd::kOff);
  });
  test::with_env("SAPIENS_SEG_CPU_WINOGRAD", "all", [] {
    EXPECT_EQ(cpu_head_winograd(at::kFloat), Winograd::kAll);
    EXPECT_EQ(cpu_head_winograd(at::kBFloat16), Winograd::kOff);
  });
  test::with_env("SAPIENS_SEG_CPU_WINOGRAD", "off",
                 [] { EXPECT_EQ(cpu_head_winograd(at::kFloat), Winograd::kOff); });
  test::with_env("SAPIENS_SEG_CPU_WINOGRAD", "auto", [] {
    EXPECT_EQ(cpu_head_winograd(at::kFloat),
              cpu_head_winograd_for(core::host_cpu_features(), at::kFloat));
  });
  // Under the oneDNN GEMM policy the direct oneDNN path keeps every GEMM on oneDNN.
  test::with_env("SAPIENS_SEG_CPU_GEMM", "onednn",
                 [] { EXPECT_EQ(cpu_head_winograd(at::kFloat), Winograd::kOff); });
  test::with_env("SAPIENS_SEG_CPU_WINOGRAD", "yes", [] {
    expect_error([] { cpu_head_winograd(at::kFloat); }, ErrorCode::kInvalidInput,
                 {"SAPIENS_SEG_CPU_WINOGRAD", "'yes'"});
  });
  // kWide takes a layer when both its sides have kWinogradMinChannels: Sapiens2's 256 -> 128,
  // not its 128 -> 64; float32 only.
  core::head::HeadWeights w;
  w.deconv_w = {at::zeros({256, 128, 4, 4}), at::zeros({128, 64, 4, 4})};
  w.seg_w = at::zeros({3, 64, 1, 1});
  w.seg_b = at::zeros({3});
  const auto path = core::head::CpuHeadPath::kGemm;
  EXPECT_EQ(core::head::CpuHead(w, path, Winograd::kWide).winograd_layers(), 1);
  EXPECT_EQ(core::head::CpuHead(w, path, Winograd::kAll).winograd_layers(), 2);
  EXPECT_EQ(core::head::CpuHead(w, path, Winograd::kOff).winograd_layers(), 0);
  for (auto& d : w.deconv_w) d = d.to(at::kBFloat16);
  EXPECT_EQ(core::head::CpuHead(w, path, Winograd::kAll).winograd_layers(), 0);
}

// ---- the float32 GEMM library (core/cpu/gemm) --------------------------------------------------

TEST(UnitCpuGemm, Float32PolicyFollowsTheCpuTable) {
  using core::cpu::float32_gemm_for;
  using core::cpu::GemmPolicy;
  const TestCpus c;
  // oneDNN where MKL runs its AVX2 code on a core with full-width AVX-512: AMD Zen 5 and later.
  EXPECT_EQ(float32_gemm_for(c.zen5).policy, GemmPolicy::kOnednn);
  EXPECT_EQ(float32_gemm_for(c.zen6).policy, GemmPolicy::kOnednn);
  // MKL throughout on AMD's AVX2 cores (its GEMMs outran oneDNN's fused ones on Zen 3), and on a
  // Zen 5 whose AVX-512 state the OS does not save (oneDNN cannot use AVX-512 there either).
  EXPECT_EQ(float32_gemm_for(c.zen3).policy, GemmPolicy::kMkl);
  EXPECT_EQ(float32_gemm_for(c.zen5_no_zmm).policy, GemmPolicy::kMkl);
  // Split elsewhere: Zen 4's 256-bit units and Intel, where the libraries' GEMMs ran alike.
  for (const auto* cpu : {&c.zen4, &c.intel_avx512, &c.intel_avx2}) {
    EXPECT_EQ(float32_gemm_for(*cpu).policy, GemmPolicy::kSplit) << float32_gemm_for(*cpu).reason;
  }
  for (const auto* cpu : {&c.zen3, &c.zen4, &c.zen5, &c.intel_avx512}) {
    EXPECT_FALSE(float32_gemm_for(*cpu).reason.empty());
  }
  // Other dtypes keep the split (LibTorch runs their plain GEMMs on oneDNN anyway).
  EXPECT_EQ(core::cpu::policy_for(at::kBFloat16, GemmPolicy::kMkl), GemmPolicy::kSplit);
  EXPECT_EQ(core::cpu::policy_for(at::kFloat, GemmPolicy::kMkl), GemmPolicy::kMkl);
  // The head follows the GEMMs: oneDNN's convolutions on Zen 5 in float32, whatever its width.
  using core::head::cpu_head_path_for;
  using core::head::CpuHeadPath;
  EXPECT_EQ(cpu_head_path_for(c.zen5, at::kFloat, 768), CpuHeadPath::kOnednn);
  EXPECT_EQ(cpu_head_path_for(c.zen5, at::kFloat, 64), CpuHeadPath::kOnednn);
  EXPECT_EQ(cpu_head_path_for(c.zen4, at::kFloat, 768), CpuHeadPath::kGemm);
  EXPECT_EQ(cpu_head_path_for(c.zen5, at::kBFloat16, 768), CpuHeadPath::kGemm);
}

TEST(UnitCpuGemm, EnvironmentOverridesTheTable) {
  using core::cpu::float32_gemm;
  using core::cpu::GemmPolicy;
  if (!at::hasMKLDNN()) GTEST_SKIP() << "LibTorch without oneDNN: MKL only";
  test::with_env("SAPIENS_SEG_CPU_GEMM", "onednn", [] {
    EXPECT_EQ(float32_gemm().policy, GemmPolicy::kOnednn);
    EXPECT_NE(core::cpu::float32_gemm_line().find("oneDNN (SAPIENS_SEG_CPU_GEMM=onednn)"),
              std::string::npos);
    // The head's float32 GEMMs move with the backbone's.
    EXPECT_EQ(core::head::cpu_head_path(at::kFloat, 768), core::head::CpuHeadPath::kOnednn);
  });
  test::with_env("SAPIENS_SEG_CPU_GEMM", "mkl", [] {
    EXPECT_EQ(float32_gemm().policy, GemmPolicy::kMkl);
    EXPECT_NE(core::cpu::float32_gemm_line().find("MKL (SAPIENS_SEG_CPU_GEMM=mkl)"),
              std::string::npos);
  });
  test::with_env("SAPIENS_SEG_CPU_GEMM", "split",
                 [] { EXPECT_EQ(float32_gemm().policy, GemmPolicy::kSplit); });
  test::with_env("SAPIENS_SEG_CPU_GEMM", "auto", [] {
    EXPECT_EQ(float32_gemm().policy, core::cpu::float32_gemm_for(core::host_cpu_features()).policy);
  });
  test::with_env("SAPIENS_SEG_CPU_GEMM", "blas", [] {
    expect_error([] { float32_gemm(); }, ErrorCode::kInvalidInput,
                 {"SAPIENS_SEG_CPU_GEMM", "'blas'"});
  });
}

// Each policy computes the layers, on the library it names (the results alone could not tell:
// both libraries are within float32 rounding of the exact product).
TEST(UnitCpuGemm, EachPolicyRunsTheLayersOnItsLibrary) {
  using core::cpu::GemmPolicy;
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, 37, 64}), w = at::randn({48, 64}) / 8, b = at::randn({48});
  const at::Tensor residual = at::randn({2, 37, 48});
  const at::Tensor exact =
      at::matmul(x.to(at::kDouble), w.to(at::kDouble).t()).add(b.to(at::kDouble));
  auto close = [](const at::Tensor& got, const at::Tensor& want) {
    EXPECT_EQ(got.sizes(), want.sizes());
    EXPECT_LE((got.to(at::kDouble) - want).abs().max().item<double>(), 1e-4);
  };
  for (const GemmPolicy p : {GemmPolicy::kMkl, GemmPolicy::kSplit, GemmPolicy::kOnednn}) {
    if (p != GemmPolicy::kMkl && !at::hasMKLDNN()) continue;
    SCOPED_TRACE(core::cpu::to_string(p));
    at::Tensor plain, gelu, add;
    const test::OpCounts ops = test::count_ops([&] {
      plain = core::cpu::linear(x, w, b, p);
      gelu = core::cpu::linear_gelu(x, w, b, p);
      add = core::cpu::linear_add(x, residual, w, b, p);
    });
    close(plain, exact);
    close(gelu, at::gelu(exact));
    close(add, exact.add(residual.to(at::kDouble)));
    // mkl: three at::linear; split: the plain one on MKL, the fused two on oneDNN; onednn: three.
    const int onednn = test::count_of(ops, "mkldnn::_linear_pointwise");
    EXPECT_EQ(onednn, p == GemmPolicy::kMkl ? 0 : p == GemmPolicy::kSplit ? 2 : 3);
    EXPECT_EQ(test::count_of(ops, "aten::linear"), 3 - onednn);
  }
  // bfloat16's plain GEMM stays on at::linear (LibTorch's own oneDNN path) under any policy.
  const test::OpCounts bf16 = test::count_ops([&] {
    core::cpu::linear(x.to(at::kBFloat16), w.to(at::kBFloat16), b.to(at::kBFloat16),
                      core::cpu::policy_for(at::kBFloat16, GemmPolicy::kOnednn));
  });
  EXPECT_EQ(test::count_of(bf16, "mkldnn::_linear_pointwise"), 0);
}

TEST(UnitCpuGemm, CpuIdentityIsWhatProcCpuinfoSays) {
  std::ifstream in("/proc/cpuinfo");
  std::map<std::string, std::string> first;
  for (std::string line; std::getline(in, line) && !line.empty();) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    first.emplace(key, colon + 2 <= line.size() ? line.substr(colon + 2) : "");
  }
  if (!first.count("cpu family") || !first.count("model") || !first.count("stepping")) {
    GTEST_SKIP() << "no x86 /proc/cpuinfo here";
  }
  const core::CpuFeatures& f = core::host_cpu_features();
  EXPECT_EQ(f.family, std::stoi(first["cpu family"]));
  EXPECT_EQ(f.model, std::stoi(first["model"]));
  EXPECT_EQ(f.stepping, std::stoi(first["stepping"]));
}

// The fused head runs every dtype the network may have (float16 on CPUs with AMX-FP16; it once
// read float16 maps as bfloat16), held to its own float32 result on the same weights.
TEST(UnitNetwork, CpuHeadRunsEveryDtype) {
  at::manual_seed(5);
  const int64_t C = 32, gh = 6, gw = 4;
  core::head::HeadWeights w;
  int64_t in = C;
  for (const int64_t out : {16, 16}) {
    w.deconv_w.push_back(at::randn({in, out, 4, 4}) / std::sqrt(16.0 * double(in)));
    in = out;
  }
  w.conv_w.push_back(at::randn({16, in, 1, 1}) / 4.0);
  w.conv_b.push_back(at::randn({16}));
  w.seg_w = at::randn({5, 16, 1, 1}) / 4.0;
  w.seg_b = at::randn({5});
  const at::Tensor feat = at::randn({1, gh * gw, C});
  const at::Tensor ref =
      core::head::CpuHead(w, core::head::CpuHeadPath::kGemm).forward(feat, gh, gw);
  ASSERT_EQ(ref.sizes(), at::IntArrayRef({1, 5, gh * 4, gw * 4}));
  for (const auto dtype : {at::kHalf, at::kBFloat16}) {
    core::head::HeadWeights wd = w;
    for (auto* list : {&wd.deconv_w, &wd.conv_w, &wd.conv_b}) {
      for (auto& t : *list) t = t.to(dtype);
    }
    wd.seg_w = wd.seg_w.to(dtype);
    wd.seg_b = wd.seg_b.to(dtype);
    const at::Tensor y = core::head::CpuHead(wd, core::head::CpuHeadPath::kGemm)
                             .forward(feat.to(dtype), gh, gw)
                             .to(at::kFloat);
    const double d = (y - ref).abs().max().item<double>();
    std::printf("fused head %s vs float32: max |diff| %.4f\n", c10::toString(dtype), d);
    EXPECT_LE(d, (dtype == at::kHalf ? 0.02 : 0.1) * ref.abs().max().item<double>());
  }
}

// The CPU head on both paths against the module's ops (transposed convolutions, InstanceNorm,
// SiLU, 1x1 convolutions with their biases) in float32, on maps of several pixel tiles with a
// partial last one: the classifier's tiles are transposed into the logits' planes one by one, and
// on the GEMM path a deconvolution's output stays in parity planes (several tiles each) through
// the 1x1 convolutions. Heads of narrow layers (no Winograd under kWide) and of one wide first
// layer (Winograd's raster output feeding the sub-pixel GEMMs; under kMixed, the GEMMs' parity
// planes feeding oneDNN's deconvolutions).
TEST(UnitNetwork, CpuHeadIsTheModulesOps) {
  at::manual_seed(11);
  // 8gh x 8gw = 39936 pixels: 4 full tiles and a part; parity planes of 96 rows of 106 pixels.
  const int64_t gh = 24, gw = 26;
  for (const int64_t C : {24, 160}) {
    core::head::HeadWeights w;
    int64_t in = C;
    for (const int64_t out : {C == 24 ? int64_t{16} : C, int64_t{16}, int64_t{8}}) {
      w.deconv_w.push_back(at::randn({in, out, 4, 4}) / std::sqrt(16.0 * double(in)));
      in = out;
    }
    for (int s = 0; s < 2; ++s) {
      w.conv_w.push_back(at::randn({8, 8, 1, 1}) / 3.0);
      w.conv_b.push_back(at::randn({8}) * 4.0);
    }
    w.seg_w = at::randn({5, 8, 1, 1}) / 3.0;
    w.seg_b = at::randn({5});
    const at::Tensor feat = at::randn({2, gh * gw, C});
    auto norm_silu = [](const at::Tensor& y) {
      return at::silu(at::instance_norm(y, {}, {}, {}, {}, true, 0.1, 1e-5, false));
    };
    at::Tensor x = feat.view({2, gh, gw, C}).permute({0, 3, 1, 2});
    for (const at::Tensor& d : w.deconv_w) x = norm_silu(at::conv_transpose2d(x, d, {}, 2, 1));
    for (size_t s = 0; s < w.conv_w.size(); ++s)
      x = norm_silu(at::conv2d(x, w.conv_w[s], w.conv_b[s]));
    const at::Tensor want = at::conv2d(x, w.seg_w, w.seg_b);
    ASSERT_EQ(want.sizes(), at::IntArrayRef({2, 5, gh * 8, gw * 8}));
    using core::head::CpuHeadPath;
    using core::head::Winograd;
    for (const auto path : {CpuHeadPath::kGemm, CpuHeadPath::kOnednn, CpuHeadPath::kMixed}) {
      if (path != CpuHeadPath::kGemm && !at::hasMKLDNN()) continue;
      // kWide: only a layer of kWinogradMinChannels each way (the wide head's first); kAll: all.
      for (const auto wino : {Winograd::kOff, Winograd::kWide, Winograd::kAll}) {
        const core::head::CpuHead head(w, path, wino);
        const int64_t layers = wino == Winograd::kAll ? 3 : wino == Winograd::kWide && C == 160;
        EXPECT_EQ(head.winograd_layers(), layers);
        // kMixed: oneDNN for the layers no wider than kNarrowHeadWidth (all but the 160-wide).
        const int64_t direct = 3 - layers, narrow = C == 160 ? 2 : 3;
        EXPECT_EQ(head.onednn_layers(), path == CpuHeadPath::kGemm     ? 0
                                        : path == CpuHeadPath::kOnednn ? direct
                                                                       : std::min(direct, narrow));
        const at::Tensor got = head.forward(feat, gh, gw);
        ASSERT_EQ(got.sizes(), want.sizes()) << core::head::to_string(path);
        EXPECT_LE((got - want).abs().max().item<double>(), 1e-4 * want.abs().max().item<double>())
            << "C " << C << " " << core::head::to_string(path) << " winograd "
            << core::head::to_string(wino);
      }
    }
  }
}

// Winograd F(2x2, 2x2) against the transposed convolution itself (float64), on maps of even and
// odd sizes (tiles on an odd map's last row and column hang over its edge) and one of several
// bands, with every output row handed to the callback once, in order.
TEST(UnitNetwork, WinogradDeconvIsTheTransposedConvolution) {
  at::manual_seed(17);
  // 16 -> 24 channels: the 8-wide loops alone; 12 -> 10: their scalar tails too.
  for (const auto& [Cin, Cout] : std::vector<std::pair<int64_t, int64_t>>{{16, 24}, {12, 10}}) {
    const at::Tensor w = at::randn({Cin, Cout, 4, 4}) / std::sqrt(16.0 * double(Cin));
    const at::Tensor filters = core::head::winograd_deconv_filters(w);
    ASSERT_EQ(filters.sizes(), at::IntArrayRef({4, 9, Cin, Cout}));
    // 29 x 61: 15 x 31 tiles, two bands of tile rows; the others one tile or a ragged one.
    for (const auto& [H, W] : std::vector<std::pair<int64_t, int64_t>>{
             {29, 61}, {30, 62}, {1, 1}, {2, 2}, {3, 4}, {5, 3}}) {
      const at::Tensor x = at::randn({H * W, Cin});
      const at::Tensor want =
          at::conv_transpose2d(x.view({1, H, W, Cin}).permute({0, 3, 1, 2}).to(at::kDouble),
                               w.to(at::kDouble), {}, 2, 1)
              .permute({0, 2, 3, 1})
              .reshape({4 * H * W, Cout});
      const at::Tensor padded = at::zeros({(H + 3) * (W + 3), Cin});
      padded.view({H + 3, W + 3, Cin})
          .slice(0, 1, H + 1)
          .slice(1, 1, W + 1)
          .copy_(x.view({H, W, Cin}));
      const at::Tensor y = at::full({4 * H * W, Cout}, std::nan(""));
      int64_t next_row = 0;
      core::head::winograd_deconv(padded, H, W, filters, y, [&](int64_t row0, int64_t rows) {
        EXPECT_EQ(row0, next_row);
        EXPECT_GT(rows, 0);
        // The band's rows are final when they are handed over.
        EXPECT_TRUE(y.narrow(0, row0 * 2 * W, rows * 2 * W).isfinite().all().item<bool>());
        next_row = row0 + rows;
      });
      EXPECT_EQ(next_row, 2 * H) << H << "x" << W;
      const double d = (y.to(at::kDouble) - want).abs().max().item<double>();
      EXPECT_LE(d, 2e-6 * want.abs().max().item<double>())
          << Cin << "->" << Cout << " " << H << "x" << W;
    }
    const at::Tensor bad = at::zeros({4 * 4, Cin});  // not padded: the wrong row count
    expect_error(
        [&] {
          core::head::winograd_deconv(bad, 2, 2, filters, at::empty({16, Cout}), {});
        },
        ErrorCode::kInternal, {"winograd_deconv"});
  }
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

// bfloat16 with the library's attention kernel against bfloat16 with LibTorch's attention, both
// measured from the float32 network: the kernel may not take the network further from float32.
TEST(UnitNetwork, BFloat16AttentionKernelAsCloseAsLibTorchs) {
  if (!core::attention::cpu_attention_runs(core::attention::CpuAttentionPath::kAvx512Bf16,
                                           at::kBFloat16, 32)) {
    GTEST_SKIP() << "no AVX512-BF16 on this CPU: bfloat16 runs LibTorch's attention only";
  }
  const auto b = core::open_torchscript(fixture("tiny_a_torchscript.pt2"));
  const auto cfg = config_of(b);
  const core::v1::Network f32(b.tensors, cfg, c10::Device(c10::kCPU), at::kFloat);
  const core::v1::Network bf16(b.tensors, cfg, c10::Device(c10::kCPU), at::kBFloat16);
  at::manual_seed(4);
  const at::Tensor x = at::randn({1, 3, 256, 192});
  const at::Tensor a = f32.forward(x);
  // Forced both ways: the kernel is the AMX one where it runs (this fixture's head dim is 32, and
  // it is then the default), else the AVX512-BF16 one.
  const at::Tensor k = test::with_env("SAPIENS_SEG_CPU_ATTENTION", "kernel", [&] {
                         return bf16.forward(x);
                       }).to(at::kFloat);
  const at::Tensor l =
      test::with_libtorch_attention([&] { return bf16.forward(x); }).to(at::kFloat);
  const double dk = (a - k).abs().mean().item<double>(), dl = (a - l).abs().mean().item<double>();
  const double agree_k = a.argmax(1).eq(k.argmax(1)).to(at::kFloat).mean().item<double>();
  const double agree_l = a.argmax(1).eq(l.argmax(1)).to(at::kFloat).mean().item<double>();
  std::printf(
      "bf16 vs fp32 (Tiny-A): mean |diff| kernel %.4f, LibTorch %.4f; argmax agreement "
      "%.4f, %.4f\n",
      dk, dl, agree_k, agree_l);
  EXPECT_FALSE(at::equal(k, l));  // the two paths did run
  EXPECT_LE(dk, 1.25 * dl);
  EXPECT_GE(agree_k, agree_l - 0.01);
}

// ---- the TorchScript archive reader ------------------------------------------------------------

namespace {

void put16(std::string& s, std::uint32_t v) {
  s += static_cast<char>(v & 0xFF);
  s += static_cast<char>((v >> 8) & 0xFF);
}
void put32(std::string& s, std::uint32_t v) {
  put16(s, v & 0xFFFF);
  put16(s, v >> 16);
}

// Raw DEFLATE of `data` (zlib, no header), as zip writers store method-8 records.
std::string deflate_raw(const std::string& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

struct ZipOptions {
  std::map<std::string, std::uint32_t> declared;  // a record's size in both headers
  std::set<std::string> deflated;                 // records stored with DEFLATE
  std::map<std::string, std::uint32_t> crc;       // a record's CRC-32 field
  std::map<std::string, std::uint32_t> inflated;  // a record's uncompressed size alone
  std::uint16_t flags = 0;                        // every record's general-purpose bits
};

// A zip of records under one top folder, as torch lays them out (without alignment padding,
// which the reader does not need), with their CRC-32s.
std::shared_ptr<const std::vector<std::uint8_t>> make_zip(
    const std::vector<std::pair<std::string, std::string>>& files, const ZipOptions& o = {}) {
  std::string out, central;
  for (const auto& [rel, plain] : files) {
    const std::string name = "archive/" + rel;
    const bool deflated = o.deflated.count(rel) != 0;
    const std::string data = deflated ? deflate_raw(plain) : plain;
    const auto it = o.declared.find(rel);
    const std::uint32_t size =
        it == o.declared.end() ? static_cast<std::uint32_t>(data.size()) : it->second;
    const auto inf = o.inflated.find(rel);
    const std::uint32_t usize = inf != o.inflated.end()  ? inf->second
                                : it == o.declared.end() ? static_cast<std::uint32_t>(plain.size())
                                                         : it->second;
    const auto c = o.crc.find(rel);
    const std::uint32_t crc =
        c == o.crc.end() ? core::crc32(plain.data(), plain.size()) : c->second;
    const std::uint16_t method = deflated ? 8 : 0;
    const auto offset = static_cast<std::uint32_t>(out.size());
    out += "PK\x03\x04";
    put16(out, 20), put16(out, o.flags), put16(out, method), put16(out, 0), put16(out, 0);
    put32(out, crc), put32(out, size), put32(out, usize);
    put16(out, static_cast<std::uint32_t>(name.size())), put16(out, 0);
    out += name + data;
    central += "PK\x01\x02";
    put16(central, 20), put16(central, 20), put16(central, o.flags), put16(central, method);
    put16(central, 0), put16(central, 0);
    put32(central, crc), put32(central, size), put32(central, usize);
    put16(central, static_cast<std::uint32_t>(name.size()));
    put16(central, 0), put16(central, 0), put16(central, 0), put16(central, 0);
    put32(central, 0), put32(central, offset);
    central += name;
  }
  const auto cd_offset = static_cast<std::uint32_t>(out.size());
  out += central;
  out += "PK\x05\x06";
  put16(out, 0), put16(out, 0);
  put16(out, static_cast<std::uint32_t>(files.size())),
      put16(out, static_cast<std::uint32_t>(files.size()));
  put32(out, static_cast<std::uint32_t>(central.size())), put32(out, cd_offset), put16(out, 0);
  return std::make_shared<const std::vector<std::uint8_t>>(out.begin(), out.end());
}

void put64(std::string& s, std::uint64_t v) {
  put32(s, static_cast<std::uint32_t>(v & 0xFFFFFFFF));
  put32(s, static_cast<std::uint32_t>(v >> 32));
}

// The same archive with every size and offset in zip64 fields, as writers lay out files over
// 4 GiB (the 1B checkpoint): saturated 32-bit fields, a zip64 extra field per entry, the zip64
// end-of-central-directory record and its locator.
std::shared_ptr<const std::vector<std::uint8_t>> make_zip64(
    const std::vector<std::pair<std::string, std::string>>& files) {
  std::string out, central;
  for (const auto& [rel, data] : files) {
    const std::string name = "archive/" + rel;
    const auto offset = static_cast<std::uint64_t>(out.size());
    out += "PK\x03\x04";
    const std::uint32_t crc = core::crc32(data.data(), data.size());
    put16(out, 45), put16(out, 0), put16(out, 0), put16(out, 0), put16(out, 0);
    put32(out, crc), put32(out, 0xFFFFFFFF), put32(out, 0xFFFFFFFF);
    put16(out, static_cast<std::uint32_t>(name.size())), put16(out, 20);
    out += name;
    put16(out, 1), put16(out, 16), put64(out, data.size()), put64(out, data.size());
    out += data;
    central += "PK\x01\x02";
    put16(central, 45), put16(central, 45), put16(central, 0), put16(central, 0);
    put16(central, 0), put16(central, 0);
    put32(central, crc), put32(central, 0xFFFFFFFF), put32(central, 0xFFFFFFFF);
    put16(central, static_cast<std::uint32_t>(name.size()));
    put16(central, 28), put16(central, 0), put16(central, 0), put16(central, 0);
    put32(central, 0), put32(central, 0xFFFFFFFF);
    central += name;
    put16(central, 1), put16(central, 24);
    put64(central, data.size()), put64(central, data.size()), put64(central, offset);
  }
  const auto cd_offset = static_cast<std::uint64_t>(out.size());
  out += central;
  const auto z64 = static_cast<std::uint64_t>(out.size());
  out += "PK\x06\x06";
  put64(out, 44), put16(out, 45), put16(out, 45), put32(out, 0), put32(out, 0);
  put64(out, files.size()), put64(out, files.size()), put64(out, central.size());
  put64(out, cd_offset);
  out += "PK\x06\x07";
  put32(out, 0), put64(out, z64), put32(out, 1);
  out += "PK\x05\x06";
  put16(out, 0), put16(out, 0), put16(out, 0xFFFF), put16(out, 0xFFFF);
  put32(out, 0xFFFFFFFF), put32(out, 0xFFFFFFFF), put16(out, 0);
  return std::make_shared<const std::vector<std::uint8_t>>(out.begin(), out.end());
}

std::string unicode(const std::string& s) {
  std::string r = "X";
  put32(r, static_cast<std::uint32_t>(s.size()));
  return r + s;
}

// data.pkl of a module `__torch__.m.Root` with one child `attn` (class __torch__.m.Attn) holding
// the tensor `w`: storage `key` of `storage_type` with `numel` elements, viewed as [n] from
// `offset`.
std::string pickle_tensor(const std::string& storage_type, int numel, int n, int offset = 0) {
  std::string p = "\x80\x02";
  p += "c__torch__.m\nRoot\n)\x81}(" + unicode("attn");
  p += "c__torch__.m\nAttn\n)\x81}(" + unicode("w");
  p += "ctorch._utils\n_rebuild_tensor_v2\n(";
  p += "(" + unicode("storage") + "ctorch\n" + storage_type + "\n" + unicode("0") + unicode("cpu") +
       "K" + static_cast<char>(numel) + "tQ";
  p += std::string("K") + static_cast<char>(offset);
  p += std::string("K") + static_cast<char>(n) + "\x85";
  p += "K\x01\x85\x89";
  p += "ccollections\nOrderedDict\n)Rt";
  p += "Rub";  // REDUCE, SETITEMS, BUILD (attn)
  p += "ub.";  // SETITEMS, BUILD (root), STOP
  return p;
}

const char* kAttnCode =
    "class Root(Module):\n  __parameters__ = []\n"
    "class Attn(Module):\n  __parameters__ = [\"w\", ]\n"
    "  def forward(self: __torch__.m.Attn, x: Tensor) -> Tensor:\n"
    "    _0 = torch.reshape((self.qkv).forward(x, ), [_1, _2, 3, 4, 16])\n"
    "    return torch.reshape(_0, [_1, _2, 64])\n";

std::string floats(std::initializer_list<float> v) {
  return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * sizeof(float));
}

template <typename Fn>
void expect_format_error(Fn fn, std::initializer_list<std::string> parts) {
  expect_error(fn, ErrorCode::kFormatError, parts);
}

}  // namespace

TEST(UnitArchive, TensorsMatchTorchJitLoad) {
  const std::string path = fixture("tiny_a_torchscript.pt2");
  const auto archive = core::TorchScriptArchive::open(path);
  const core::TensorMap ours = archive.all();
  const auto module = torch::jit::load(path, at::kCPU);
  std::size_t n = 0;
  auto check = [&](const std::string& name, const at::Tensor& ref) {
    ++n;
    auto it = ours.find(name);
    ASSERT_NE(it, ours.end()) << name;
    EXPECT_EQ(it->second.scalar_type(), ref.scalar_type()) << name;
    EXPECT_TRUE(at::equal(it->second, ref)) << name;
  };
  for (const auto& p : module.named_parameters(true)) check(p.name, p.value);
  for (const auto& b : module.named_buffers(true)) check(b.name, b.value);
  EXPECT_EQ(n, ours.size());
  EXPECT_EQ(archive.attention_heads("backbone.layers.0.attn"), 2);
  EXPECT_EQ(archive.attention_heads("backbone.layers.1.attn"), 2);  // a mangled class
  EXPECT_EQ(archive.attention_heads("backbone"), std::nullopt);
  // Views, not copies: the weights stay in the mapped file.
  const char* key = "backbone.layers.0.attn.qkv.weight";
  EXPECT_EQ(archive.all().at(key).data_ptr(), ours.at(key).data_ptr());
  EXPECT_EQ(core::open_torchscript(path).heads_from_graph, 2);
  EXPECT_EQ(core::open_torchscript(path).module, nullptr);
  EXPECT_NE(core::open_torchscript(path, /*load_module=*/true).module, nullptr);
}

TEST(UnitArchive, HandBuiltArchive) {
  const auto zip = make_zip({{"data.pkl", pickle_tensor("FloatStorage", 4, 3, 1)},
                             {"code/__torch__/m.py", kAttnCode},
                             {"data/0", floats({1.f, 2.f, 3.f, 4.f})},
                             {"byteorder", "little"}});
  const auto a = core::TorchScriptArchive::from_buffer(zip, "hand.pt2");
  ASSERT_EQ(a.tensors().size(), 1u);
  EXPECT_EQ(a.tensors()[0].name, "attn.w");
  const at::Tensor w = a.tensor(a.tensors()[0]);
  EXPECT_TRUE(at::equal(w, at::tensor({2.f, 3.f, 4.f})));
  EXPECT_EQ(a.attention_heads("attn"), 4);
  EXPECT_EQ(a.attention_heads(""), std::nullopt);  // Root's code has no such reshape

  const auto half = make_zip(
      {{"data.pkl", pickle_tensor("HalfStorage", 4, 4)}, {"data/0", std::string(8, '\0')}});
  EXPECT_EQ(core::TorchScriptArchive::from_buffer(half).tensors()[0].dtype,
            core::ArchiveDtype::kF16);
}

TEST(UnitArchive, Zip64Directory) {
  const auto zip = make_zip64({{"data.pkl", pickle_tensor("FloatStorage", 4, 2, 2)},
                               {"data/0", floats({1.f, 2.f, 3.f, 4.f})}});
  const auto a = core::TorchScriptArchive::from_buffer(zip, "z64.pt2");
  ASSERT_EQ(a.tensors().size(), 1u);
  EXPECT_TRUE(at::equal(a.tensor(a.tensors()[0]), at::tensor({3.f, 4.f})));
}

TEST(UnitArchive, TruncatedRecordsAndArchives) {
  // A record declaring more bytes than lie before the directory.
  const auto zip =
      make_zip({{"data.pkl", pickle_tensor("FloatStorage", 4, 4)}, {"data/0", floats({1.f, 2.f})}},
               {.declared = {{"data/0", 4096}}});
  expect_format_error([&] { core::TorchScriptArchive::from_buffer(zip, "cut.pt2"); },
                      {"cut.pt2", "data/0' is truncated", "4096 bytes declared"});
  // A storage larger than its record.
  const auto small =
      make_zip({{"data.pkl", pickle_tensor("FloatStorage", 4, 4)}, {"data/0", floats({1.f, 2.f})}});
  expect_format_error([&] { core::TorchScriptArchive::from_buffer(small); },
                      {"tensor 'attn.w'", "storage of 4 Float elements but a record of 8 bytes"});
  // A view reaching past its storage.
  const auto past = make_zip({{"data.pkl", pickle_tensor("FloatStorage", 4, 4, 2)},
                              {"data/0", floats({1.f, 2.f, 3.f, 4.f})}});
  expect_format_error([&] { core::TorchScriptArchive::from_buffer(past); },
                      {"tensor 'attn.w' reaches past its storage"});
  const auto missing = make_zip({{"data.pkl", pickle_tensor("FloatStorage", 4, 4)}});
  expect_format_error([&] { core::TorchScriptArchive::from_buffer(missing); },
                      {"storage record data/0 is missing"});
  // The whole file cut short (the directory at its end is gone).
  expect_format_error([] { core::TorchScriptArchive::open(fixture("broken_truncated.pt2")); },
                      {"truncated", "end-of-central-directory"});
  expect_format_error([] { core::TorchScriptArchive::open(fixture("broken_not_zip.pt2")); },
                      {"no zip signature"});
  expect_format_error(
      [] {
        core::TorchScriptArchive::from_buffer(make_zip({{"x", "y"}}));
      },
      {"no data.pkl record"});
}

TEST(UnitArchive, BadPickles) {
  auto open_with = [](std::string pkl) {
    return [pkl] {
      core::TorchScriptArchive::from_buffer(make_zip({{"data.pkl", pkl}}), "bad.pt2");
    };
  };
  std::string full = pickle_tensor("FloatStorage", 4, 4);
  expect_format_error(open_with(full.substr(0, full.size() - 1)),
                      {"bad.pt2", "data.pkl", "unexpected end of the pickle"});
  expect_format_error(open_with(full.substr(0, 40)), {"data.pkl", "unterminated GLOBAL"});
  expect_format_error(open_with("\x80\x02t."), {"no MARK at byte 2"});
  expect_format_error(open_with("\x80\x02h\x05."), {"unknown memo entry"});
  expect_format_error(open_with("\x80\x02R."), {"stack underflow"});
  expect_format_error(open_with("\x80\x02N."), {"does not hold a module"});
  expect_format_error(open_with("\x80\x02NN."), {"unbalanced stack"});
  expect_format_error(open_with("\x80\x02(" + unicode("storage") + "tQ."),
                      {"persistent id is not a storage reference"});
  expect_format_error(open_with("\x80\x02X\xff\xff\xff\x7f"
                                "abc."),
                      {"string longer"});
}

TEST(UnitArchive, UnknownOpcode) {
  const auto zip = make_zip({{"data.pkl", std::string("\x80\x02\xff.", 4)}});
  expect_format_error([&] { core::TorchScriptArchive::from_buffer(zip, "op.pt2"); },
                      {"op.pt2", "unsupported pickle opcode 0xff at byte 2"});
  // The protocol-4 opcodes torch does not write but Python's pickle would are not guessed at.
  const auto ext = make_zip({{"data.pkl", std::string("\x80\x02\x82\x01.", 5)}});
  expect_format_error([&] { core::TorchScriptArchive::from_buffer(ext); },
                      {"unsupported pickle opcode 0x82"});
}

TEST(UnitArchive, StorageDtypes) {
  const auto dbl = make_zip(
      {{"data.pkl", pickle_tensor("DoubleStorage", 2, 2)}, {"data/0", std::string(16, '\0')}});
  const auto a = core::TorchScriptArchive::from_buffer(dbl);
  EXPECT_EQ(a.tensors()[0].dtype, core::ArchiveDtype::kF64);
  EXPECT_EQ(a.tensor(a.tensors()[0]).scalar_type(), at::kDouble);
  // The same bytes declared as more doubles than they hold.
  const auto big = make_zip(
      {{"data.pkl", pickle_tensor("DoubleStorage", 4, 4)}, {"data/0", std::string(16, '\0')}});
  expect_format_error([&] { core::TorchScriptArchive::from_buffer(big); },
                      {"storage of 4 Double elements but a record of 16 bytes"});
  const auto q = make_zip(
      {{"data.pkl", pickle_tensor("QInt8Storage", 4, 4)}, {"data/0", std::string(4, '\0')}});
  expect_format_error([&] { core::TorchScriptArchive::from_buffer(q); },
                      {"unsupported storage type torch.QInt8Storage"});
  // A wrong (float64) parameter in a real archive reaches the layout check with its dtype.
  const auto ck = core::open_torchscript(fixture("broken_wrong_dtype.pt2"));
  EXPECT_EQ(ck.tensors.at("backbone.ln1.weight").scalar_type(), at::kDouble);
}

TEST(UnitZipCodec, Crc32AgreesWithZlibAndCombines) {
  std::mt19937 rng(7);
  std::vector<std::uint8_t> buf(3 * 1024 * 1024 + 17);
  for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
  const auto zlib_crc = static_cast<std::uint32_t>(::crc32_z(0, buf.data(), buf.size()));
  EXPECT_EQ(core::crc32(buf.data(), buf.size()), zlib_crc) << core::crc32_implementation();
  EXPECT_EQ(core::crc32("123456789", 9), 0xCBF43926u);  // the standard check value
  EXPECT_EQ(core::crc32(nullptr, 0), 0u);
  for (const std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, buf.size()}) {
    const std::uint32_t a = core::crc32(buf.data(), cut);
    const std::uint32_t b = core::crc32(buf.data() + cut, buf.size() - cut);
    EXPECT_EQ(core::crc32_combine(a, b, buf.size() - cut), zlib_crc) << cut;
    EXPECT_EQ(core::crc32(buf.data() + cut, buf.size() - cut, a), zlib_crc) << cut;
  }
}

TEST(UnitZipCodec, InflateRawChecksTheDeclaredSize) {
  std::string plain(100000, '\0');
  for (std::size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<char>((i * 7) % 251);
  const std::string packed = deflate_raw(plain);
  const auto* in = reinterpret_cast<const std::uint8_t*>(packed.data());
  std::vector<std::uint8_t> out(plain.size() + 1);
  EXPECT_EQ(core::inflate_raw(in, packed.size(), out.data(), plain.size()), "");
  EXPECT_EQ(std::memcmp(out.data(), plain.data(), plain.size()), 0);
  EXPECT_NE(core::inflate_raw(in, packed.size(), out.data(), plain.size() - 1).find("more than"),
            std::string::npos);
  EXPECT_NE(core::inflate_raw(in, packed.size(), out.data(), plain.size() + 1).find("ends after"),
            std::string::npos);
  EXPECT_NE(core::inflate_raw(in, packed.size() / 2, out.data(), plain.size()).find("cut short"),
            std::string::npos);
  const std::uint8_t junk[] = {0xff, 0xff, 0xff, 0xff};
  EXPECT_NE(core::inflate_raw(junk, sizeof junk, out.data(), 10).find("damaged"),
            std::string::npos);
  const std::string empty = deflate_raw("");
  EXPECT_EQ(core::inflate_raw(reinterpret_cast<const std::uint8_t*>(empty.data()), empty.size(),
                              nullptr, 0),
            "");
}

TEST(UnitArchive, EveryRecordReadIsCheckedAgainstItsCrc) {
  const std::vector<std::pair<std::string, std::string>> files = {
      {"data.pkl", pickle_tensor("FloatStorage", 4, 4)},
      {"data/0", floats({1.f, 2.f, 3.f, 4.f})},
      {"byteorder", "little"}};
  EXPECT_NO_THROW(core::TorchScriptArchive::from_buffer(make_zip(files), "ok.pt2"));
  // A damaged tensor record, data.pkl and byteorder: each refused, naming the record.
  for (const char* rec : {"data/0", "data.pkl", "byteorder"}) {
    expect_error(
        [&] {
          core::TorchScriptArchive::from_buffer(make_zip(files, {.crc = {{rec, 0x12345678}}}),
                                                "bad.pt2");
        },
        ErrorCode::kChecksumMismatch,
        {"corrupt checkpoint bad.pt2", rec, "CRC-32", "0x12345678", "fetch it again"});
  }
  // One flipped bit in the tensor bytes of a real archive (the fixture; torch.jit.load reads it
  // without complaint).
  expect_error([] { core::open_torchscript(fixture("broken_flipped_byte.pt2")); },
               ErrorCode::kChecksumMismatch, {"broken_flipped_byte.pt2", "data/", "CRC-32"});
  // The check can be switched off (to measure it), but only for tensor records.
  EXPECT_NO_THROW(core::TorchScriptArchive::from_buffer(make_zip(files, {.crc = {{"data/0", 1}}}),
                                                        "x", {.verify_crc = false}));
  EXPECT_THROW(core::TorchScriptArchive::from_buffer(make_zip(files, {.crc = {{"data.pkl", 1}}}),
                                                     "x", {.verify_crc = false}),
               Error);
  // torch.save without CRCs (set_crc32_options(False)) writes 0 with a data descriptor: nothing
  // to check. A 0 without the descriptor bit is a damaged field like any other.
  EXPECT_NO_THROW(
      core::TorchScriptArchive::from_buffer(make_zip(files, {.crc = {{"data/0", 0}}, .flags = 8})));
  EXPECT_THROW(core::TorchScriptArchive::from_buffer(make_zip(files, {.crc = {{"data/0", 0}}})),
               Error);
}

TEST(UnitArchive, DeflatedRecordsAreInflated) {
  const std::vector<std::pair<std::string, std::string>> files = {
      {"data.pkl", pickle_tensor("FloatStorage", 4, 3, 1)},
      {"code/__torch__/m.py", kAttnCode},
      {"data/0", floats({1.f, 2.f, 3.f, 4.f})}};
  const auto a = core::TorchScriptArchive::from_buffer(
      make_zip(files, {.deflated = {"data.pkl", "code/__torch__/m.py", "data/0"}}), "z.pt2");
  EXPECT_EQ(a.find_record("data/0")->method, 8);
  const at::Tensor w = a.tensor(a.tensors()[0]);
  EXPECT_TRUE(at::equal(w, at::tensor({2.f, 3.f, 4.f})));
  EXPECT_EQ(a.attention_heads("attn"), 4);
  // The tensor outlives the archive that inflated it.
  at::Tensor kept;
  {
    const auto b =
        core::TorchScriptArchive::from_buffer(make_zip(files, {.deflated = {"data/0"}}), "z.pt2");
    kept = b.all().at("attn.w");
  }
  EXPECT_TRUE(at::equal(kept, at::tensor({2.f, 3.f, 4.f})));
  // A damaged stream, and a size no DEFLATE stream of that length can reach.
  expect_format_error(
      [&] {
        auto bytes = *make_zip(files, {.deflated = {"data/0"}});
        const std::string name = "archive/data/0";
        const auto at = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
        // The stream's first byte: a final block of the reserved type 3.
        *(at + static_cast<std::ptrdiff_t>(name.size())) = 0x07;
        core::TorchScriptArchive::from_buffer(
            std::make_shared<const std::vector<std::uint8_t>>(std::move(bytes)), "d.pt2");
      },
      {"d.pt2", "cannot inflate record 'data/0'"});
  expect_format_error(
      [&] {
        core::TorchScriptArchive::from_buffer(
            make_zip(files, {.deflated = {"data/0"}, .inflated = {{"data/0", 4000000}}}));
      },
      {"declares 4000000 bytes", "more than DEFLATE can produce"});
  // A whole real archive re-zipped with ZIP_DEFLATED (the fixture; torch.jit.load reads it):
  // the same tensors as the stored original.
  const auto stored = core::open_torchscript(fixture("tiny_a_torchscript.pt2"));
  const auto zipped = core::open_torchscript(fixture("tiny_a_deflated.pt2"), true);
  ASSERT_EQ(stored.tensors.size(), zipped.tensors.size());
  for (const auto& [name, t] : stored.tensors) {
    EXPECT_TRUE(at::equal(zipped.tensors.at(name), t)) << name;
  }
  EXPECT_EQ(zipped.heads_from_graph, 2);
  EXPECT_NE(zipped.module, nullptr);
}

TEST(UnitArchive, HugeSizesAndOffsetsAreRefusedNotOverflowed) {
  // A view of 2^62 x 2^62 elements, and one whose offset lies past its storage.
  std::string p = "\x80\x02";
  p += "c__torch__.m\nRoot\n)\x81}(" + unicode("w");
  p += "ctorch._utils\n_rebuild_tensor_v2\n(";
  p += "(" + unicode("storage") + "ctorch\nFloatStorage\n" + unicode("0") + unicode("cpu") +
       "K\x04tQ";
  p += std::string("K\x00", 2);
  p += std::string("\x8a\x08") + std::string("\x00\x00\x00\x00\x00\x00\x00\x40", 8);
  p += std::string("\x8a\x08") + std::string("\x00\x00\x00\x00\x00\x00\x00\x40", 8) + "\x86";
  p += "K\x01K\x01\x86\x89";
  p += "ccollections\nOrderedDict\n)Rt";
  p += "Rub.";
  expect_format_error(
      [&] {
        core::TorchScriptArchive::from_buffer(
            make_zip({{"data.pkl", p}, {"data/0", floats({1.f, 2.f, 3.f, 4.f})}}));
      },
      {"tensor 'w': its sizes and strides overflow"});
  expect_format_error(
      [&] {
        core::TorchScriptArchive::from_buffer(
            make_zip({{"data.pkl", pickle_tensor("FloatStorage", 4, 0, 9)},
                      {"data/0", floats({1.f, 2.f, 3.f, 4.f})}}));
      },
      {"storage offset 9 past its storage of 4 elements"});
}

// ---- checkpoint bytes in private memory, and dropping those of converted weights -------------

namespace {
std::vector<std::uint8_t> bytes_head(const std::vector<std::uint8_t>& b, std::size_t n) {
  return {b.begin(), b.begin() + static_cast<long>(n)};
}
}  // namespace

TEST(UnitMappedFile, ReleasesPagesOnlyInsideFileMappings) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("sapiens_seg_map_" + std::to_string(::getpid()) + ".bin");
  std::vector<std::uint8_t> bytes(8 * page);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i * 7 + 3);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  {
    const core::MappedFile m = core::map_file(path.string(), "test file");
    ASSERT_EQ(m.size, bytes.size());
    EXPECT_EQ(std::vector<std::uint8_t>(m.data, m.data + m.size), bytes);
    // The bytes are the process's own: the file rewritten and emptied (what `cp` over it does)
    // does not reach them (a shared mapping would change, then fault with SIGBUS).
    std::ofstream(path, std::ios::binary | std::ios::trunc).write("xyz", 3);
    EXPECT_EQ(std::vector<std::uint8_t>(m.data, m.data + m.size), bytes);
    // Whole pages strictly inside the range: an unaligned start skips its partial page.
    EXPECT_EQ(core::release_mapped_pages(m.data + 1, 3 * page), 2 * page);
    EXPECT_EQ(core::release_mapped_pages(m.data, page / 2), 0u);       // no whole page
    EXPECT_EQ(core::release_mapped_pages(m.data + page, m.size), 0u);  // runs past the mapping
    EXPECT_EQ(std::vector<std::uint8_t>(m.data, m.data + page), bytes_head(bytes, page));
  }
  // Released pages of an unchanged file read back its bytes (what a second network built from
  // the same tensors reads).
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  {
    const core::MappedFile m = core::map_file(path.string(), "test file");
    EXPECT_EQ(core::release_mapped_pages(m.data, m.size), m.size);
    EXPECT_EQ(std::vector<std::uint8_t>(m.data, m.data + m.size), bytes);
  }
  // Other memory is never touched (MADV_DONTNEED would zero it).
  std::vector<std::uint8_t> heap(bytes);
  EXPECT_EQ(core::release_mapped_pages(heap.data(), heap.size()), 0u);
  EXPECT_EQ(heap, bytes);
  // After the map is gone its range is not a mapping any more.
  std::filesystem::remove(path);
}
