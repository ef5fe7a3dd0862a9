// fastbb device code: LayerNorm with fp32 statistics and the exact (erf) GELU that follows the
// fc1 GEMM. The GEMMs themselves are cuBLASLt's (gemm.cpp).
#include "kernels/device_types.cuh"
#include "kernels/fastbb/launch.hpp"

namespace sapiens_seg::kernels::fastbb {
namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per row. The row (at most a few KB) is read three times: mean, then the centred
// second moment (two passes avoid the cancellation of E[x^2] - mean^2 when |mean| >> std), then
// the output; the second and third reads hit L1/L2.
template <typename T, int V>
__global__ void layer_norm_kernel(const T* x, const T* __restrict__ w, const T* __restrict__ b,
                                  T* y, std::int64_t rows, int cols, float eps) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  using P = Pack<T, V>;
  const P* xr = reinterpret_cast<const P*>(x + row * cols);
  const P* wr = reinterpret_cast<const P*>(w);
  const P* br = reinterpret_cast<const P*>(b);
  P* yr = reinterpret_cast<P*>(y + row * cols);
  const int packs = cols / V;

  float sum = 0.f;
  for (int i = lane; i < packs; i += 32) {
    const P p = xr[i];
#pragma unroll
    for (int k = 0; k < V; ++k) sum += to_f32(p.v[k]);
  }
  const float mean = warp_sum(sum) / static_cast<float>(cols);
  float sq = 0.f;
  for (int i = lane; i < packs; i += 32) {
    const P p = xr[i];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float d = to_f32(p.v[k]) - mean;
      sq += d * d;
    }
  }
  const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(cols) + eps);
  for (int i = lane; i < packs; i += 32) {
    const P p = xr[i], pw = wr[i], pb = br[i];
    P o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      o.v[k] = from_f32<T>((to_f32(p.v[k]) - mean) * rstd * to_f32(pw.v[k]) + to_f32(pb.v[k]));
    }
    yr[i] = o;
  }
}

template <typename T, int V>
__global__ void gelu_erf_kernel(T* x, std::int64_t packs) {
  using P = Pack<T, V>;
  P* xp = reinterpret_cast<P*>(x);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += stride) {
    P p = xp[i];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = to_f32(p.v[k]);
      p.v[k] = from_f32<T>(0.5f * v * (1.f + erff(v * 0.70710678118654752f)));
    }
    xp[i] = p;
  }
}

unsigned grid_for(std::int64_t work, int block) {
  // Grid-stride loops: enough blocks to fill any current GPU several times over, no more.
  const std::int64_t blocks = (work + block - 1) / block;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace

void launch_layer_norm(DType t, const void* x, const void* w, const void* b, void* y,
                       std::int64_t rows, std::int64_t cols, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  const unsigned grid = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  SAPIENS_DISPATCH_DTYPE(t, {
    constexpr int V = kVec<scalar_t>;
    const bool vec = cols % V == 0 && aligned16(x) && aligned16(w) && aligned16(b) && aligned16(y);
    if (vec) {
      layer_norm_kernel<scalar_t, V><<<grid, kWarpsPerBlock * 32, 0, stream>>>(
          static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(w),
          static_cast<const scalar_t*>(b), static_cast<scalar_t*>(y), rows, static_cast<int>(cols),
          eps);
    } else {
      layer_norm_kernel<scalar_t, 1><<<grid, kWarpsPerBlock * 32, 0, stream>>>(
          static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(w),
          static_cast<const scalar_t*>(b), static_cast<scalar_t*>(y), rows, static_cast<int>(cols),
          eps);
    }
  });
  SAPIENS_CUDA_CHECK_LAUNCH();
}

void launch_gelu_erf(DType t, void* x, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kBlock = 256;
  SAPIENS_DISPATCH_DTYPE(t, {
    constexpr int V = kVec<scalar_t>;
    if (n % V == 0 && aligned16(x)) {
      gelu_erf_kernel<scalar_t, V>
          <<<grid_for(n / V, kBlock), kBlock, 0, stream>>>(static_cast<scalar_t*>(x), n / V);
    } else {
      gelu_erf_kernel<scalar_t, 1>
          <<<grid_for(n, kBlock), kBlock, 0, stream>>>(static_cast<scalar_t*>(x), n);
    }
  });
  SAPIENS_CUDA_CHECK_LAUNCH();
}

}  // namespace sapiens_seg::kernels::fastbb
