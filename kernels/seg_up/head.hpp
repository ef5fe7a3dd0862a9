// seg_up: the decoder head of both families (v1's VitHead: three deconvolutions of one width and
// three 1x1 convolutions; Sapiens2's: four deconvolutions of falling widths and two 1x1
// convolutions) and the fused bilinear upsample + argmax.
//
// The head runs channels-last ([pixels, channels] matrices), so every layer is a GEMM:
//  - ConvTranspose2d(k4, s2, p1) is four 2x2 sub-pixel convolutions, one per output parity
//    (py, px): output pixel (2i+py, 2j+px) reads input (i+dy, j+dx) through kernel tap (ky, kx)
//    for the two (dy, ky) pairs of kTaps[py] and the two (dx, kx) of kTaps[px]. With the input
//    stored zero-bordered as rows of width W+2, each tap is one GEMM over a contiguous block of
//    rows at a constant offset (tap_row_offset), and the four taps of a parity accumulate in
//    the GEMM (beta = 1). The GEMMs run over bands of input rows (deconv_band_rows), and a
//    scatter kernel places each band of the parity plane;
//  - InstanceNorm + SiLU is never a separate pass over a map: the statistics are reduced once
//    per map (fp32 per chunk, fp64 across chunks), and normalise + SiLU is applied where the next
//    layer reads the map (into the next deconvolution's zero-bordered input, or in place before
//    a 1x1 convolution);
//  - the 1x1 convolutions run in row tiles through one scratch tile, so the three 768-channel
//    maps at 512x384 share one buffer (a convolution that changes the width gets a new map);
//  - the classifier's output channels are padded to a multiple of 8 (zero rows), which keeps
//    its rows 16-byte aligned for cuBLASLt; the argmax reads only the real classes.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

namespace sapiens_seg::kernels::fastbb {
class Gemm;
}

namespace sapiens_seg::kernels::seg_up {

// Output parity -> its two (input offset, kernel tap) pairs, for rows (py) and columns (px).
// From out = 2 * in - 1 + tap: even outputs take (0, 1) and (-1, 3), odd ones (0, 2) and (1, 0).
inline constexpr int kTaps[2][2][2] = {{{0, 1}, {-1, 3}}, {{0, 2}, {1, 0}}};

// First row of the tap (dy, dx) block in the zero-bordered input of row width Wp = W + 2.
constexpr std::int64_t tap_row_offset(int dy, int dx, std::int64_t Wp) {
  return (1 + dy) * Wp + (1 + dx);
}

// Rows of the zero-bordered input: (H+2) rows of Wp, plus two spare rows, because the block of
// the last tap (offset 2 * Wp + 2) runs two rows past the bordered map.
constexpr std::int64_t padded_rows(std::int64_t H, std::int64_t W) {
  return (H + 2) * (W + 2) + 2;
}

struct HeadWeights {
  std::vector<at::Tensor> deconv;  // [4, 4, out, in]: deconv[s][ky][kx] is a Linear weight
  std::vector<at::Tensor> conv_w;  // [out, in]
  std::vector<at::Tensor> conv_b;  // [out]
  at::Tensor seg_w;                // [Kp, in], rows >= classes are zero
  at::Tensor seg_b;                // [Kp]
  std::int64_t classes = 0;

  // Output pixels per feature pixel along each axis: 2 per deconvolution.
  std::int64_t upscale() const { return std::int64_t{1} << deconv.size(); }
};

// From the checkpoint's layouts: deconv [in, out, 4, 4] (ConvTranspose2d, no bias), conv
// [out, in, 1, 1] + bias, conv_seg [K, in, 1, 1] + bias, each stage's input width the previous
// stage's output; converted to `dtype` on `device`. Host logic (any device).
HeadWeights prepare_head(const std::vector<at::Tensor>& deconv,
                         const std::vector<at::Tensor>& conv_w,
                         const std::vector<at::Tensor>& conv_b, const at::Tensor& seg_w,
                         const at::Tensor& seg_b, c10::Device device, at::ScalarType dtype);

// The head for one image: feat [gh * gw, C] (the backbone's final norm, row-major over the
// grid) -> logits [u*gh * u*gw, Kp] channels-last (u = w.upscale()), in the weights' dtype, on
// the GPU. band_rows 0 runs each deconvolution in bands of deconv_band_rows(W) input rows; a
// test may force other bands (more of them, a partial last one) to check the band arithmetic.
at::Tensor head_forward(fastbb::Gemm& gemm, const HeadWeights& w, const at::Tensor& feat,
                        std::int64_t gh, std::int64_t gw, std::int64_t band_rows = 0);

// head_forward's schedule on ATen ops (any device and dtype; statistics in fp32): the same
// prepared weights, sub-pixel taps and fused-normalisation order, so a CPU test can hold
// prepare_head and the schedule to the networks' own heads.
at::Tensor head_forward_reference(const HeadWeights& w, const at::Tensor& feat, std::int64_t gh,
                                  std::int64_t gw);

// The sub-pixel transposed convolution on ATen ops, with the same tap table, offsets and
// zero-bordered layout and bands of input rows as head_forward (so a CPU test can check that
// index arithmetic against at::conv_transpose2d): x [H, W, Cin] channels-last, taps
// [4, 4, Cout, Cin] -> [2H, 2W, Cout]; band_rows 0 means deconv_band_rows(W).
at::Tensor subpixel_deconv_reference(const at::Tensor& x, const at::Tensor& taps,
                                     std::int64_t band_rows = 0);

// Input rows per band of the parity GEMMs: about 16384 GEMM rows, so the parity plane is a
// bounded scratch (~25 MB for 768 channels in 16 bits) instead of a quarter of the output map.
constexpr std::int64_t deconv_band_rows(std::int64_t W) {
  const std::int64_t rows = 16384 / (W + 2);
  return rows > 0 ? rows : 1;
}

// labels [H, W] (uint8, CUDA) = argmax over the first `classes` channels of the bilinear
// (align_corners=False) resize of logits [h, w, ld] (channels-last, CUDA, any float dtype).
void upsample_argmax(const at::Tensor& logits, std::int64_t classes, const at::Tensor& labels);

// Instance-norm statistics of x [P, C] (CUDA) as float32 (scale, shift) with y = x*scale+shift.
std::pair<at::Tensor, at::Tensor> channel_stats(const at::Tensor& x, double eps);
// x = silu(x * scale + shift) in place, per channel (CUDA).
void norm_silu_(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift);

}  // namespace sapiens_seg::kernels::seg_up
