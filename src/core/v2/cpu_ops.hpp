// Sapiens2's elementwise steps on the CPU for bfloat16 and float16 maps, one pass each: RMSNorm
// and the SwiGLU gate. Both keep LibTorch's arithmetic (and its roundings) step for step.
//
// RMSNorm.
// LibTorch 2.15 runs at::rms_norm on the CPU as a chain of elementwise ops: the map widened to
// float32, then pow, mean, add, rsqrt, two multiplies and the narrowing, each a pass over a fresh
// tensor. On a 2-core Sapphire Rapids-class Xeon that took 8.7 ms for one [3081, 1024] bfloat16
// map, and about 8 ms for the q norm's narrower rows (two such full-width norms per block, plus
// the q and k norms): by those one-off timings some 15 % of a 4.4 s Sapiens2 0.4b bfloat16 call
// once AMX made its GEMMs cheap. This computes the same arithmetic row by row,
// y = round((x * rsqrt(mean(x^2) + eps)) * w) in float32 with one rounding to the map's dtype
// (checked against at::rms_norm's bytes in the tests). float32 maps keep at::rms_norm: the
// network's float32 path is the authors' op sequence, whose bf16 RoPE rounding makes any
// reordering visible.
#pragma once

#include <ATen/core/Tensor.h>

#include "../cpu/cpuid.hpp"

namespace sapiens_seg::core::v2 {

// x: CPU, bfloat16 or float16, last dim D contiguous, rows anywhere else contiguous (any shape
// whose view as [-1, D] exists); w: [D] of x's dtype. Returns a new contiguous tensor of x's
// shape. The sum of squares is taken in float32 in another order than LibTorch's, so a result
// may round to the neighbouring value where LibTorch's lies on a rounding boundary.
at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& w, double eps,
                        VecIsa isa = VecIsa::kAuto);

// SwiGLU's gate on the w12 projection's output g [rows, 2F] (CPU, bfloat16 or float16,
// contiguous): silu(g[:, :F]) * g[:, F:], as the module computes it (at::silu, then at::mul: each
// rounded to the dtype), into out [rows, F] (contiguous, same dtype; may be a view of a larger
// buffer's leading rows). LibTorch took three passes (the silu on a strided half, a fresh
// tensor, the product) over maps of 25 MB per block at 1024x768; this is one.
void swiglu_cpu(const at::Tensor& out, const at::Tensor& g, VecIsa isa = VecIsa::kAuto);

}  // namespace sapiens_seg::core::v2
