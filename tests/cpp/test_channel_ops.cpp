// The CPU head's hand-vectorised passes (core/head/channel_ops) on every instruction set this CPU
// runs, against LibTorch's own ops: normalise + SiLU against addcmul + silu in float32 (rounded
// once to the storage dtype), the statistics' sums against float64 reductions.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/head/channel_ops.hpp"
#include "sapiens_seg/error.hpp"
#include "test_util.hpp"

using namespace sapiens_seg;
using core::VecIsa;

namespace {

std::vector<VecIsa> isas_here() {
  std::vector<VecIsa> out;
  for (const VecIsa i : {VecIsa::kAuto, VecIsa::kScalar, VecIsa::kAvx2, VecIsa::kAvx512}) {
    if (core::vec_isa_runs(i)) out.push_back(i);
  }
  return out;
}

// LibTorch's normalise + SiLU in float32, rounded once to `dtype`.
at::Tensor reference(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                     at::ScalarType dtype) {
  return at::silu(x.to(at::kFloat) * scale + shift).to(dtype);
}

// Channel counts: the heads' (768, 64), a vector and a half (24: the AVX-512 tail), odd (37),
// fewer than one AVX2 vector (5).
const int64_t kChannels[] = {768, 64, 24, 37, 5};

}  // namespace

TEST(UnitChannelOps, NormSiluMatchesLibTorchOnEveryIsa) {
  at::manual_seed(11);
  for (const int64_t C : kChannels) {
    const at::Tensor scale = at::rand({C}) * 2 + 0.1, shift = at::randn({C}) * 3;
    // Values over SiLU's whole range, its tails included (|z| up to ~60).
    const at::Tensor x32 = at::randn({3, 7, C}) * 8;
    for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const at::Tensor x = x32.to(dtype);
      const at::Tensor ref = reference(x, scale, shift, dtype).to(at::kFloat);
      for (const VecIsa isa : isas_here()) {
        const at::Tensor y = at::empty_like(x);
        core::head::norm_silu(y, x, scale, shift, isa);
        const at::Tensor yf = y.to(at::kFloat);
        // float32: the kernel's exp is within a few ulp of LibTorch's; the narrow dtypes may round
        // a float32 result that differs in its last bits to the neighbouring value (one ulp of
        // the dtype: 2^-8 relative for bfloat16, 2^-11 for float16).
        const double rel = dtype == at::kFloat      ? 2e-6
                           : dtype == at::kBFloat16 ? 1.0 / 128
                                                    : 1.0 / 1024;
        const at::Tensor bound = ref.abs() * rel + 1e-6;
        const bool ok = (yf - ref).abs().le(bound).all().item<bool>();
        EXPECT_TRUE(ok) << "C " << C << " " << c10::toString(dtype) << " " << core::to_string(isa)
                        << ": max |diff| " << (yf - ref).abs().max().item<double>();
        // ... which is rare: in the narrow dtypes almost every value is the reference's to the
        // bit (a conversion that truncated instead of rounding to nearest would miss about half).
        if (dtype != at::kFloat) {
          const double same = y.eq(ref.to(dtype)).to(at::kFloat).mean().item<double>();
          EXPECT_GE(same, 0.99) << "C " << C << " " << c10::toString(dtype) << " "
                                << core::to_string(isa);
        }
      }
    }
  }
}

TEST(UnitChannelOps, VectorIsasAgreeToTheBit) {
  // The AVX2 and AVX-512 loops take the same steps (their own exp), so their results are equal.
  if (!core::vec_isa_runs(VecIsa::kAvx2) || !core::vec_isa_runs(VecIsa::kAvx512)) {
    GTEST_SKIP() << "needs a CPU with both AVX2 and AVX-512";
  }
  at::manual_seed(12);
  const int64_t C = 37;
  const at::Tensor scale = at::rand({C}) + 0.5, shift = at::randn({C});
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor x = (at::randn({50, C}) * 10).to(dtype);
    const at::Tensor a = at::empty_like(x), b = at::empty_like(x);
    core::head::norm_silu(a, x, scale, shift, VecIsa::kAvx2);
    core::head::norm_silu(b, x, scale, shift, VecIsa::kAvx512);
    EXPECT_TRUE(at::equal(a, b)) << c10::toString(dtype);
  }
}

TEST(UnitChannelOps, NormSiluWritesStridedViewsAndInPlace) {
  at::manual_seed(13);
  const int64_t H = 5, W = 6, C = 40;
  const at::Tensor scale = at::rand({C}) + 0.5, shift = at::randn({C});
  const at::Tensor x = at::randn({H, W, C});
  const at::Tensor ref = reference(x, scale, shift, at::kFloat);
  for (const VecIsa isa : isas_here()) {
    // The interior of a map padded by one pixel, as the deconvolution's input is laid out: the
    // padding must stay as it was.
    const at::Tensor padded = at::full({H + 2, W + 2, C}, 7.0f);
    const at::Tensor interior = padded.slice(0, 1, H + 1).slice(1, 1, W + 1);
    core::head::norm_silu(interior, x, scale, shift, isa);
    EXPECT_TRUE(at::allclose(interior, ref, 1e-5, 1e-6)) << core::to_string(isa);
    EXPECT_EQ(padded.eq(7.0f).sum().item<int64_t>(), ((H + 2) * (W + 2) - H * W) * C);
    // In place.
    const at::Tensor y = x.clone();
    core::head::norm_silu(y, y, scale, shift, isa);
    EXPECT_TRUE(at::allclose(y, ref, 1e-5, 1e-6)) << core::to_string(isa);
  }
}

TEST(UnitChannelOps, NormSiluSpecialValues) {
  const at::Tensor scale = at::ones({16}), shift = at::zeros({16});
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor x = at::tensor({0.0f, -0.0f, 1.0f, -1.0f, 20.0f, -20.0f, 87.0f, -87.0f, 100.0f,
                                   -100.0f, 1e-30f, -1e-30f, inf, nan, 3e38f, -5.0f});
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const VecIsa isa : isas_here()) {
      const at::Tensor xd = x.to(dtype);
      const at::Tensor y = at::empty_like(xd);
      core::head::norm_silu(y, xd, scale, shift, isa);
      const at::Tensor yf = y.to(at::kFloat);
      const std::string what = std::string(c10::toString(dtype)) + " " + core::to_string(isa);
      EXPECT_TRUE(std::isnan(yf[13].item<float>())) << what;  // NaN stays NaN (bf16: 0x7FC0)
      EXPECT_EQ(yf[12].item<float>(), inf) << what;
      EXPECT_EQ(yf[0].item<float>(), 0.0f) << what;
      EXPECT_EQ(yf[4].item<float>(), reference(xd, scale, shift, at::kFloat)[4].item<float>())
          << what;
      // Large negative inputs vanish (silu(-100) is about -4e-42: zero or a subnormal).
      EXPECT_LE(std::abs(yf[9].item<float>()), 1e-30f) << what;
      EXPECT_LE(yf[9].item<float>(), 0.0f) << what;
      const at::Tensor finite = at::isfinite(x.to(dtype).to(at::kFloat));
      const at::Tensor ref = reference(xd, scale, shift, at::kFloat);
      EXPECT_TRUE(at::allclose(yf.masked_select(finite), ref.masked_select(finite), 1e-2, 1e-6))
          << what;
    }
  }
}

TEST(UnitChannelOps, ShiftedSumsMatchFloat64OnEveryIsa) {
  at::manual_seed(14);
  for (const int64_t C : kChannels) {
    // 300 pixels in groups of 7 with 2 pixels of padding between groups (the deconvolution's
    // output rows): the padding holds huge values that must not be read.
    const int64_t count = 300, group = 7, pad = 2;
    const int64_t groups = (count + group - 1) / group;
    at::Tensor store = at::full({groups, group + pad, C}, 1e30f);
    const at::Tensor vals = at::randn({groups, group, C}) * 2 + 50;  // |mean| >> std
    store.narrow(1, 0, group).copy_(vals);
    const at::Tensor used = vals.view({-1, C}).narrow(0, 0, count);
    std::vector<float> shift(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) shift[static_cast<size_t>(c)] = 49.0f + 0.01f * float(c);
    const at::Tensor sh = at::from_blob(shift.data(), {C}, at::kFloat);
    for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const at::Tensor s = store.to(dtype);
      const at::Tensor d = used.to(dtype).to(at::kDouble) - sh.to(at::kDouble);
      const at::Tensor r1 = d.sum(0), r2 = (d * d).sum(0);
      for (const VecIsa isa : isas_here()) {
        std::vector<double> s1(static_cast<size_t>(C)), s2(static_cast<size_t>(C));
        core::head::shifted_sums(s, count, group, (group + pad) * C, shift.data(), s1.data(),
                                 s2.data(), isa);
        const at::Tensor a1 = at::tensor(s1, at::kDouble), a2 = at::tensor(s2, at::kDouble);
        EXPECT_TRUE(at::allclose(a1, r1, 1e-5, 1e-3))
            << C << " " << c10::toString(dtype) << " " << core::to_string(isa);
        EXPECT_TRUE(at::allclose(a2, r2, 1e-5, 1e-3))
            << C << " " << c10::toString(dtype) << " " << core::to_string(isa);
      }
    }
  }
}

TEST(UnitChannelOps, RefusesWhatItCannotRun) {
  const at::Tensor scale = at::ones({8}), shift = at::zeros({8});
  const at::Tensor x = at::randn({4, 8});
  test::expect_error(
      [&] {
        core::head::norm_silu(at::empty({4, 8}, at::kDouble), x.to(at::kDouble), scale, shift);
      },
      ErrorCode::kInvalidInput, {"float32, bfloat16 or float16"});
  test::expect_error(
      [&] {
        core::head::norm_silu(at::empty({4, 8}), x, at::ones({7}), shift);
      },
      ErrorCode::kInvalidInput, {"scale"});
  test::expect_error(
      [&] {
        core::head::norm_silu(at::empty({4, 8}, at::kBFloat16), x, scale, shift);
      },
      ErrorCode::kInvalidInput, {"shape and dtype"});
  test::expect_error(
      [&] {
        core::head::norm_silu(at::empty({8, 4}).t(), x, scale, shift);
      },
      ErrorCode::kInvalidInput, {"contiguous last dim"});
  for (const VecIsa isa : {VecIsa::kAvx2, VecIsa::kAvx512}) {
    if (core::vec_isa_runs(isa)) continue;
    test::expect_error(
        [&] {
          core::head::norm_silu(at::empty({4, 8}), x, scale, shift, isa);
        },
        ErrorCode::kInvalidInput, {"cannot run on this CPU"});
  }
}
