#include "channel_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "../cpu/cpuid.hpp"
#include "../cpu/vec.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core::head {
namespace {

#ifdef SAPIENS_SEG_X86
using namespace vec;  // NOLINT(google-build-using-namespace): the vector helpers
#endif

// One row (C channels) of each pass, for one storage dtype and one instruction set. Pointers are
// to the row's first element; the sums' accumulators a1, a2 hold at least C floats, rounded up
// to the vector width.
using NormRow = void (*)(const void* x, void* y, const float* scale, const float* shift, int64_t C);
using SumRow = void (*)(const void* x, const float* shift, float* a1, float* a2, int64_t C);

// ---- scalar: any CPU (tested, like the vector loops, against LibTorch's own ops) -------------

template <typename T>
void norm_silu_row_scalar(const void* xv, void* yv, const float* scale, const float* shift,
                          int64_t C) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  for (int64_t c = 0; c < C; ++c) {
    const float z = static_cast<float>(x[c]) * scale[c] + shift[c];
    y[c] = static_cast<T>(z / (1.0f + std::exp(-z)));
  }
}

template <typename T>
void sum_row_scalar(const void* xv, const float* shift, float* a1, float* a2, int64_t C) {
  const T* x = static_cast<const T*>(xv);
  for (int64_t c = 0; c < C; ++c) {
    const float d = static_cast<float>(x[c]) - shift[c];
    a1[c] += d;
    a2[c] += d * d;
  }
}

#ifdef SAPIENS_SEG_X86

// (See cpu/vec.hpp.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

SAPIENS_SEG_VEC512 inline __m512 norm_silu16(__m512 x, const float* scale, const float* shift) {
  return silu16(_mm512_fmadd_ps(x, _mm512_loadu_ps(scale), _mm512_loadu_ps(shift)));
}

// The last C % 16 channels go through a zero-padded copy of 16, so every load and store is a
// whole vector (the sums' accumulators are padded to match).
template <typename T>
SAPIENS_SEG_VEC512 void norm_silu_row_avx512(const void* xv, void* yv, const float* scale,
                                             const float* shift, int64_t C) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  int64_t c = 0;
  for (; c + 16 <= C; c += 16) store16(y + c, norm_silu16(load16(x + c), scale + c, shift + c));
  if (c < C) {
    const auto t = static_cast<size_t>(C - c);
    T xb[16] = {}, yb[16];
    float sb[16] = {}, hb[16] = {};
    std::memcpy(xb, x + c, t * sizeof(T));
    std::memcpy(sb, scale + c, t * sizeof(float));
    std::memcpy(hb, shift + c, t * sizeof(float));
    store16(yb, norm_silu16(load16(xb), sb, hb));
    std::memcpy(y + c, yb, t * sizeof(T));
  }
}

// (Lambdas do not inherit a function's target attribute, hence a function of its own.)
SAPIENS_SEG_VEC512 inline void sum16(__m512 v, const float* shift, float* a1, float* a2) {
  const __m512 d = _mm512_sub_ps(v, _mm512_loadu_ps(shift));
  _mm512_storeu_ps(a1, _mm512_add_ps(_mm512_loadu_ps(a1), d));
  _mm512_storeu_ps(a2, _mm512_fmadd_ps(d, d, _mm512_loadu_ps(a2)));
}

template <typename T>
SAPIENS_SEG_VEC512 void sum_row_avx512(const void* xv, const float* shift, float* a1, float* a2,
                                       int64_t C) {
  const T* x = static_cast<const T*>(xv);
  int64_t c = 0;
  for (; c + 16 <= C; c += 16) sum16(load16(x + c), shift + c, a1 + c, a2 + c);
  if (c < C) {
    T xb[16] = {};
    std::memcpy(xb, x + c, static_cast<size_t>(C - c) * sizeof(T));
    sum16(load16(xb), shift + c, a1 + c, a2 + c);  // shift is padded too (shifted_sums)
  }
}

// ---- AVX2 + FMA + F16C (8 floats) ----

SAPIENS_SEG_VEC256 inline __m256 norm_silu8(__m256 x, const float* scale, const float* shift) {
  return silu8(_mm256_fmadd_ps(x, _mm256_loadu_ps(scale), _mm256_loadu_ps(shift)));
}

template <typename T>
SAPIENS_SEG_VEC256 void norm_silu_row_avx2(const void* xv, void* yv, const float* scale,
                                           const float* shift, int64_t C) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) store8(y + c, norm_silu8(load8(x + c), scale + c, shift + c));
  if (c < C) {
    const auto t = static_cast<size_t>(C - c);
    T xb[8] = {}, yb[8];
    float sb[8] = {}, hb[8] = {};
    std::memcpy(xb, x + c, t * sizeof(T));
    std::memcpy(sb, scale + c, t * sizeof(float));
    std::memcpy(hb, shift + c, t * sizeof(float));
    store8(yb, norm_silu8(load8(xb), sb, hb));
    std::memcpy(y + c, yb, t * sizeof(T));
  }
}

SAPIENS_SEG_VEC256 inline void sum8(__m256 v, const float* shift, float* a1, float* a2) {
  const __m256 d = _mm256_sub_ps(v, _mm256_loadu_ps(shift));
  _mm256_storeu_ps(a1, _mm256_add_ps(_mm256_loadu_ps(a1), d));
  _mm256_storeu_ps(a2, _mm256_fmadd_ps(d, d, _mm256_loadu_ps(a2)));
}

template <typename T>
SAPIENS_SEG_VEC256 void sum_row_avx2(const void* xv, const float* shift, float* a1, float* a2,
                                     int64_t C) {
  const T* x = static_cast<const T*>(xv);
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) sum8(load8(x + c), shift + c, a1 + c, a2 + c);
  if (c < C) {
    T xb[8] = {};
    std::memcpy(xb, x + c, static_cast<size_t>(C - c) * sizeof(T));
    sum8(load8(xb), shift + c, a1 + c, a2 + c);
  }
}

#pragma GCC diagnostic pop
#endif  // SAPIENS_SEG_X86

constexpr int64_t kLanes = 16;  // the widest vector in floats: accumulator and shift padding

template <typename T>
NormRow norm_row_for(VecIsa isa) {
#ifdef SAPIENS_SEG_X86
  if (isa == VecIsa::kAvx512) return norm_silu_row_avx512<T>;
  if (isa == VecIsa::kAvx2) return norm_silu_row_avx2<T>;
#endif
  (void)isa;
  return norm_silu_row_scalar<T>;
}

template <typename T>
SumRow sum_row_for(VecIsa isa) {
#ifdef SAPIENS_SEG_X86
  if (isa == VecIsa::kAvx512) return sum_row_avx512<T>;
  if (isa == VecIsa::kAvx2) return sum_row_avx2<T>;
#endif
  (void)isa;
  return sum_row_scalar<T>;
}

template <typename Fn>
auto for_dtype(at::ScalarType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case at::kFloat:
      return fn(float{});
    case at::kBFloat16:
      return fn(c10::BFloat16{});
    case at::kHalf:
      return fn(c10::Half{});
    default:
      throw Error(ErrorCode::kInvalidInput, std::string(what) +
                                                ": float32, bfloat16 or float16 "
                                                "maps only, got " +
                                                c10::toString(dtype));
  }
}

void check_cpu_float(const at::Tensor& t, int64_t C, const char* what) {
  if (!t.device().is_cpu() || t.scalar_type() != at::kFloat || t.numel() != C ||
      !t.is_contiguous()) {
    throw Error(ErrorCode::kInvalidInput, std::string(what) +
                                              " must be a contiguous float32 CPU tensor of the "
                                              "maps' channel count");
  }
}

// A tensor of up to 3 dims with a contiguous last dim as rows of C elements: row r at element
// offset (r / inner) * outer_stride + (r % inner) * inner_stride.
struct Rows {
  int64_t count = 1, inner = 1, outer_stride = 0, inner_stride = 0;
  explicit Rows(const at::Tensor& t) {
    const int64_t d = t.dim();
    if (d < 1 || d > 3 || t.stride(-1) != 1) {
      throw Error(ErrorCode::kInvalidInput,
                  "norm_silu: maps of 1 to 3 dims with a contiguous last dim only");
    }
    if (d >= 2) {
      inner = t.size(d - 2);
      inner_stride = t.stride(d - 2);
    }
    if (d == 3) outer_stride = t.stride(0);
    count = inner * (d == 3 ? t.size(0) : 1);
  }
  int64_t offset(int64_t r) const {
    return (r / inner) * outer_stride + (r % inner) * inner_stride;
  }
};

}  // namespace

void norm_silu(const at::Tensor& out, const at::Tensor& x, const at::Tensor& scale,
               const at::Tensor& shift, VecIsa isa) {
  if (!x.device().is_cpu() || !out.device().is_cpu() || out.sizes() != x.sizes() ||
      out.scalar_type() != x.scalar_type()) {
    throw Error(ErrorCode::kInvalidInput,
                "norm_silu: out must be a CPU map of x's shape and dtype");
  }
  const int64_t C = x.size(-1);
  check_cpu_float(scale, C, "norm_silu: scale");
  check_cpu_float(shift, C, "norm_silu: shift");
  const Rows xr(x), yr(out);
  const NormRow row = for_dtype(x.scalar_type(), "norm_silu", [&](auto t) {
    return norm_row_for<decltype(t)>(resolve_vec_isa(isa));
  });
  const int64_t elem = static_cast<int64_t>(x.element_size());
  const char* xb = static_cast<const char*>(x.const_data_ptr());
  char* yb = static_cast<char*>(out.data_ptr());
  const float* sc = scale.const_data_ptr<float>();
  const float* sh = shift.const_data_ptr<float>();
  // Chunks of about 64 KiB of input per task.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, C * elem));
  at::parallel_for(0, xr.count, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      row(xb + xr.offset(r) * elem, yb + yr.offset(r) * elem, sc, sh, C);
    }
  });
}

void shifted_sums(const at::Tensor& x, int64_t count, int64_t group, int64_t group_stride,
                  const float* shift, double* s1, double* s2, VecIsa isa) {
  const int64_t C = x.size(-1);
  const int64_t Cp = (C + kLanes - 1) / kLanes * kLanes;
  const SumRow row = for_dtype(x.scalar_type(), "shifted_sums", [&](auto t) {
    return sum_row_for<decltype(t)>(resolve_vec_isa(isa));
  });
  const int64_t elem = static_cast<int64_t>(x.element_size());
  const char* base = static_cast<const char*>(x.const_data_ptr());
  std::vector<float> shift_p(static_cast<size_t>(Cp), 0.0f);
  std::copy(shift, shift + C, shift_p.begin());
  const int threads = at::get_num_threads();
  std::vector<double> part(static_cast<size_t>(threads) * 2 * C, 0.0);
  constexpr int64_t kBlock = 64;  // pixels summed in float32 before moving to float64
  at::parallel_for(0, (count + kBlock - 1) / kBlock, 1, [&](int64_t b0, int64_t b1) {
    double* d1 = part.data() + static_cast<size_t>(at::get_thread_num()) * 2 * C;
    double* d2 = d1 + C;
    std::vector<float> a1(static_cast<size_t>(Cp)), a2(static_cast<size_t>(Cp));
    for (int64_t blk = b0; blk < b1; ++blk) {
      std::fill(a1.begin(), a1.end(), 0.0f);
      std::fill(a2.begin(), a2.end(), 0.0f);
      for (int64_t p = blk * kBlock; p < std::min(count, (blk + 1) * kBlock); ++p) {
        row(base + ((p / group) * group_stride + (p % group) * C) * elem, shift_p.data(), a1.data(),
            a2.data(), C);
      }
      for (int64_t c = 0; c < C; ++c) {
        d1[c] += a1[static_cast<size_t>(c)];
        d2[c] += a2[static_cast<size_t>(c)];
      }
    }
  });
  for (int64_t c = 0; c < C; ++c) {
    s1[c] = 0;
    s2[c] = 0;
    for (int t = 0; t < threads; ++t) {
      s1[c] += part[static_cast<size_t>(t) * 2 * C + static_cast<size_t>(c)];
      s2[c] += part[static_cast<size_t>(t) * 2 * C + static_cast<size_t>(C + c)];
    }
  }
}

}  // namespace sapiens_seg::core::head
