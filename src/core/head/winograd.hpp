// The head's transposed convolutions (k4, s2, p1, no bias) by Winograd's minimal filtering,
// F(2x2, 2x2), in float32.
//
// A stride-2 transposed convolution with a 4x4 kernel is four 2x2 convolutions of the input, one
// per output parity (py, px) (see cpu_head.cpp's deconv_gemm). Each is computed here on 2x2
// output tiles from 3x3 input tiles with 9 products per tile instead of 16: the input tile d and
// the 2x2 filter g are transformed to V = B'dB and U = GgG' (3x3 each, per channel), the products
// are 9 GEMMs [tiles, Cin] x [Cin, Cout] (one per element of the 3x3), and Y = A'MA gives the 2x2
// outputs. With the interpolation points 0, 1 and infinity every transform is additions and
// subtractions of pairs (B' = [1 -1 0; 0 1 0; 0 -1 1], G = [1 0; 1 1; 0 1], A' = [1 1 0; 0 1 1]),
// so the result differs from the direct sums only in rounding: the GEMM work of a deconvolution
// falls to 9/16, for transforms that are passes over cache-sized blocks.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>

namespace sapiens_seg::core::head {

// The transformed filters of one ConvTranspose2d weight [in, out, 4, 4] (any float dtype, CPU):
// [4 parities (py * 2 + px), 9 (3x3, row-major), in, out], float32, computed in float64.
at::Tensor winograd_deconv_filters(const at::Tensor& weight);

// Output rows [row0, row0 + rows) of the 2H x 2W map are final (called in order, once each).
using RowsDone = std::function<void(int64_t row0, int64_t rows)>;

// y = ConvTranspose2d(x) for x of H x W pixels. `padded`: float32 [(H + 3) * (W + 3), Cin], x at
// rows 1..H and columns 1..W of a (W + 3)-wide grid, zeros around it. `filters` from
// winograd_deconv_filters; `y`: float32 [2H * 2W, Cout], contiguous, overwritten. The work goes in
// bands of tile rows; `done` sees each band's output rows once all four parities have landed
// (while they are still in cache).
void winograd_deconv(const at::Tensor& padded, int64_t H, int64_t W, const at::Tensor& filters,
                     const at::Tensor& y, const RowsDone& done);

}  // namespace sapiens_seg::core::head
