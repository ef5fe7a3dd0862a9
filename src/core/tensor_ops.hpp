// Pre- and post-processing on tensors (no image codecs here: those are in the IO layer).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <ATen/Tensor.h>

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

}  // namespace sapiens_seg::core
