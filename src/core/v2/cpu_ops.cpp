#include "cpu_ops.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "../cpu/vec.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core::v2 {
namespace {

#ifdef SAPIENS_SEG_X86
using namespace vec;  // NOLINT(google-build-using-namespace): the vector helpers
#endif

// One row each: y = round((x * r) * w), r = 1 / sqrt(mean(x^2) + eps), in float32. The tail of a
// row that is not a whole vector runs the scalar steps (c10's conversions round as the vector
// ones).
template <typename T>
void normalise_tail(const T* x, const T* w, T* y, int64_t from, int64_t D, float r) {
  for (int64_t d = from; d < D; ++d) {
    y[d] = static_cast<T>(static_cast<float>(x[d]) * r * static_cast<float>(w[d]));
  }
}

float inv_rms(float sum_sq, int64_t D, float eps) {
  return 1.0f / std::sqrt(sum_sq / static_cast<float>(D) + eps);
}

template <typename T>
void row_scalar(const T* x, const T* w, T* y, int64_t D, float eps) {
  float ss = 0.0f;
  for (int64_t d = 0; d < D; ++d) {
    const auto v = static_cast<float>(x[d]);
    ss += v * v;
  }
  normalise_tail(x, w, y, 0, D, inv_rms(ss, D, eps));
}

#ifdef SAPIENS_SEG_X86

template <typename T>
SAPIENS_SEG_VEC512 void row_avx512(const T* x, const T* w, T* y, int64_t D, float eps) {
  __m512 acc = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    const __m512 v = load16(x + d);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  float ss = hsum16(acc);
  for (int64_t t = d; t < D; ++t) ss += static_cast<float>(x[t]) * static_cast<float>(x[t]);
  const float r = inv_rms(ss, D, eps);
  const __m512 rv = _mm512_set1_ps(r);
  for (d = 0; d + 16 <= D; d += 16) {
    store16(y + d, _mm512_mul_ps(_mm512_mul_ps(load16(x + d), rv), load16(w + d)));
  }
  normalise_tail(x, w, y, d, D, r);
}

template <typename T>
SAPIENS_SEG_VEC256 void row_avx2(const T* x, const T* w, T* y, int64_t D, float eps) {
  __m256 acc = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) {
    const __m256 v = load8(x + d);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = hsum8(acc);
  for (int64_t t = d; t < D; ++t) ss += static_cast<float>(x[t]) * static_cast<float>(x[t]);
  const float r = inv_rms(ss, D, eps);
  const __m256 rv = _mm256_set1_ps(r);
  for (d = 0; d + 8 <= D; d += 8) {
    store8(y + d, _mm256_mul_ps(_mm256_mul_ps(load8(x + d), rv), load8(w + d)));
  }
  normalise_tail(x, w, y, d, D, r);
}

#endif  // SAPIENS_SEG_X86

template <typename T>
void run(const at::Tensor& x, const at::Tensor& w, const at::Tensor& y, double eps, VecIsa isa) {
  using Row = void (*)(const T*, const T*, T*, int64_t, float);
  Row row = row_scalar<T>;
#ifdef SAPIENS_SEG_X86
  if (isa == VecIsa::kAvx512) row = row_avx512<T>;
  if (isa == VecIsa::kAvx2) row = row_avx2<T>;
#else
  (void)isa;  // vector loops are x86 only
#endif
  const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
  const T* xp = x.const_data_ptr<T>();
  const T* wp = w.const_data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const auto e = static_cast<float>(eps);
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(D, 1));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) row(xp + r * D, wp, yp + r * D, D, e);
  });
}

// SwiGLU: out = round(round(silu(a)) * b) per element, a and b the two halves of a row.
template <typename T>
void swiglu_tail(const T* a, const T* b, T* out, int64_t from, int64_t F) {
  for (int64_t c = from; c < F; ++c) {
    const auto z = static_cast<float>(a[c]);
    const T s = static_cast<T>(z / (1.0f + std::exp(-z)));
    out[c] = static_cast<T>(static_cast<float>(s) * static_cast<float>(b[c]));
  }
}

template <typename T>
void swiglu_row_scalar(const T* a, const T* b, T* out, int64_t F) {
  swiglu_tail(a, b, out, 0, F);
}

#ifdef SAPIENS_SEG_X86

// The silu's rounding goes through `out` itself (a row is in L1), then the product's.
template <typename T>
SAPIENS_SEG_VEC512 void swiglu_row_avx512(const T* a, const T* b, T* out, int64_t F) {
  int64_t c = 0;
  for (; c + 16 <= F; c += 16) {
    store16(out + c, silu16(load16(a + c)));
    store16(out + c, _mm512_mul_ps(load16(out + c), load16(b + c)));
  }
  swiglu_tail(a, b, out, c, F);
}

template <typename T>
SAPIENS_SEG_VEC256 void swiglu_row_avx2(const T* a, const T* b, T* out, int64_t F) {
  int64_t c = 0;
  for (; c + 8 <= F; c += 8) {
    store8(out + c, silu8(load8(a + c)));
    store8(out + c, _mm256_mul_ps(load8(out + c), load8(b + c)));
  }
  swiglu_tail(a, b, out, c, F);
}

#endif  // SAPIENS_SEG_X86

template <typename T>
void run_swiglu(const at::Tensor& out, const at::Tensor& g, VecIsa isa) {
  using Row = void (*)(const T*, const T*, T*, int64_t);
  Row row = swiglu_row_scalar<T>;
#ifdef SAPIENS_SEG_X86
  if (isa == VecIsa::kAvx512) row = swiglu_row_avx512<T>;
  if (isa == VecIsa::kAvx2) row = swiglu_row_avx2<T>;
#else
  (void)isa;
#endif
  const int64_t F = out.size(-1), rows = out.numel() / std::max<int64_t>(F, 1);
  const T* gp = g.const_data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(F, 1));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) row(gp + r * 2 * F, gp + r * 2 * F + F, op + r * F, F);
  });
}

}  // namespace

void swiglu_cpu(const at::Tensor& out, const at::Tensor& g, VecIsa isa) {
  const at::ScalarType t = g.scalar_type();
  if (!g.device().is_cpu() || (t != at::kBFloat16 && t != at::kHalf) || g.dim() < 1 ||
      g.size(-1) % 2 != 0 || !g.is_contiguous()) {
    throw Error(ErrorCode::kInvalidInput,
                "swiglu_cpu: a contiguous bfloat16 or float16 CPU map of an even width only");
  }
  if (!out.device().is_cpu() || out.scalar_type() != t || !out.is_contiguous() ||
      out.size(-1) * 2 != g.size(-1) || out.numel() * 2 != g.numel()) {
    throw Error(ErrorCode::kInvalidInput,
                "swiglu_cpu: out must be a contiguous CPU map of g's dtype, half its width");
  }
  isa = resolve_vec_isa(isa);
  if (t == at::kBFloat16) {
    run_swiglu<c10::BFloat16>(out, g, isa);
  } else {
    run_swiglu<c10::Half>(out, g, isa);
  }
}

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& w, double eps, VecIsa isa) {
  const at::ScalarType t = x.scalar_type();
  if (!x.device().is_cpu() || (t != at::kBFloat16 && t != at::kHalf) || x.dim() < 1) {
    throw Error(ErrorCode::kInvalidInput, "rms_norm_cpu: bfloat16 or float16 CPU maps only");
  }
  const int64_t D = x.size(-1);
  if (!w.device().is_cpu() || w.scalar_type() != t || w.numel() != D || !w.is_contiguous()) {
    throw Error(ErrorCode::kInvalidInput,
                "rms_norm_cpu: the weight must be a contiguous CPU tensor of the map's dtype and "
                "last dim");
  }
  isa = resolve_vec_isa(isa);
  // Rows must lie D apart; a map that is not contiguous (the q and k views) is copied once.
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  if (t == at::kBFloat16) {
    run<c10::BFloat16>(xc, w, y, eps, isa);
  } else {
    run<c10::Half>(xc, w, y, eps, isa);
  }
  return y;
}

}  // namespace sapiens_seg::core::v2
