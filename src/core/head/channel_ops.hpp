// The CPU head's passes over [pixels, channels] maps that are not GEMMs: the per-channel sums
// behind InstanceNorm's statistics, and normalise + SiLU. Each is one multi-threaded pass over the
// map (one read, and for norm_silu one write), in float32 arithmetic for every storage dtype, with
// AVX-512 or AVX2 loops compiled per function and picked by what the CPU runs (`isa`: VecIsa in
// core/cpu/cpuid.hpp).
//
// Why by hand: LibTorch needs two passes for normalise + SiLU in float32 (addcmul, then silu_) and
// four in bfloat16 or float16 (its elementwise kernels take mixed bfloat16/float32 operands
// through a scalar path, so the map is widened to float32 first and narrowed after), and its
// column reductions several more for the statistics; on the head's maps (600 MB at v1's last
// stage in float32), which fit no cache, every pass costs about as much as the arithmetic.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "../cpu/cpuid.hpp"

namespace sapiens_seg::core::head {

// out = silu(x * scale + shift), scale and shift per channel (x's last dim, float32 [C] on the
// CPU). x and out: CPU, float32, bfloat16 or float16, the same dtype and shape, up to 3 dims, the
// last contiguous (any strides elsewhere: out may be a view into a padded map); out may be x.
// The result is rounded to the dtype once, from float32.
void norm_silu(const at::Tensor& out, const at::Tensor& x, const at::Tensor& scale,
               const at::Tensor& shift, VecIsa isa = VecIsa::kAuto);

// Per-channel sums of d = x - shift[c] and of d^2 over `count` pixels of C = x.size(-1) values,
// pixel p at x.data + (p / group) * group_stride + (p % group) * C elements (groups skip padding
// columns). x: CPU, float32, bfloat16 or float16, its pixels as described (the tensor's own
// shape and strides are not used beyond its dtype, data pointer and last dim). Sums are taken in
// float32 over blocks of 64 pixels and in float64 across blocks; s1 and s2 ([C] each) are
// overwritten.
void shifted_sums(const at::Tensor& x, int64_t count, int64_t group, int64_t group_stride,
                  const float* shift, double* s1, double* s2, VecIsa isa = VecIsa::kAuto);

}  // namespace sapiens_seg::core::head
