// Pre- and post-processing on tensors (no image codecs here: those are in the IO layer).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <ATen/Tensor.h>

#include "resize/resize.hpp"

namespace sapiens_seg::core {

// uint8 RGB HWC (rows `stride` bytes apart) -> float32 [3, h, w], (x - mean) / std per channel,
// computed exactly as the authors' demo does it in fp32.
at::Tensor normalize_rgb(const std::uint8_t* data, int h, int w, std::size_t stride,
                         const std::array<float, 3>& mean, const std::array<float, 3>& std);

// Bilinear resize (align_corners=False, as F.interpolate) of logits [K, h, w] (fp32, CPU,
// contiguous) to [K, H, W] fused with the argmax over K (first maximum wins, as torch.argmax).
// Works row by row, so the full-resolution logits never exist unless `full_logits` (K*H*W
// floats) is given; without them only pixels whose source pixels disagree on the class are
// blended. Rows are spread over LibTorch's intra-op threads.
void upsample_argmax(const at::Tensor& logits, int H, int W, std::uint8_t* labels,
                     float* full_logits = nullptr);

// ---- the same steps as tensor code that runs where the tensors live (the device pipeline) ----

// uint8 RGB [h, w, 3] (any device, any strides) -> float32 [3, H, W] on the same device: the
// authors' cv2.resize with `interp`, reproduced in OpenCV's own arithmetic on tensor ops
// (resize/resize.hpp: the same bytes as resize_u8 and the opencv-python wheel), then
// (x - mean) / std exactly as normalize_rgb computes it. h == H and w == W skips the resize, as
// OpenCV does.
at::Tensor resize_normalize(const at::Tensor& rgb, int64_t H, int64_t W,
                            const std::array<float, 3>& mean, const std::array<float, 3>& std,
                            Interp interp = Interp::kLinear,
                            CubicFlavor flavor = CubicFlavor::kWheel);

// Labels [H, W] (uint8, on the logits' device) of logits [K, h, w] (any float dtype, any
// layout): the argmax of upsample_argmax's blend, the same products and sums in float32 (so the
// labels equal its full-logits path's bit for bit). On a GPU the kernels backend can run, seg_up's
// fused kernel does it; elsewhere ATen ops do, in bands of rows whose temporaries stay under
// `band_bytes`. fused = false keeps to the ATen ops on a GPU too (tests compare the two).
at::Tensor upsample_argmax_labels(const at::Tensor& logits, int64_t H, int64_t W,
                                  int64_t band_bytes = int64_t{64} << 20, bool fused = true);

}  // namespace sapiens_seg::core
