// RoPE's rotate-half, shared by the portable Sapiens2 network (v2/sapiens2.cpp) and the ATen
// reference of the kernels backend's steps (kernel_ops.cpp), which must round alike. Here,
// under both, so that the kernels backend's steps do not include a family's network.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

namespace sapiens_seg::core::attention {

// Over the last dim: (a, b) -> (-b, a) for its two halves.
inline at::Tensor rotate_half(const at::Tensor& t) {
  const int64_t h = t.size(-1) / 2;
  return at::cat({t.narrow(-1, h, h).neg(), t.narrow(-1, 0, h)}, -1);
}

}  // namespace sapiens_seg::core::attention
