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

}  // namespace sapiens_seg::kernels::fastbb
