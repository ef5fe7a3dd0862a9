// fastbb's device entry points on raw pointers (no LibTorch types), called by fastbb.cpp after
// its shape, dtype and device checks. Every launch is asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common.hpp"

namespace sapiens_seg::kernels::fastbb {

// y[r, :] = (x[r, :] - mean_r) * rstd_r * w + b for `rows` rows of `cols` contiguous elements,
// with mean and variance (biased) in fp32. x and y may be the same buffer.
void launch_layer_norm(DType t, const void* x, const void* w, const void* b, void* y,
                       std::int64_t rows, std::int64_t cols, float eps, cudaStream_t stream);

// x = x * Phi(x) in place (exact erf GELU, evaluated in fp32), over n contiguous elements.
void launch_gelu_erf(DType t, void* x, std::int64_t n, cudaStream_t stream);

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w, in fp32, rounded to the element type
// once. x and y may be the same buffer.
void launch_rms_norm(DType t, const void* x, const void* w, void* y, std::int64_t rows,
                     std::int64_t cols, float eps, cudaStream_t stream);

// out[r, j] = silu(h[r, j]) * h[r, F + j] for h [rows, 2F] and out [rows, F], both contiguous.
void launch_swiglu(DType t, const void* h, void* out, std::int64_t rows, std::int64_t F,
                   cudaStream_t stream);

// In place on qkv [rows, slots, D] (contiguous): heads 0..q_heads-1 take RMSNorm with q_w,
// heads q_heads..q_heads+k_heads-1 with k_w (over the first hd elements), then the bfloat16
// rounding and, for rows whose token index (row % tokens) is >= prefix, the 2D RoPE rotation by
// the bfloat16 tables cos_t/sin_t [tokens - prefix, hd].
void launch_qk_norm_rope(DType t, void* qkv, const void* q_w, const void* k_w, const void* cos_t,
                         const void* sin_t, std::int64_t rows, int q_heads, int k_heads, int slots,
                         int D, int hd, int tokens, int prefix, float eps, cudaStream_t stream);

// x[r, c] = x[r, c] + y[r, c] * gamma[c] over [rows, C] contiguous x and y (product and sum
// each rounded to the element type).
void launch_scale_add(DType t, void* x, const void* y, const void* gamma, std::int64_t rows,
                      std::int64_t C, cudaStream_t stream);

}  // namespace sapiens_seg::kernels::fastbb
