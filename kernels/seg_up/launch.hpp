// seg_up's device entry points on raw pointers (no LibTorch types). Activation maps are
// channels-last matrices: pixel p = row * width + column, one row of `C` channels each.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common.hpp"

namespace sapiens_seg::kernels::seg_up {

// dst viewed as a zero-bordered [(H+2) x (W+2)] map (plus two spare rows, see head.cpp):
// interior pixel (i, j) = silu(src(i, j) * scale + shift) per channel, or src itself when scale
// is null. The border is not written (the caller zeroes dst first).
void launch_pad_norm_silu(DType t, const void* src, const float* scale, const float* shift,
                          void* dst, std::int64_t H, std::int64_t W, std::int64_t C,
                          cudaStream_t stream);

// One output parity of a stride-2 transposed convolution: s holds H rows of Wp >= W pixels
// (columns >= W are padding garbage); pixel (i, j) goes to y(2i + py, 2j + px), y being 2H x 2W.
void launch_scatter_parity(DType t, const void* s, void* y, std::int64_t H, std::int64_t W,
                           std::int64_t Wp, std::int64_t C, int py, int px, cudaStream_t stream);

// InstanceNorm statistics of x [P, C] per channel (biased variance, eps) as the affine form
// y = x * scale + shift. `partials` is scratch of channel_stats_scratch(P, C) floats.
std::int64_t channel_stats_scratch(std::int64_t P, std::int64_t C);
void launch_channel_stats(DType t, const void* x, std::int64_t P, std::int64_t C, float eps,
                          float* partials, float* scale, float* shift, cudaStream_t stream);

// x = silu(x * scale + shift) per channel, in place, over [P, C].
void launch_norm_silu(DType t, void* x, const float* scale, const float* shift, std::int64_t P,
                      std::int64_t C, cudaStream_t stream);

// labels[H, W] = argmax over the first `classes` channels of the bilinear resize
// (align_corners=False) of logits [h, w] (row stride `ld` >= classes elements per pixel).
void launch_upsample_argmax(DType t, const void* logits, std::int64_t h, std::int64_t w,
                            int classes, std::int64_t ld, std::uint8_t* labels, std::int64_t H,
                            std::int64_t W, cudaStream_t stream);

}  // namespace sapiens_seg::kernels::seg_up
