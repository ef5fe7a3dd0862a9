// The element arithmetic of fastbb's Sapiens2 kernels (RMSNorm output, q/k norm + RoPE, SwiGLU,
// layer scale), shared by the CUDA kernels and the host, so a CPU test runs the kernels' own
// rounding sequence against the ATen ops of the portable network. The reductions (the sum of
// squares behind rstd) are not here: their order differs between a warp and ATen anyway.
#pragma once

#include <cmath>

#include "kernels/host_device.hpp"

namespace sapiens_seg::kernels::fastbb {

// RMSNorm's output: x * rstd * w in float, rounded to T once (as at::rms_norm rounds a 16-bit
// input).
template <typename T>
SAPIENS_HD inline T rms_norm_element(float x, float rstd, float w) {
  return Elem<T>::from(mul_rn(mul_rn(x, rstd), w));
}

// One (j, j + hd/2) pair of a q or k head: the RMSNorm output rounded to T, then to bfloat16 as
// the authors' RoPE casts it, and for a patch token the rotate-half rotation in bfloat16
// arithmetic (each product and the sum rounded): (a, b) -> (a cos_j - b sin_j, b cos_k + a sin_k)
// with k = j + hd/2. Results are the values stored back in T.
struct QkPair {
  float a, b;
};

template <typename T>
SAPIENS_HD inline QkPair qk_norm_rope_pair(float xa, float xb, float rstd, float wa, float wb,
                                           bool rotate, float cos_a, float sin_a, float cos_b,
                                           float sin_b) {
  using B16 = __nv_bfloat16;
  float a = stored<B16>(stored<T>(mul_rn(mul_rn(xa, rstd), wa)));
  float b = stored<B16>(stored<T>(mul_rn(mul_rn(xb, rstd), wb)));
  if (rotate) {
    const float ra =
        stored<B16>(add_rn(stored<B16>(mul_rn(a, cos_a)), stored<B16>(mul_rn(-b, sin_a))));
    const float rb =
        stored<B16>(add_rn(stored<B16>(mul_rn(b, cos_b)), stored<B16>(mul_rn(a, sin_b))));
    a = ra;
    b = rb;
  }
  return {stored<T>(a), stored<T>(b)};
}

// silu(gate) rounded to T, times up, rounded to T: the eager module's two ops.
template <typename T>
SAPIENS_HD inline T swiglu_element(float gate, float up) {
  const float s = stored<T>(gate / add_rn(1.f, expf(-gate)));
  return Elem<T>::from(mul_rn(s, up));
}

// x + y * gamma with the product and the sum each rounded to T (x + linear(...).mul(gamma)).
template <typename T>
SAPIENS_HD inline T scale_add_element(float x, float y, float gamma) {
  return Elem<T>::from(add_rn(x, stored<T>(mul_rn(y, gamma))));
}

}  // namespace sapiens_seg::kernels::fastbb
