#include "cpu_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "../cpu/aten_arith.hpp"
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

// ---- float32 and bf16, fused with LibTorch's roundings ------------------------------------------

namespace {

namespace arith = cpu::aten_arith;

// A contiguous CPU map of the fused passes' dtype (float32 or bf16), all operands alike.
void need_map(const at::Tensor& t, at::ScalarType dtype, const char* what, const char* fn) {
  if (!t.device().is_cpu() || t.scalar_type() != dtype || !t.is_contiguous()) {
    throw Error(ErrorCode::kInvalidInput, std::string(fn) + ": " + what +
                                              " must be a contiguous CPU tensor of the map's " +
                                              "dtype (float32 or bfloat16)");
  }
}

at::ScalarType map_dtype(const at::Tensor& t, const char* fn) {
  if (!t.defined() || (t.scalar_type() != at::kFloat && t.scalar_type() != at::kBFloat16)) {
    throw Error(ErrorCode::kInvalidInput, std::string(fn) + ": float32 or bfloat16 maps only");
  }
  return t.scalar_type();
}

void need_same_shape(const at::Tensor& a, const at::Tensor& b, const char* what, const char* fn) {
  if (a.sizes() != b.sizes()) {
    throw Error(ErrorCode::kInvalidInput, std::string(fn) + ": " + what + " differ in shape");
  }
}

// Rows of D per task: whole rows, a few thousand elements at least.
int64_t row_grain(int64_t D) {
  return std::max<int64_t>(1, 4096 / std::max<int64_t>(D, 1));
}

// The element type the kernels take for a map: float, or bf16 as raw bits.
template <class S>
const S* cptr(const at::Tensor& t) {
  return t.defined() ? static_cast<const S*>(t.const_data_ptr()) : nullptr;
}
template <class S>
S* mptr(const at::Tensor& t) {
  return t.defined() ? static_cast<S*>(t.data_ptr()) : nullptr;
}

template <class S>
const arith::Kernels<S>& kernels_for();
template <>
const arith::Kernels<float>& kernels_for<float>() {
  return arith::kernels(arith::libtorch_isa());
}
template <>
const arith::Kernels<std::uint16_t>& kernels_for<std::uint16_t>() {
  return arith::kernels_bf16(arith::libtorch_isa());
}

template <class F>
void by_dtype(at::ScalarType t, const F& f) {
  if (t == at::kFloat) {
    f(float{});
  } else {
    f(std::uint16_t{});
  }
}

}  // namespace

void fused_rms_norm(const at::Tensor& y, const at::Tensor& x, const at::Tensor& w, double eps) {
  const char* fn = "fused_rms_norm";
  const at::ScalarType t = map_dtype(x, fn);
  need_map(x, t, "x", fn);
  need_map(y, t, "y", fn);
  need_map(w, t, "the weight", fn);
  need_same_shape(x, y, "x and y", fn);
  const int64_t D = x.dim() > 0 ? x.size(-1) : 1, rows = D > 0 ? x.numel() / D : 0;
  if (w.numel() != D)
    throw Error(ErrorCode::kInvalidInput, "fused_rms_norm: weight of the wrong size");
  const auto e = static_cast<float>(eps);  // rms_norm takes eps as a float for these dtypes
  by_dtype(t, [&](auto tag) {
    using S = decltype(tag);
    const arith::Kernels<S>& k = kernels_for<S>();
    const S* xp = cptr<S>(x);
    const S* wp = cptr<S>(w);
    S* yp = mptr<S>(y);
    at::parallel_for(0, rows, row_grain(D), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) k.rms_norm(xp + r * D, wp, e, yp + r * D, D);
    });
  });
}

void fused_add_rms_norm(const at::Tensor& z, const at::Tensor& x, const at::Tensor& p,
                        const at::Tensor& gamma, const at::Tensor& w, double eps,
                        const at::Tensor& h) {
  const char* fn = "fused_add_rms_norm";
  const at::ScalarType t = map_dtype(z, fn);
  need_map(z, t, "z", fn);
  need_map(x, t, "x", fn);
  need_map(p, t, "p", fn);
  need_same_shape(z, x, "z and x", fn);
  need_same_shape(z, p, "z and p", fn);
  const int64_t D = z.dim() > 0 ? z.size(-1) : 1, rows = D > 0 ? z.numel() / D : 0;
  if (gamma.defined()) {
    need_map(gamma, t, "gamma", fn);
    if (gamma.numel() != D) {
      throw Error(ErrorCode::kInvalidInput, "fused_add_rms_norm: gamma of the wrong size");
    }
  }
  if (w.defined()) {
    need_map(w, t, "the weight", fn);
    need_map(h, t, "h", fn);
    need_same_shape(z, h, "z and h", fn);
    if (w.numel() != D) {
      throw Error(ErrorCode::kInvalidInput, "fused_add_rms_norm: weight of the wrong size");
    }
    if (h.data_ptr() == z.data_ptr() || h.data_ptr() == x.data_ptr() ||
        h.data_ptr() == p.data_ptr()) {
      throw Error(ErrorCode::kInvalidInput, "fused_add_rms_norm: h must not alias z, x or p");
    }
  }
  const auto e = static_cast<float>(eps);
  by_dtype(t, [&](auto tag) {
    using S = decltype(tag);
    const arith::Kernels<S>& k = kernels_for<S>();
    const S *xp = cptr<S>(x), *pp = cptr<S>(p), *gp = cptr<S>(gamma);
    const S* wp = w.defined() ? cptr<S>(w) : nullptr;
    S* zp = mptr<S>(z);
    S* hp = w.defined() ? mptr<S>(h) : nullptr;
    at::parallel_for(0, rows, row_grain(D), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        k.add_rms_norm(xp + r * D, pp + r * D, gp, zp + r * D, wp, e, hp ? hp + r * D : nullptr, D);
      }
    });
  });
}

void fused_qk_norm_rope(const at::Tensor& out, const at::Tensor& proj, int64_t heads,
                        const at::Tensor& w, double eps, const at::Tensor& cos,
                        const at::Tensor& sin, int64_t pre, int64_t repeat) {
  const char* fn = "fused_qk_norm_rope";
  const at::ScalarType dt = map_dtype(proj, fn);
  // out may be a head-major [B, H, N, hd] map or a token-major one's transposed view ([B, N, H,
  // hd] in memory, what LibTorch's attention then writes its output like): rows of hd contiguous.
  if (!out.device().is_cpu() || out.scalar_type() != dt || out.dim() != 4 || out.stride(3) != 1) {
    throw Error(ErrorCode::kInvalidInput,
                "fused_qk_norm_rope: out must be a CPU tensor of the map's dtype with contiguous "
                "rows of hd");
  }
  need_map(proj, dt, "the projection", fn);
  need_map(w, dt, "the weight", fn);
  if (proj.dim() != 3 || heads <= 0 || repeat <= 0 || proj.size(2) % heads != 0) {
    throw Error(ErrorCode::kInvalidInput,
                "fused_qk_norm_rope: the projection must be [B, N, heads * hd]");
  }
  const int64_t B = proj.size(0), N = proj.size(1), hd = proj.size(2) / heads;
  if (hd > arith::kMaxHeadDim || hd % 2 != 0 || w.numel() != hd) {
    throw Error(ErrorCode::kInvalidInput, "fused_qk_norm_rope: head dim must be even, at most " +
                                              std::to_string(arith::kMaxHeadDim) +
                                              ", as the weight");
  }
  if (out.sizes() != at::IntArrayRef({B, heads * repeat, N, hd})) {
    throw Error(ErrorCode::kInvalidInput,
                "fused_qk_norm_rope: out must be [B, heads * repeat, N, hd]");
  }
  if (pre < 0 || pre > N || !cos.device().is_cpu() || cos.scalar_type() != at::kBFloat16 ||
      !cos.is_contiguous() || cos.sizes() != at::IntArrayRef({N - pre, hd}) ||
      !sin.device().is_cpu() || sin.scalar_type() != at::kBFloat16 || !sin.is_contiguous() ||
      sin.sizes() != cos.sizes()) {
    throw Error(ErrorCode::kInvalidInput,
                "fused_qk_norm_rope: cos and sin must be contiguous bf16 CPU tables [N - pre, hd]");
  }
  const auto* cp = reinterpret_cast<const std::uint16_t*>(cos.const_data_ptr<at::BFloat16>());
  const auto* sp = reinterpret_cast<const std::uint16_t*>(sin.const_data_ptr<at::BFloat16>());
  const auto e = static_cast<float>(eps);
  const int64_t C = heads * hd;
  const int64_t sb = out.stride(0), sh = out.stride(1), sn = out.stride(2);
  by_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    const arith::Kernels<S>& k = kernels_for<S>();
    const S* xp = cptr<S>(proj);
    const S* wp = cptr<S>(w);
    S* op = mptr<S>(out);
    // One token's heads per step.
    at::parallel_for(0, B * N, std::max<int64_t>(1, 4096 / C), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / N, n = t % N;
        const bool rotated = n >= pre;
        const std::uint16_t* c = rotated ? cp + (n - pre) * hd : nullptr;
        const std::uint16_t* s = rotated ? sp + (n - pre) * hd : nullptr;
        for (int64_t j = 0; j < heads; ++j) {
          S* first = op + b * sb + j * repeat * sh + n * sn;
          k.qk_norm_rope(xp + t * C + j * hd, wp, e, c, s, first, hd);
          for (int64_t r = 1; r < repeat; ++r) {
            std::memcpy(first + r * sh, first, static_cast<size_t>(hd) * sizeof(S));
          }
        }
      }
    });
  });
}

void fused_swiglu(const at::Tensor& out, const at::Tensor& g) {
  const char* fn = "fused_swiglu";
  const at::ScalarType t = map_dtype(g, fn);
  need_map(out, t, "out", fn);
  need_map(g, t, "g", fn);
  if (g.dim() != 2 || g.size(1) % 2 != 0 || out.dim() != 2 || out.size(0) != g.size(0) ||
      out.size(1) * 2 != g.size(1)) {
    throw Error(ErrorCode::kInvalidInput, "fused_swiglu: g must be [rows, 2F] and out [rows, F]");
  }
  const int64_t rows = g.size(0), F = out.size(1);
  by_dtype(t, [&](auto tag) {
    using S = decltype(tag);
    const arith::Kernels<S>& k = kernels_for<S>();
    const S* gp = cptr<S>(g);
    S* op = mptr<S>(out);
    // LibTorch's silu on the strided half g[:, :F] iterates [rows, F] in 2-D and its
    // TensorIterator hands each thread a range of the rows * F elements (at::parallel_for with
    // its grain): a range may start and end inside a row, and each row piece is one run of its
    // vectorized loop.
    at::parallel_for(0, rows * F, arith::kGrain, [&](int64_t begin, int64_t end) {
      int64_t pos = begin;
      while (pos < end) {
        const int64_t r = pos / F, c = pos % F, n = std::min(F - c, end - pos);
        const S* a = gp + r * 2 * F + c;
        k.silu_mul(a, a + F, op + r * F + c, n);
        pos += n;
      }
    });
  });
}

namespace {

// Where LibTorch's threads start their ranges of a map of n elements (fused_swiglu's split), in
// order, the first (0) included.
std::vector<int64_t> thread_starts(int64_t n) {
  std::vector<int64_t> starts;
  std::mutex m;
  at::parallel_for(0, n, arith::kGrain, [&](int64_t begin, int64_t /*end*/) {
    const std::lock_guard<std::mutex> lock(m);
    starts.push_back(begin);
  });
  std::sort(starts.begin(), starts.end());
  return starts;
}

// silu_mul over n elements, all taken as `vector` says: through the pairs of vectors (the last
// partial pair through a padded copy: the lanes are independent) or through the scalar formula
// (runs of one element).
template <class S>
void silu_mul_as(const arith::Kernels<S>& k, const S* g, const S* u, S* out, int64_t n, bool vector,
                 int64_t step) {
  if (!vector) {
    for (int64_t i = 0; i < n; ++i) k.silu_mul(g + i, u + i, out + i, 1);
    return;
  }
  const int64_t whole = n - n % step;
  k.silu_mul(g, u, out, whole);
  if (whole == n) return;
  constexpr int64_t kMaxStep = 64;  // 2 AVX-512 vectors of bf16
  S ga[kMaxStep] = {}, ua[kMaxStep] = {}, oa[kMaxStep];
  std::copy(g + whole, g + n, ga);
  std::copy(u + whole, u + n, ua);
  k.silu_mul(ga, ua, oa, step);
  std::copy(oa, oa + (n - whole), out + whole);
}

}  // namespace

void fused_swiglu_columns(const at::Tensor& out, const at::Tensor& g, const at::Tensor& u,
                          int64_t col) {
  const char* fn = "fused_swiglu_columns";
  const at::ScalarType t = map_dtype(out, fn);
  need_map(out, t, "out", fn);
  need_map(g, t, "g", fn);
  need_map(u, t, "u", fn);
  if (out.dim() != 2 || g.dim() != 2 || g.sizes() != u.sizes() || g.size(0) != out.size(0) ||
      col < 0 || col + g.size(1) > out.size(1)) {
    throw Error(ErrorCode::kInvalidInput,
                "fused_swiglu_columns: g and u must be [rows, w], out [rows, F] with the columns "
                "[col, col + w) inside it");
  }
  const int64_t rows = out.size(0), F = out.size(1), w = g.size(1), end = col + w;
  // The whole pass's runs: each row is one run unless a thread's range starts inside it.
  const std::vector<int64_t> starts = thread_starts(rows * F);
  by_dtype(t, [&](auto tag) {
    using S = decltype(tag);
    const arith::Kernels<S>& k = kernels_for<S>();
    // Elements per step of LibTorch's loop: two vectors, of bf16 twice as many as float lanes.
    constexpr int64_t kPerLane = std::is_same_v<S, float> ? 1 : 2;
    const int64_t step = 2 * arith::lanes(arith::libtorch_isa()) * kPerLane;
    const S *gp = cptr<S>(g), *up = cptr<S>(u);
    S* op = mptr<S>(out);
    at::parallel_for(
        0, rows, std::max<int64_t>(1, arith::kGrain / std::max<int64_t>(w, 1)),
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const S* gr = gp + r * w;  // column col of the map
            const S* ur = up + r * w;
            S* orow = op + r * F;
            // A run [a, b) of the whole pass: pairs of vectors up to b - (b - a) %
            // step, the scalar formula after; this chunk takes its part of each.
            auto run = [&](int64_t a, int64_t b) {
              const int64_t v = b - (b - a) % step;
              const int64_t v0 = std::max(a, col), v1 = std::min(v, end);
              if (v0 < v1) {
                silu_mul_as(k, gr + (v0 - col), ur + (v0 - col), orow + v0, v1 - v0, true, step);
              }
              const int64_t s0 = std::max(v, col), s1 = std::min(b, end);
              if (s0 < s1) {
                silu_mul_as(k, gr + (s0 - col), ur + (s0 - col), orow + s0, s1 - s0, false, step);
              }
            };
            const int64_t row0 = r * F;
            auto it = std::upper_bound(starts.begin(), starts.end(), row0);
            int64_t a = 0;
            for (; it != starts.end() && *it < row0 + F; ++it) {
              run(a, *it - row0);
              a = *it - row0;
            }
            run(a, F);
          }
        });
  });
}

}  // namespace sapiens_seg::core::v2
