#include "channel_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "../cpuid.hpp"
#include "sapiens_seg/error.hpp"

#ifdef SAPIENS_SEG_X86
#include <immintrin.h>
#define SAPIENS_SEG_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define SAPIENS_SEG_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace sapiens_seg::core::head {
namespace {

// One row (C channels) of each pass, for one storage dtype and one instruction set. Pointers are
// to the row's first element; the sums' accumulators a1, a2 hold at least C floats, rounded up
// to the vector width.
using NormRow = void (*)(const void* x, void* y, const float* scale, const float* shift, int64_t C);
using SumRow = void (*)(const void* x, const float* shift, float* a1, float* a2, int64_t C);

// ---- scalar: any CPU, the reference the vector loops are tested against ----------------------

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

// GCC 12's AVX-512 headers pass an undefined vector as the unused merge source of unmasked
// conversions (cvtepu16, cvtph, slli), which -Wmaybe-uninitialized reports once inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// exp(x) in float32, the same steps in both widths (so the AVX2 and AVX-512 loops agree to the
// bit): n = round(x / ln 2), r = x - n ln 2 with ln 2 split in two (Cody and Waite), a degree-6
// polynomial for exp(r) on |r| <= ln(2)/2 (Cephes' expf coefficients, about 1 ulp), times 2^n
// built in the exponent bits. x is clamped to [-87.3, 88] so that 2^n stays a normal float; SiLU
// needs nothing beyond: there 1 + exp(-z) only has to be huge or 1.
constexpr float kExpLo = -87.3f, kExpHi = 88.0f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

// ---- AVX-512 (16 floats) ----

SAPIENS_SEG_AVX512 inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
SAPIENS_SEG_AVX512 inline __m512 load16(const c10::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
SAPIENS_SEG_AVX512 inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
SAPIENS_SEG_AVX512 inline void store16(float* p, __m512 v) {
  _mm512_storeu_ps(p, v);
}
// Round to nearest even, NaN to the quiet NaN 0x7FC0: c10::BFloat16's own conversion.
SAPIENS_SEG_AVX512 inline void store16(c10::BFloat16* p, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
SAPIENS_SEG_AVX512 inline void store16(c10::Half* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

SAPIENS_SEG_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpLo)), _mm512_set1_ps(kExpHi));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP0);
  for (const float k : {kP1, kP2, kP3, kP4, kP5}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(k));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

SAPIENS_SEG_AVX512 inline __m512 norm_silu16(__m512 x, const float* scale, const float* shift) {
  const __m512 z = _mm512_fmadd_ps(x, _mm512_loadu_ps(scale), _mm512_loadu_ps(shift));
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), z));
  return _mm512_div_ps(z, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// The last C % 16 channels go through a zero-padded copy of 16, so every load and store is a
// whole vector (the sums' accumulators are padded to match).
template <typename T>
SAPIENS_SEG_AVX512 void norm_silu_row_avx512(const void* xv, void* yv, const float* scale,
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
SAPIENS_SEG_AVX512 inline void sum16(__m512 v, const float* shift, float* a1, float* a2) {
  const __m512 d = _mm512_sub_ps(v, _mm512_loadu_ps(shift));
  _mm512_storeu_ps(a1, _mm512_add_ps(_mm512_loadu_ps(a1), d));
  _mm512_storeu_ps(a2, _mm512_fmadd_ps(d, d, _mm512_loadu_ps(a2)));
}

template <typename T>
SAPIENS_SEG_AVX512 void sum_row_avx512(const void* xv, const float* shift, float* a1, float* a2,
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

SAPIENS_SEG_AVX2 inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
SAPIENS_SEG_AVX2 inline __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
SAPIENS_SEG_AVX2 inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
SAPIENS_SEG_AVX2 inline void store8(float* p, __m256 v) {
  _mm256_storeu_ps(p, v);
}
SAPIENS_SEG_AVX2 inline void store8(c10::BFloat16* p, __m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
  // Values fit 16 bits: packus keeps them; it packs within 128-bit lanes, hence the split.
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
SAPIENS_SEG_AVX2 inline void store8(c10::Half* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

SAPIENS_SEG_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  for (const float k : {kP1, kP2, kP3, kP4, kP5}) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(k));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

SAPIENS_SEG_AVX2 inline __m256 norm_silu8(__m256 x, const float* scale, const float* shift) {
  const __m256 z = _mm256_fmadd_ps(x, _mm256_loadu_ps(scale), _mm256_loadu_ps(shift));
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), z));
  return _mm256_div_ps(z, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

template <typename T>
SAPIENS_SEG_AVX2 void norm_silu_row_avx2(const void* xv, void* yv, const float* scale,
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

SAPIENS_SEG_AVX2 inline void sum8(__m256 v, const float* shift, float* a1, float* a2) {
  const __m256 d = _mm256_sub_ps(v, _mm256_loadu_ps(shift));
  _mm256_storeu_ps(a1, _mm256_add_ps(_mm256_loadu_ps(a1), d));
  _mm256_storeu_ps(a2, _mm256_fmadd_ps(d, d, _mm256_loadu_ps(a2)));
}

template <typename T>
SAPIENS_SEG_AVX2 void sum_row_avx2(const void* xv, const float* shift, float* a1, float* a2,
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

ChannelIsa resolve(ChannelIsa isa) {
  if (isa == ChannelIsa::kAuto) {
    for (const ChannelIsa i : {ChannelIsa::kAvx512, ChannelIsa::kAvx2}) {
      if (channel_isa_runs(i)) return i;
    }
    return ChannelIsa::kScalar;
  }
  if (!channel_isa_runs(isa)) {
    throw Error(ErrorCode::kInvalidInput,
                std::string("the CPU head's ") + to_string(isa) + " loops cannot run on this CPU");
  }
  return isa;
}

constexpr int64_t kLanes = 16;  // the widest vector in floats: accumulator and shift padding

template <typename T>
NormRow norm_row_for(ChannelIsa isa) {
#ifdef SAPIENS_SEG_X86
  if (isa == ChannelIsa::kAvx512) return norm_silu_row_avx512<T>;
  if (isa == ChannelIsa::kAvx2) return norm_silu_row_avx2<T>;
#endif
  (void)isa;
  return norm_silu_row_scalar<T>;
}

template <typename T>
SumRow sum_row_for(ChannelIsa isa) {
#ifdef SAPIENS_SEG_X86
  if (isa == ChannelIsa::kAvx512) return sum_row_avx512<T>;
  if (isa == ChannelIsa::kAvx2) return sum_row_avx2<T>;
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

const char* to_string(ChannelIsa isa) {
  switch (isa) {
    case ChannelIsa::kScalar:
      return "scalar";
    case ChannelIsa::kAvx2:
      return "avx2";
    case ChannelIsa::kAvx512:
      return "avx512";
    default:
      return "auto";
  }
}

bool channel_isa_runs(ChannelIsa isa) {
  const CpuFeatures& f = host_cpu_features();
  switch (isa) {
    case ChannelIsa::kAvx512:
      return f.avx512_core();
    case ChannelIsa::kAvx2:
      return f.avx2_fma_f16c();
    default:
      return true;
  }
}

void norm_silu(const at::Tensor& out, const at::Tensor& x, const at::Tensor& scale,
               const at::Tensor& shift, ChannelIsa isa) {
  if (!x.device().is_cpu() || !out.device().is_cpu() || out.sizes() != x.sizes() ||
      out.scalar_type() != x.scalar_type()) {
    throw Error(ErrorCode::kInvalidInput,
                "norm_silu: out must be a CPU map of x's shape and dtype");
  }
  const int64_t C = x.size(-1);
  check_cpu_float(scale, C, "norm_silu: scale");
  check_cpu_float(shift, C, "norm_silu: shift");
  const Rows xr(x), yr(out);
  const NormRow row = for_dtype(x.scalar_type(), "norm_silu",
                                [&](auto t) { return norm_row_for<decltype(t)>(resolve(isa)); });
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
                  const float* shift, double* s1, double* s2, ChannelIsa isa) {
  const int64_t C = x.size(-1);
  const int64_t Cp = (C + kLanes - 1) / kLanes * kLanes;
  const SumRow row = for_dtype(x.scalar_type(), "shifted_sums",
                               [&](auto t) { return sum_row_for<decltype(t)>(resolve(isa)); });
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
