// INTER_CUBIC as the x86-64 opencv-python wheel computes it by default: through Intel IPP's cubic
// resize (see wheel_cubic.cpp for the arithmetic and how it was established).
#pragma once

#include <cstddef>
#include <cstdint>

#include <ATen/Tensor.h>

namespace sapiens_seg::core::resize_detail {

void wheel_cubic_host(const std::uint8_t* src, std::size_t sstride, int h, int w, int cn,
                      std::uint8_t* dst, std::size_t dstride, int H, int W);

at::Tensor wheel_cubic_tensor(const at::Tensor& img, int64_t H, int64_t W);

}  // namespace sapiens_seg::core::resize_detail
