// Arithmetic shared by device code and host tests: code written with these helpers runs the same
// float operations on both sides, so a CPU test can check a kernel's own rounding sequence.
// Multiplies and adds are explicitly rounded on the device so nvcc cannot contract them into
// FMAs, which would round differently from the host.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if defined(__CUDACC__)
#define SAPIENS_HD __host__ __device__
#else
#define SAPIENS_HD
#endif

namespace sapiens_seg::kernels {

SAPIENS_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

SAPIENS_HD inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Conversions between an element type and float, on host and device.
template <typename T>
struct Elem;

template <>
struct Elem<float> {
  SAPIENS_HD static float to(float v) { return v; }
  SAPIENS_HD static float from(float v) { return v; }
};

template <>
struct Elem<__half> {
  SAPIENS_HD static float to(__half v) { return __half2float(v); }
  SAPIENS_HD static __half from(float v) { return __float2half_rn(v); }
};

template <>
struct Elem<__nv_bfloat16> {
  SAPIENS_HD static float to(__nv_bfloat16 v) { return __bfloat162float(v); }
  SAPIENS_HD static __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};

// The value a PyTorch op producing T would store: float -> T -> float.
template <typename T>
SAPIENS_HD inline float stored(float v) {
  return Elem<T>::to(Elem<T>::from(v));
}

}  // namespace sapiens_seg::kernels
