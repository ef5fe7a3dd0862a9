// seg_up device code: the element-wise and reduction passes of the v1 decoder head (the GEMMs
// are cuBLASLt's, driven by head.cpp) and the fused bilinear upsample + argmax.
#include "kernels/device_types.cuh"
#include "kernels/seg_up/launch.hpp"
#include "kernels/seg_up/upsample_argmax.hpp"

namespace sapiens_seg::kernels::seg_up {
namespace {

constexpr int kBlock = 256;

unsigned grid_for(std::int64_t work) {
  const std::int64_t blocks = (work + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

__device__ __forceinline__ float silu(float v) {
  return v / (1.0f + expf(-v));
}

// Work items are packs of V channels of one pixel; cp = C / V packs per pixel.
template <typename T, int V>
__global__ void pad_norm_silu_kernel(const T* __restrict__ src, const float* __restrict__ scale,
                                     const float* __restrict__ shift, T* __restrict__ dst,
                                     std::int64_t H, std::int64_t W, std::int64_t cp) {
  using P = Pack<T, V>;
  const std::int64_t n = H * W * cp, stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const std::int64_t pix = i / cp, c = i - pix * cp;
    const std::int64_t r = pix / W, col = pix - r * W;
    P p = reinterpret_cast<const P*>(src)[i];
    if (scale != nullptr) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int ch = static_cast<int>(c * V + k);
        p.v[k] = from_f32<T>(silu(to_f32(p.v[k]) * scale[ch] + shift[ch]));
      }
    }
    reinterpret_cast<P*>(dst)[((r + 1) * (W + 2) + col + 1) * cp + c] = p;
  }
}

template <typename T, int V>
__global__ void scatter_parity_kernel(const T* __restrict__ s, T* __restrict__ y, std::int64_t H,
                                      std::int64_t W, std::int64_t Wp, std::int64_t cp, int py,
                                      int px) {
  using P = Pack<T, V>;
  const std::int64_t n = H * W * cp, stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const std::int64_t pix = i / cp, c = i - pix * cp;
    const std::int64_t r = pix / W, col = pix - r * W;
    const P p = reinterpret_cast<const P*>(s)[(r * Wp + col) * cp + c];
    reinterpret_cast<P*>(y)[((2 * r + py) * (2 * W) + 2 * col + px) * cp + c] = p;
  }
}

template <typename T, int V>
__global__ void norm_silu_kernel(T* x, const float* __restrict__ scale,
                                 const float* __restrict__ shift, std::int64_t n, std::int64_t cp) {
  using P = Pack<T, V>;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const std::int64_t c = i % cp;
    P p = reinterpret_cast<P*>(x)[i];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int ch = static_cast<int>(c * V + k);
      p.v[k] = from_f32<T>(silu(to_f32(p.v[k]) * scale[ch] + shift[ch]));
    }
    reinterpret_cast<P*>(x)[i] = p;
  }
}

// Channel statistics in two steps. Step 1: block (32 channels x 8 row lanes) reduces a chunk
// of kStatRows rows to (count, mean, M2) per channel. Each lane sums x - shift with its first
// value as the shift (so large means do not cancel in fp32), then the 8 lanes are merged with
// Chan's pairwise formula. Step 2 merges the chunks per channel in fp64.
constexpr int kStatRows = 512;
constexpr int kStatLanes = 8;

template <typename T>
__global__ void stats_partial_kernel(const T* __restrict__ x, std::int64_t P, std::int64_t C,
                                     float* __restrict__ partials) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kStatRows;
  const std::int64_t r1 = r0 + kStatRows < P ? r0 + kStatRows : P;
  float n = 0.f, mean = 0.f, m2 = 0.f;
  if (c < C) {
    float shift = 0.f, s1 = 0.f, s2 = 0.f;
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kStatLanes) {
      const float v = to_f32(x[r * C + c]);
      if (n == 0.f) shift = v;
      const float d = v - shift;
      s1 += d;
      s2 += d * d;
      n += 1.f;
    }
    if (n > 0.f) {
      mean = shift + s1 / n;
      m2 = fmaxf(s2 - s1 * s1 / n, 0.f);
    }
  }
  __shared__ float sh[3][kStatLanes][32];
  sh[0][threadIdx.y][threadIdx.x] = n;
  sh[1][threadIdx.y][threadIdx.x] = mean;
  sh[2][threadIdx.y][threadIdx.x] = m2;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int l = 1; l < kStatLanes; ++l) {
    const float nb = sh[0][l][threadIdx.x];
    if (nb == 0.f) continue;
    const float mb = sh[1][l][threadIdx.x], m2b = sh[2][l][threadIdx.x];
    const float tot = n + nb, delta = mb - mean;
    mean += delta * (nb / tot);
    m2 += m2b + delta * delta * (n * nb / tot);
    n = tot;
  }
  float* out = partials + (static_cast<std::int64_t>(blockIdx.y) * C + c) * 3;
  out[0] = n;
  out[1] = mean;
  out[2] = m2;
}

__global__ void stats_final_kernel(const float* __restrict__ partials, std::int64_t chunks,
                                   std::int64_t C, float eps, float* __restrict__ scale,
                                   float* __restrict__ shift) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double n = 0, mean = 0, m2 = 0;
  for (std::int64_t k = 0; k < chunks; ++k) {
    const float* p = partials + (k * C + c) * 3;
    const double nb = p[0];
    if (nb == 0) continue;
    const double tot = n + nb, delta = p[1] - mean;
    mean += delta * (nb / tot);
    m2 += p[2] + delta * delta * (n * nb / tot);
    n = tot;
  }
  const double rstd = 1.0 / sqrt(m2 / (n > 0 ? n : 1) + eps);
  scale[c] = static_cast<float>(rstd);
  shift[c] = static_cast<float>(-mean * rstd);
}

template <typename T>
struct ChannelsLast {
  const T* p;
  std::int64_t w, ld;
  __device__ float operator()(int k, int row, int col) const {
    return to_f32(p[(static_cast<std::int64_t>(row) * w + col) * ld + k]);
  }
};

template <typename T>
__global__ void upsample_argmax_kernel(const T* __restrict__ logits, int h, int w, int classes,
                                       std::int64_t ld, std::uint8_t* __restrict__ labels, int H,
                                       int W) {
  const std::int64_t n = static_cast<std::int64_t>(H) * W;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const ChannelsLast<T> load{logits, w, ld};
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int y = static_cast<int>(i / W),
              x = static_cast<int>(i - static_cast<std::int64_t>(y) * W);
    const Tap ty = bilinear_tap(y, h, H), tx = bilinear_tap(x, w, W);
    labels[i] = static_cast<std::uint8_t>(blend_argmax(load, classes, ty, tx));
  }
}

template <typename T>
bool vec_ok(std::int64_t C, std::initializer_list<const void*> ptrs) {
  if (C % kVec<T> != 0) return false;
  for (const void* p : ptrs) {
    if (!aligned16(p)) return false;
  }
  return true;
}

}  // namespace

void launch_pad_norm_silu(DType t, const void* src, const float* scale, const float* shift,
                          void* dst, std::int64_t H, std::int64_t W, std::int64_t C,
                          cudaStream_t stream) {
  if (H * W * C == 0) return;
  SAPIENS_DISPATCH_DTYPE(t, {
    constexpr int V = kVec<scalar_t>;
    const auto* s = static_cast<const scalar_t*>(src);
    auto* d = static_cast<scalar_t*>(dst);
    if (vec_ok<scalar_t>(C, {src, dst})) {
      pad_norm_silu_kernel<scalar_t, V>
          <<<grid_for(H * W * C / V), kBlock, 0, stream>>>(s, scale, shift, d, H, W, C / V);
    } else {
      pad_norm_silu_kernel<scalar_t, 1>
          <<<grid_for(H * W * C), kBlock, 0, stream>>>(s, scale, shift, d, H, W, C);
    }
  });
  SAPIENS_CUDA_CHECK_LAUNCH();
}

void launch_scatter_parity(DType t, const void* s, void* y, std::int64_t H, std::int64_t W,
                           std::int64_t Wp, std::int64_t C, int py, int px, cudaStream_t stream) {
  if (H * W * C == 0) return;
  SAPIENS_DISPATCH_DTYPE(t, {
    constexpr int V = kVec<scalar_t>;
    const auto* sp = static_cast<const scalar_t*>(s);
    auto* yp = static_cast<scalar_t*>(y);
    if (vec_ok<scalar_t>(C, {s, y})) {
      scatter_parity_kernel<scalar_t, V>
          <<<grid_for(H * W * C / V), kBlock, 0, stream>>>(sp, yp, H, W, Wp, C / V, py, px);
    } else {
      scatter_parity_kernel<scalar_t, 1>
          <<<grid_for(H * W * C), kBlock, 0, stream>>>(sp, yp, H, W, Wp, C, py, px);
    }
  });
  SAPIENS_CUDA_CHECK_LAUNCH();
}

std::int64_t channel_stats_scratch(std::int64_t P, std::int64_t C) {
  return (P + kStatRows - 1) / kStatRows * C * 3;
}

void launch_channel_stats(DType t, const void* x, std::int64_t P, std::int64_t C, float eps,
                          float* partials, float* scale, float* shift, cudaStream_t stream) {
  if (C == 0) return;
  const std::int64_t chunks = (P + kStatRows - 1) / kStatRows;
  if (chunks > 0) {
    const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
    const dim3 block(32, kStatLanes);
    SAPIENS_DISPATCH_DTYPE(t, {
      stats_partial_kernel<scalar_t>
          <<<grid, block, 0, stream>>>(static_cast<const scalar_t*>(x), P, C, partials);
    });
    SAPIENS_CUDA_CHECK_LAUNCH();
  }
  stats_final_kernel<<<static_cast<unsigned>((C + 127) / 128), 128, 0, stream>>>(
      partials, chunks, C, eps, scale, shift);
  SAPIENS_CUDA_CHECK_LAUNCH();
}

void launch_norm_silu(DType t, void* x, const float* scale, const float* shift, std::int64_t P,
                      std::int64_t C, cudaStream_t stream) {
  if (P * C == 0) return;
  SAPIENS_DISPATCH_DTYPE(t, {
    constexpr int V = kVec<scalar_t>;
    auto* xp = static_cast<scalar_t*>(x);
    if (vec_ok<scalar_t>(C, {x})) {
      norm_silu_kernel<scalar_t, V>
          <<<grid_for(P * C / V), kBlock, 0, stream>>>(xp, scale, shift, P * C / V, C / V);
    } else {
      norm_silu_kernel<scalar_t, 1>
          <<<grid_for(P * C), kBlock, 0, stream>>>(xp, scale, shift, P * C, C);
    }
  });
  SAPIENS_CUDA_CHECK_LAUNCH();
}

void launch_upsample_argmax(DType t, const void* logits, std::int64_t h, std::int64_t w,
                            int classes, std::int64_t ld, std::uint8_t* labels, std::int64_t H,
                            std::int64_t W, cudaStream_t stream) {
  if (H * W == 0) return;
  SAPIENS_DISPATCH_DTYPE(t, {
    upsample_argmax_kernel<scalar_t><<<grid_for(H * W), kBlock, 0, stream>>>(
        static_cast<const scalar_t*>(logits), static_cast<int>(h), static_cast<int>(w), classes, ld,
        labels, static_cast<int>(H), static_cast<int>(W));
  });
  SAPIENS_CUDA_CHECK_LAUNCH();
}

}  // namespace sapiens_seg::kernels::seg_up
