// Device-side helpers shared by the .cu files: fp32 conversion of the element types, 16-byte
// packs for vectorised loads, warp reductions, and the switch from the runtime DType to a
// compile-time element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/common.hpp"

namespace sapiens_seg::kernels {

__device__ __forceinline__ float to_f32(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// V elements moved as one aligned load or store (V * sizeof(T) = 16 bytes for the vector path,
// V = 1 for the scalar fallback).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T>
constexpr int kVec = 16 / sizeof(T);

inline bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace sapiens_seg::kernels

// Runs the statement with `scalar_t` bound to the element type of `dtype`.
#define SAPIENS_DISPATCH_DTYPE(dtype, ...)       \
  switch (dtype) {                               \
    case ::sapiens_seg::kernels::DType::kF32: {  \
      using scalar_t = float;                    \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
    case ::sapiens_seg::kernels::DType::kF16: {  \
      using scalar_t = __half;                   \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
    case ::sapiens_seg::kernels::DType::kBF16: { \
      using scalar_t = __nv_bfloat16;            \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
  }
