// The per-pixel core of the fused bilinear upsample + argmax, shared by the CUDA kernel and the
// host (so a CPU test runs the very code the kernel runs). Matches core::upsample_argmax (the
// CPU path) operation for operation: PyTorch's align_corners=False source rule, the same blend
// order, first maximum wins. Multiplies and adds go through mul_rn/add_rn (no FMA contraction).
#pragma once

#include "kernels/host_device.hpp"

namespace sapiens_seg::kernels::seg_up {

// Source rows (or columns) and weights of output coordinate `dst` when resizing `in` -> `out`:
// src = (dst + 0.5) * in / out - 0.5, clamped at 0; the far neighbour clamps at the border.
struct Tap {
  int i0, i1;
  float l0, l1;
};

SAPIENS_HD inline Tap bilinear_tap(int dst, int in, int out) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  float src = add_rn(mul_rn(scale, add_rn(static_cast<float>(dst), 0.5f)), -0.5f);
  src = src < 0.0f ? 0.0f : src;
  int i0 = static_cast<int>(src);
  i0 = i0 < in - 1 ? i0 : in - 1;
  const int i1 = i0 < in - 1 ? i0 + 1 : i0;
  const float l1 = src - static_cast<float>(i0);
  return {i0, i1, 1.0f - l1, l1};
}

// Index of the largest blended logit over `classes` classes; load(k, row, col) returns class
// k's logit at a source pixel as float. A strictly greater value is needed to move off an
// earlier class, so ties go to the lower index (torch.argmax).
template <typename Load>
SAPIENS_HD inline int blend_argmax(const Load& load, int classes, const Tap& ty, const Tap& tx) {
  float best = 0.0f;
  int arg = 0;
  for (int k = 0; k < classes; ++k) {
    const float top =
        add_rn(mul_rn(tx.l0, load(k, ty.i0, tx.i0)), mul_rn(tx.l1, load(k, ty.i0, tx.i1)));
    const float bottom =
        add_rn(mul_rn(tx.l0, load(k, ty.i1, tx.i0)), mul_rn(tx.l1, load(k, ty.i1, tx.i1)));
    const float v = add_rn(mul_rn(ty.l0, top), mul_rn(ty.l1, bottom));
    if (k == 0 || v > best) {
      best = v;
      arg = k;
    }
  }
  return arg;
}

}  // namespace sapiens_seg::kernels::seg_up
