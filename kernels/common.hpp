// What the three kernel families share: the element types their device code is instantiated for
// and CUDA error checking that throws (a library never exits on a CUDA error). No LibTorch
// header here, so the .cu files that include it stay cheap to compile.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace sapiens_seg::kernels {

// The element types of activations and weights. Statistics and accumulation are always fp32.
enum class DType : std::uint8_t { kF32, kF16, kBF16 };

inline const char* dtype_str(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
  }
  return "?";
}

inline std::size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorName(e) + " (" +
                           cudaGetErrorString(e) + ") at " + file + ":" + std::to_string(line));
}

}  // namespace sapiens_seg::kernels

#define SAPIENS_CUDA_CHECK(expr)                                                   \
  do {                                                                             \
    const cudaError_t sapiens_err_ = (expr);                                       \
    if (sapiens_err_ != cudaSuccess) {                                             \
      ::sapiens_seg::kernels::throw_cuda(sapiens_err_, #expr, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)

// After a kernel launch: reports bad launch configurations at once (execution errors surface at
// the next synchronising call, as everywhere in CUDA).
#define SAPIENS_CUDA_CHECK_LAUNCH() SAPIENS_CUDA_CHECK(cudaGetLastError())
