// fastbb device code: LayerNorm and RMSNorm with fp32 statistics, the exact (erf) GELU that
// follows v1's fc1 GEMM, Sapiens2's SwiGLU gate, and its per-head q/k RMSNorm + 2D RoPE. The
// GEMMs themselves are cuBLASLt's (gemm.cpp).
#include "kernels/device_types.cuh"
#include "kernels/fastbb/launch.hpp"
#include "kernels/fastbb/sapiens2_math.hpp"

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

// RMSNorm with fp32 statistics and one rounding to T at the end, as at::rms_norm rounds a 16-bit
// input (x * rstd * w in fp32, then T).
template <typename T, int V>
__global__ void rms_norm_kernel(const T* x, const T* __restrict__ w, T* y, std::int64_t rows,
                                int cols, float eps) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  using P = Pack<T, V>;
  const P* xr = reinterpret_cast<const P*>(x + row * cols);
  const P* wr = reinterpret_cast<const P*>(w);
  P* yr = reinterpret_cast<P*>(y + row * cols);
  const int packs = cols / V;
  float sq = 0.f;
  for (int i = lane; i < packs; i += 32) {
    const P p = xr[i];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = to_f32(p.v[k]);
      sq += v * v;
    }
  }
  const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(cols) + eps);
  for (int i = lane; i < packs; i += 32) {
    const P p = xr[i], pw = wr[i];
    P o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      o.v[k] = rms_norm_element<T>(to_f32(p.v[k]), rstd, to_f32(pw.v[k]));
    }
    yr[i] = o;
  }
}

// out[m, j] = silu(h[m, j]) * h[m, F + j], each op rounded to T as the eager module's are.
template <typename T, int V>
__global__ void swiglu_kernel(const T* __restrict__ h, T* __restrict__ out, std::int64_t rows,
                              std::int64_t F) {
  using P = Pack<T, V>;
  const std::int64_t per_row = F / V, n = rows * per_row;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const std::int64_t r = i / per_row, c = i % per_row;
    const P a = reinterpret_cast<const P*>(h + r * 2 * F)[c];
    const P b = reinterpret_cast<const P*>(h + r * 2 * F + F)[c];
    P o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      o.v[k] = swiglu_element<T>(to_f32(a.v[k]), to_f32(b.v[k]));
    }
    reinterpret_cast<P*>(out + r * F)[c] = o;
  }
}

// x[m, c] += y[m, c] * gamma[c], the product and the sum each rounded to T: Sapiens2's layer
// scale on the attention branch, x + (o W^T + b) * gamma, in the eager module's roundings.
template <typename T, int V>
__global__ void scale_add_kernel(T* x, const T* __restrict__ y, const T* __restrict__ gamma,
                                 std::int64_t rows, std::int64_t C) {
  using P = Pack<T, V>;
  const std::int64_t per_row = C / V, n = rows * per_row;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const std::int64_t c = i % per_row;
    P a = reinterpret_cast<const P*>(x)[i];
    const P b = reinterpret_cast<const P*>(y)[i];
    const P g = reinterpret_cast<const P*>(gamma)[c];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      a.v[k] = scale_add_element<T>(to_f32(a.v[k]), to_f32(b.v[k]), to_f32(g.v[k]));
    }
    reinterpret_cast<P*>(x)[i] = a;
  }
}

// One warp per (token, head) of the q and k heads of a packed [tokens, slots, D] qkv: RMSNorm
// over the first hd elements (fp32 statistics, rounded to T once like rms_norm_kernel), then the
// rounding
// to bfloat16 and, for patch tokens, the rotation in bfloat16 arithmetic (every product and the
// sum rounded) that Sapiens2's RoPE applies whatever the model dtype, then back to T. Elements
// hd..D (the zero padding for cuDNN) are neither read nor written.
template <typename T>
__global__ void qk_norm_rope_kernel(T* qkv, const T* __restrict__ q_w, const T* __restrict__ k_w,
                                    const __nv_bfloat16* __restrict__ cos_t,
                                    const __nv_bfloat16* __restrict__ sin_t, std::int64_t rows,
                                    int heads, int q_heads, int slots, int D, int hd, int tokens,
                                    int prefix, float eps) {
  const int lane = threadIdx.x & 31;
  const std::int64_t item =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= rows * heads) return;
  const std::int64_t row = item / heads;
  const int head = static_cast<int>(item % heads);
  T* v = qkv + (row * slots + head) * D;
  const T* w = head < q_heads ? q_w : k_w;
  float sq = 0.f;
  for (int j = lane; j < hd; j += 32) {
    const float a = to_f32(v[j]);
    sq += a * a;
  }
  const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(hd) + eps);
  const int n = static_cast<int>(row % tokens), half = hd / 2;
  const bool rotate = n >= prefix;
  const std::int64_t t = static_cast<std::int64_t>(n - prefix) * hd;
  for (int j = lane; j < half; j += 32) {
    const QkPair o = qk_norm_rope_pair<T>(
        to_f32(v[j]), to_f32(v[j + half]), rstd, to_f32(w[j]), to_f32(w[j + half]), rotate,
        rotate ? to_f32(cos_t[t + j]) : 0.f, rotate ? to_f32(sin_t[t + j]) : 0.f,
        rotate ? to_f32(cos_t[t + j + half]) : 0.f, rotate ? to_f32(sin_t[t + j + half]) : 0.f);
    v[j] = from_f32<T>(o.a);
    v[j + half] = from_f32<T>(o.b);
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

void launch_rms_norm(DType t, const void* x, const void* w, void* y, std::int64_t rows,
                     std::int64_t cols, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  const unsigned grid = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  SAPIENS_DISPATCH_DTYPE(t, {
    constexpr int V = kVec<scalar_t>;
    const auto* xs = static_cast<const scalar_t*>(x);
    const auto* ws = static_cast<const scalar_t*>(w);
    auto* ys = static_cast<scalar_t*>(y);
    if (cols % V == 0 && aligned16(x) && aligned16(w) && aligned16(y)) {
      rms_norm_kernel<scalar_t, V>
          <<<grid, kWarpsPerBlock * 32, 0, stream>>>(xs, ws, ys, rows, static_cast<int>(cols), eps);
    } else {
      rms_norm_kernel<scalar_t, 1>
          <<<grid, kWarpsPerBlock * 32, 0, stream>>>(xs, ws, ys, rows, static_cast<int>(cols), eps);
    }
  });
  SAPIENS_CUDA_CHECK_LAUNCH();
}

void launch_swiglu(DType t, const void* h, void* out, std::int64_t rows, std::int64_t F,
                   cudaStream_t stream) {
  if (rows == 0 || F == 0) return;
  constexpr int kBlock = 256;
  SAPIENS_DISPATCH_DTYPE(t, {
    constexpr int V = kVec<scalar_t>;
    const auto* hs = static_cast<const scalar_t*>(h);
    auto* os = static_cast<scalar_t*>(out);
    if (F % V == 0 && aligned16(h) && aligned16(out)) {
      swiglu_kernel<scalar_t, V>
          <<<grid_for(rows * (F / V), kBlock), kBlock, 0, stream>>>(hs, os, rows, F);
    } else {
      swiglu_kernel<scalar_t, 1>
          <<<grid_for(rows * F, kBlock), kBlock, 0, stream>>>(hs, os, rows, F);
    }
  });
  SAPIENS_CUDA_CHECK_LAUNCH();
}

void launch_qk_norm_rope(DType t, void* qkv, const void* q_w, const void* k_w, const void* cos_t,
                         const void* sin_t, std::int64_t rows, int q_heads, int k_heads, int slots,
                         int D, int hd, int tokens, int prefix, float eps, cudaStream_t stream) {
  const std::int64_t items = rows * (q_heads + k_heads);
  if (items == 0) return;
  const unsigned grid = static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
  SAPIENS_DISPATCH_DTYPE(t, {
    qk_norm_rope_kernel<scalar_t><<<grid, kWarpsPerBlock * 32, 0, stream>>>(
        static_cast<scalar_t*>(qkv), static_cast<const scalar_t*>(q_w),
        static_cast<const scalar_t*>(k_w), static_cast<const __nv_bfloat16*>(cos_t),
        static_cast<const __nv_bfloat16*>(sin_t), rows, q_heads + k_heads, q_heads, slots, D, hd,
        tokens, prefix, eps);
  });
  SAPIENS_CUDA_CHECK_LAUNCH();
}

void launch_scale_add(DType t, void* x, const void* y, const void* gamma, std::int64_t rows,
                      std::int64_t C, cudaStream_t stream) {
  if (rows == 0 || C == 0) return;
  constexpr int kBlock = 256;
  SAPIENS_DISPATCH_DTYPE(t, {
    constexpr int V = kVec<scalar_t>;
    auto* xs = static_cast<scalar_t*>(x);
    const auto* ys = static_cast<const scalar_t*>(y);
    const auto* gs = static_cast<const scalar_t*>(gamma);
    if (C % V == 0 && aligned16(x) && aligned16(y) && aligned16(gamma)) {
      scale_add_kernel<scalar_t, V>
          <<<grid_for(rows * (C / V), kBlock), kBlock, 0, stream>>>(xs, ys, gs, rows, C);
    } else {
      scale_add_kernel<scalar_t, 1>
          <<<grid_for(rows * C, kBlock), kBlock, 0, stream>>>(xs, ys, gs, rows, C);
    }
  });
  SAPIENS_CUDA_CHECK_LAUNCH();
}

}  // namespace sapiens_seg::kernels::fastbb
