// LibTorch's own float32 CPU arithmetic (and its bf16 ops, which compute in float32), reproduced
// step for step, so that a pass the library fuses gives the bits of the LibTorch op sequence it
// replaces.
//
// LibTorch runs its elementwise and reduction kernels in one of three builds, picked once per
// process (at::get_cpu_capability(); ATEN_CPU_CAPABILITY can lower it): DEFAULT (its generic
// Vectorized<float> of 8 lanes, each op a scalar loop), AVX2 (8 lanes) or AVX512 (16 lanes). What
// changes between them, and so what these loops follow:
//
//  - sums: at::sum over a contiguous row (the `mean` inside at::rms_norm) is its "cascade" sum:
//    vector accumulators over the row's whole vectors in four interleaved chains, cascaded in
//    levels of 16 steps, combined chain after chain, then the elements past the last whole vector
//    and the lanes one by one. Rows shorter than a vector take the same cascade over scalars. The
//    order depends on the lane count, so the lanes follow LibTorch's build.
//  - SiLU: x / (1 + exp(-x)); in whole pairs of vectors (Vectorized<float> or <BFloat16>) exp is
//  SLEEF's expf (u10, the function
//    LibTorch's Vectorized<float>::exp calls, from LibTorch's own library), and the elements past
//    the last pair take the scalar std::exp. Which elements those are depends on how LibTorch's
//    TensorIterator splits the map between threads (swiglu_range below).
//  - everything else here (products, sums of two terms, the division, sqrt, bf16 rounding) is one
//    IEEE-rounded operation per step, the same in every build; the file is compiled without fused
//    multiply-adds so that none is contracted.
//
// The same steps on bf16 maps are LibTorch's bf16 kernels (each op widened to float32 and its
// result rounded to bf16). The tests (tests/cpp/test_fused_passes.cpp) hold every function to
// LibTorch's ops bit for bit, in each of the three builds (ctest runs them again under
// ATEN_CPU_CAPABILITY=avx2 and =default).
#pragma once

#include <cstdint>

namespace sapiens_seg::core::cpu::aten_arith {

enum class Isa { kDefault, kAvx2, kAvx512 };
const char* to_string(Isa isa);

// LibTorch's build for this process (at::get_cpu_capability()), read once.
Isa libtorch_isa();

// LibTorch's Vectorized<float>::size() in that build: 8, 8 or 16.
int64_t lanes(Isa isa);

// The element grain LibTorch's TensorIterator splits elementwise work by
// (at::internal::GRAIN_SIZE).
inline constexpr int64_t kGrain = 32768;

// Row kernels of one build, over rows of S: float (float32 maps) or std::uint16_t (bf16 maps as raw
// bits; each op then computes in float32 from the widened operands and rounds its result to bf16,
// as LibTorch's bf16 kernels do). Rows are contiguous; tables are bf16 bits.
template <class S>
struct Kernels {
  // at::pow(x.to(float), 2).sum(-1) of one row: LibTorch's cascade order.
  float (*sum_sq)(const S* x, int64_t n);
  // at::rms_norm(x, {n}, w, eps) of one row into y (y may be x): (x * rsqrt(sum_sq / n + eps)) *
  // w in float32, rounded once to the dtype.
  void (*rms_norm)(const S* x, const S* w, float eps, S* y, int64_t n);
  // z = x + p.mul(g) (g null: z = x + p), each op rounded to the dtype, then, where w is not
  // null, y = rms_norm(z) as above. z may be x or p; y must be neither.
  void (*add_rms_norm)(const S* x, const S* p, const S* g, S* z, const S* w, float eps, S* y,
                       int64_t n);
  // out = silu(a).mul(b) for a run of n elements that LibTorch's vectorized loop takes as one
  // piece: whole pairs of its vectors (Vectorized<S>), then the rest with the scalar formula.
  void (*silu_mul)(const S* a, const S* b, S* out, int64_t n);
  // One head's row of q or k as Sapiens2's module treats it: y = rms_norm(x), rounded to bf16;
  // with tables, RoPE in bf16 on it (t * cos + rotate_half(t) * sin, each product and the sum
  // rounded to bf16); stored in the dtype (exactly: the values are bf16). cos, sin: bf16 bits of
  // this token's rows, or null for a token that is only rounded (the cls and register tokens).
  void (*qk_norm_rope)(const S* x, const S* w, float eps, const std::uint16_t* cos,
                       const std::uint16_t* sin, S* out, int64_t n);
};
const Kernels<float>& kernels(Isa isa);
const Kernels<std::uint16_t>& kernels_bf16(Isa isa);

// Maximum row length qk_norm_rope takes (head dims are 64 to 80 in the released models).
inline constexpr int64_t kMaxHeadDim = 512;

}  // namespace sapiens_seg::core::cpu::aten_arith
