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

// ---- float32 and bf16: the module's op sequences fused, bit for bit -----------------------------
//
// The float32 network must keep the authors' module's roundings exactly: its bf16 RoPE turns any
// float32 ulp of difference into whole bf16 steps a few blocks later. Each pass below replaces a
// sequence of LibTorch ops with one pass over the map that computes the same roundings in the
// same order, in LibTorch's own build for this process (cpu/aten_arith.hpp says what that takes),
// and is held to that sequence bit for bit by tests/cpp/test_fused_passes.cpp. Maps are CPU float32
// or bfloat16 (each op of a bf16 sequence computed in float32 and rounded to bf16, as LibTorch's
// bf16 kernels do), contiguous; every operand, weights included, in the map's dtype.

// at::rms_norm(x, {D}, w, eps) into y: x and y [..., D], the same shape; y may be x. Replaces
// pow, sum, div_, add_, rsqrt, two mul passes (and for bf16 the widening and narrowing copies).
void fused_rms_norm(const at::Tensor& y, const at::Tensor& x, const at::Tensor& w, double eps);

// z = x + p.mul(gamma) (x + p where gamma is undefined), then, where w is defined, h =
// at::rms_norm(z, {D}, w, eps): the residual add of a block and the next block's (or branch's)
// norm in one pass. x, p, z, h [..., D], the same shape; z may be x or p, h neither.
void fused_add_rms_norm(const at::Tensor& z, const at::Tensor& x, const at::Tensor& p,
                        const at::Tensor& gamma, const at::Tensor& w, double eps,
                        const at::Tensor& h);

// Sapiens2's q or k from its projection proj [B, N, heads * hd] (rows contiguous): per head
// at::rms_norm over hd (w [hd]), then, as the module's RoPE does, the map rounded to bf16,
// t * cos + rotate_half(t) * sin in bf16 on the tokens from `pre` on (cos, sin: bf16 [N - pre,
// hd]), and back to the map's dtype; written into out [B, heads * repeat, N, hd], each head
// `repeat` times in a row (repeat_interleave over the heads, as grouped-query attention expands
// k). out's rows of hd are contiguous, its other strides free: q is written token-major ([B, N,
// heads, hd] in memory, viewed transposed), so that LibTorch's attention, which lays its output
// out like q, returns the [B, N, heads * hd] rows the output projection reads without a copy.
// Replaces about a dozen passes and copies.
void fused_qk_norm_rope(const at::Tensor& out, const at::Tensor& proj, int64_t heads,
                        const at::Tensor& w, double eps, const at::Tensor& cos,
                        const at::Tensor& sin, int64_t pre, int64_t repeat);

// at::silu(g[:, :F]).mul(g[:, F:]) into out [rows, F] (may be a view of a larger buffer's leading
// rows) from g [rows, 2F]: one pass where LibTorch made two over a fresh map. LibTorch's SiLU
// takes SLEEF's exp in whole pairs of vectors and std::exp elsewhere, and which elements are
// "elsewhere" depends on how its TensorIterator splits the map between threads; this splits it
// the same way (at::parallel_for over the elements, the grain of TensorIterator), so the bits
// also match at every thread count.
void fused_swiglu(const at::Tensor& out, const at::Tensor& g);

// Columns [col, col + w) of what fused_swiglu(out, [G | U]) writes, from those columns of the gate
// half, g [rows, w], and of the other half, u [rows, w] (both contiguous); out [rows, F] is the
// whole contiguous map. Each element takes the exp (SLEEF's in pairs of vectors or the scalar
// tail's) that it takes in the whole map's pass at this thread count, so that the chunks together
// give the whole pass's bits: what lets the MLP compute w12 a pair of column chunks at a time.
void fused_swiglu_columns(const at::Tensor& out, const at::Tensor& g, const at::Tensor& u,
                          int64_t col);

}  // namespace sapiens_seg::core::v2
