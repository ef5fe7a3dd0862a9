// LibTorch's own float32 CPU arithmetic, reproduced step for step, so that a pass the library
// fuses gives the bits of the LibTorch op sequence it replaces.
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
//  - SiLU: x / (1 + exp(-x)); in whole pairs of vectors exp is SLEEF's expf (u10, the function
//    LibTorch's Vectorized<float>::exp calls, from LibTorch's own library), and the elements past
//    the last pair take the scalar std::exp. Which elements those are depends on how LibTorch's
//    TensorIterator splits the map between threads (swiglu_range below).
//  - everything else here (products, sums of two terms, the division, sqrt, bf16 rounding) is one
//    IEEE-rounded operation per step, the same in every build; the file is compiled without fused
//    multiply-adds so that none is contracted.
//
// The tests (tests/cpp/test_fused_f32.cpp) hold every function to LibTorch's ops bit for bit, in
// each of the three builds (ctest runs them again under ATEN_CPU_CAPABILITY=avx2 and =default).
#pragma once

#include <cstdint>

namespace sapiens_seg::core::cpu::aten_f32 {

enum class Isa { kDefault, kAvx2, kAvx512 };
const char* to_string(Isa isa);

// LibTorch's build for this process (at::get_cpu_capability()), read once.
Isa libtorch_isa();

// LibTorch's Vectorized<float>::size() in that build: 8, 8 or 16.
int64_t lanes(Isa isa);

// The element grain LibTorch's TensorIterator splits elementwise work by (at::internal::GRAIN_SIZE).
inline constexpr int64_t kGrain = 32768;

// Row kernels of one build. Rows are contiguous floats of length n; bf16 tables are raw bits.
struct Kernels {
  // at::pow(x, 2).sum(-1) of one row: LibTorch's cascade order.
  float (*sum_sq)(const float* x, int64_t n);
  // at::rms_norm(x, {n}, w, eps) of one row into y (y may be x): (x * rsqrt(sum_sq / n + eps)) * w.
  void (*rms_norm)(const float* x, const float* w, float eps, float* y, int64_t n);
  // z = x + p * g (g null: z = x + p), then, where w is not null, y = rms_norm(z) as above. z may be
  // x or p; y must be neither.
  void (*add_rms_norm)(const float* x, const float* p, const float* g, float* z, const float* w,
                       float eps, float* y, int64_t n);
  // out = silu(a) * b for a segment of n elements that LibTorch's vectorized loop runs as one
  // piece: pairs of vectors, then the rest with the scalar formula.
  void (*silu_mul)(const float* a, const float* b, float* out, int64_t n);
  // One head's row of q or k as Sapiens2's module treats it: y = rms_norm(x) (float32), rounded
  // to bf16; with tables, RoPE in bf16 on it (t * cos + rotate_half(t) * sin, each product and
  // the sum rounded to bf16); widened to float32 into out. cos, sin: bf16 bits of this token's
  // rows, or null for a token that is only rounded (the cls and register tokens).
  void (*qk_norm_rope)(const float* x, const float* w, float eps, const std::uint16_t* cos,
                       const std::uint16_t* sin, float* out, int64_t n);
};
const Kernels& kernels(Isa isa);

// Maximum row length qk_norm_rope takes (head dims are 64 to 80 in the released models).
inline constexpr int64_t kMaxHeadDim = 512;

}  // namespace sapiens_seg::core::cpu::aten_f32
