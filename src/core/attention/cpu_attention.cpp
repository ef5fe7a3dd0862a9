#include "cpu_attention.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../cpuid.hpp"
#include "sapiens_seg/error.hpp"

#ifdef SAPIENS_SEG_X86
#include <immintrin.h>
#define SAPIENS_SEG_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))
#define SAPIENS_SEG_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512bf16")))
#endif

namespace sapiens_seg::core::attention {

namespace {

// Register tiles: kRows query rows by 4 vectors of 16 keys (24 accumulators of the 32 ZMM
// registers) for the scores, kRows rows by up to 4 vectors of the head dim for the weighted sum
// of V (half as many rows for head dims over 64).
constexpr int64_t kRows = 6;
constexpr int64_t kLanes = 16;        // floats per ZMM register
constexpr int64_t kCols = 64;         // keys per score tile; N is padded to a multiple of it
constexpr int64_t kMaxHeadDim = 128;  // 8 vectors of 16
constexpr int64_t kTaskRows = 8 * kRows;

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

struct Shape {
  int64_t B = 0, Hq = 0, Hk = 0, N = 0, hd = 0;
  int64_t npad = 0;  // N rounded up to kCols: the packed keys' and the score rows' length
  int64_t nv = 0;    // head-dim vectors of 16: the packed V rows' and the output tiles' width
  int64_t group() const { return Hq / Hk; }
};

// Element (b, h, n, 0) of a [B, H, N, hd] tensor with a contiguous last dim.
template <typename T>
const T* row_ptr(const at::Tensor& t, int64_t b, int64_t h, int64_t n) {
  return t.const_data_ptr<T>() + b * t.stride(0) + h * t.stride(1) + n * t.stride(2);
}

std::uint32_t bf16_pair(const at::BFloat16* p) {  // p[0] in the low half, as VDPBF16PS pairs them
  std::uint32_t w = 0;
  std::memcpy(&w, p, sizeof w);
  return w;
}

std::uint32_t bf16_pair(at::BFloat16 lo, at::BFloat16 hi) {
  return static_cast<std::uint32_t>(lo.x) | (static_cast<std::uint32_t>(hi.x) << 16);
}

// Per (batch, kv head): K as score-tile panels and V as rows of head-dim vectors, zero-padded to
// npad keys, so that the inner loops read whole vectors with no bounds checks.
//
// bfloat16 (32-bit words of two bf16, what VDPBF16PS multiplies pairwise and sums):
//   K: [npad/64][hd/2][64]: word (tile, p, l) = K[tile*64 + l][2p, 2p+1]
//   V: [npad/2][nv*16]:     word (t, d)       = (V[2t][d], V[2t+1][d])
// float32:
//   K: [npad/64][hd][64]:   (tile, d, l) = K[tile*64 + l][d]
//   V: [npad][nv*16]:       (t, d)       = V[t][d]
struct Packed {
  std::vector<std::uint32_t> k16, v16;
  std::vector<float> k32, v32;
  int64_t k_size = 0, v_size = 0;  // elements per (batch, kv head)
};

void pack_bf16(const at::Tensor& k, const at::Tensor& v, const Shape& s, Packed& out) {
  const int64_t pairs = s.hd / 2, width = s.nv * 16;
  out.k_size = s.npad * pairs;
  out.v_size = s.npad / 2 * width;
  out.k16.assign(static_cast<size_t>(s.B * s.Hk * out.k_size), 0);
  out.v16.assign(static_cast<size_t>(s.B * s.Hk * out.v_size), 0);
  at::parallel_for(0, s.B * s.Hk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.Hk, h = bh % s.Hk;
      std::uint32_t* kp = out.k16.data() + bh * out.k_size;
      std::uint32_t* vp = out.v16.data() + bh * out.v_size;
      for (int64_t n = 0; n < s.N; ++n) {
        const at::BFloat16* kr = row_ptr<at::BFloat16>(k, b, h, n);
        std::uint32_t* kt = kp + (n / kCols) * pairs * kCols + n % kCols;
        for (int64_t p = 0; p < pairs; ++p) kt[p * kCols] = bf16_pair(kr + 2 * p);
      }
      for (int64_t t = 0; 2 * t < s.N; ++t) {
        const at::BFloat16* v0 = row_ptr<at::BFloat16>(v, b, h, 2 * t);
        const at::BFloat16* v1 = 2 * t + 1 < s.N ? v0 + v.stride(2) : nullptr;
        std::uint32_t* vr = vp + t * width;
        for (int64_t d = 0; d < s.hd; ++d) vr[d] = bf16_pair(v0[d], v1 ? v1[d] : at::BFloat16(0));
      }
    }
  });
}

void pack_f32(const at::Tensor& k, const at::Tensor& v, const Shape& s, Packed& out) {
  const int64_t width = s.nv * 16;
  out.k_size = s.npad * s.hd;
  out.v_size = s.npad * width;
  out.k32.assign(static_cast<size_t>(s.B * s.Hk * out.k_size), 0.f);
  out.v32.assign(static_cast<size_t>(s.B * s.Hk * out.v_size), 0.f);
  at::parallel_for(0, s.B * s.Hk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.Hk, h = bh % s.Hk;
      float* kp = out.k32.data() + bh * out.k_size;
      float* vp = out.v32.data() + bh * out.v_size;
      for (int64_t n = 0; n < s.N; ++n) {
        const float* kr = row_ptr<float>(k, b, h, n);
        float* kt = kp + (n / kCols) * s.hd * kCols + n % kCols;
        for (int64_t d = 0; d < s.hd; ++d) kt[d * kCols] = kr[d];
        std::memcpy(vp + n * width, row_ptr<float>(v, b, h, n),
                    static_cast<size_t>(s.hd) * sizeof(float));
      }
    }
  });
}

#ifdef SAPIENS_SEG_X86

// GCC 12's AVX-512 headers pass _mm512_undefined_ps() as the unused merge source of unmasked
// intrinsics (max, roundscale, scalef), which -Wuninitialized reports once they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// 2^x for x <= 0 (NaN stays NaN): 2^round(x) * a degree-6 Taylor polynomial of 2^f on
// |f| <= 1/2 (relative error under 1.2e-7, about one float32 ulp); below -127 the result is 0
// or a denormal, as the true value rounds.
SAPIENS_SEG_AVX512 inline __m512 exp2_nonpositive(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-127.f), x);  // max(a, NaN) is NaN: the second operand wins
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  // ln(2)^i / i!
  __m512 p = _mm512_set1_ps(1.540353039338161e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.333355814642844e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

SAPIENS_SEG_AVX512 inline __mmask16 tail_mask(int64_t j, int64_t n) {
  if (j + 16 <= n) return 0xFFFF;
  if (j >= n) return 0;
  return static_cast<__mmask16>((1u << (n - j)) - 1);
}

SAPIENS_SEG_AVX512 float row_max(const float* s, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask(j, n);
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, s + j));
  }
  return _mm512_reduce_max_ps(m);
}

// exp(c * (s[j] - max)) for j < n, 0 for n <= j < npad, into e (float32 or bfloat16); returns
// the float32 sum of the unrounded values. c = scale * log2(e).
SAPIENS_SEG_AVX512 inline __m512 softmax_numerator(const float* s, int64_t j, int64_t n, __m512 vm,
                                                   __m512 vc) {
  const __m512 x = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm), vc);
  return _mm512_maskz_mov_ps(tail_mask(j, n), exp2_nonpositive(x));
}

SAPIENS_SEG_AVX512 float softmax_row(const float* s, int64_t n, int64_t npad, float c, float* e) {
  const __m512 vm = _mm512_set1_ps(row_max(s, n)), vc = _mm512_set1_ps(c);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < npad; j += 16) {
    const __m512 x = softmax_numerator(s, j, n, vm, vc);
    sum = _mm512_add_ps(sum, x);
    _mm512_storeu_ps(e + j, x);
  }
  return _mm512_reduce_add_ps(sum);
}

SAPIENS_SEG_AVX512BF16 float softmax_row(const float* s, int64_t n, int64_t npad, float c,
                                         std::uint32_t* e) {
  const __m512 vm = _mm512_set1_ps(row_max(s, n)), vc = _mm512_set1_ps(c);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < npad; j += 16) {
    const __m512 x = softmax_numerator(s, j, n, vm, vc);
    sum = _mm512_add_ps(sum, x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(e + j / 2),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
  }
  return _mm512_reduce_add_ps(sum);
}

// Scores of kRows query rows (q: rows of hd/2 bf16 pairs) against one packed 64-key tile.
SAPIENS_SEG_AVX512BF16 void scores_bf16(const std::uint32_t* q, int64_t pairs,
                                        const std::uint32_t* kt, float* s, int64_t s_stride) {
  __m512 acc[kRows][4];
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const std::uint32_t* kp = kt + p * kCols;
    __m512bh b[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      b[j] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(kp + kLanes * j));
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      const __m512bh a =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(q[i * pairs + p])));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(s + i * s_stride + kLanes * j, acc[i][j]);
}

SAPIENS_SEG_AVX512 void scores_f32(const float* q, int64_t hd, const float* kt, float* s,
                                   int64_t s_stride) {
  __m512 acc[kRows][4];
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < hd; ++d) {
    const float* kp = kt + d * kCols;
    __m512 b[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) b[j] = _mm512_loadu_ps(kp + kLanes * j);
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      const __m512 a = _mm512_set1_ps(q[i * hd + d]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(s + i * s_stride + kLanes * j, acc[i][j]);
}

// o[i][0 .. 16*NV) = sum over keys of e[i][key] * V[key], for MR rows; e16 rows are npad bf16
// (npad/2 pair words), e32 rows npad floats.
template <int MR, int NV>
SAPIENS_SEG_AVX512BF16 void weighted_bf16(const std::uint32_t* e, int64_t e_stride,
                                          const std::uint32_t* vp, int64_t pairs, float* o,
                                          int64_t o_stride) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t t = 0; t < pairs; ++t) {
    const std::uint32_t* vr = vp + t * NV * 16;
    __m512bh b[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j)
      b[j] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(vr + kLanes * j));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh a =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(e[i * e_stride + t])));
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(o + i * o_stride + kLanes * j, acc[i][j]);
}

template <int MR, int NV>
SAPIENS_SEG_AVX512 void weighted_f32(const float* e, int64_t e_stride, const float* vp,
                                     int64_t keys, float* o, int64_t o_stride) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t t = 0; t < keys; ++t) {
    const float* vr = vp + t * NV * 16;
    __m512 b[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) b[j] = _mm512_loadu_ps(vr + kLanes * j);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(e[i * e_stride + t]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(o + i * o_stride + kLanes * j, acc[i][j]);
}

// kRows rows of the weighted sum, in row groups that keep MR * NV accumulators within 24.
template <bool kBf16, int NV>
void weighted_rows(const void* e, int64_t npad, const void* vp, float* o) {
  constexpr int MR = NV <= 4 ? kRows : kRows / 2;
  for (int64_t r = 0; r < kRows; r += MR) {
    if constexpr (kBf16) {
      const auto* ew = static_cast<const std::uint32_t*>(e) + r * (npad / 2);
      weighted_bf16<MR, NV>(ew, npad / 2, static_cast<const std::uint32_t*>(vp), npad / 2,
                            o + r * NV * 16, NV * 16);
    } else {
      const float* ef = static_cast<const float*>(e) + r * npad;
      weighted_f32<MR, NV>(ef, npad, static_cast<const float*>(vp), npad, o + r * NV * 16, NV * 16);
    }
  }
}

template <bool kBf16>
void weighted_any(int64_t nv, const void* e, int64_t npad, const void* vp, float* o) {
  switch (nv) {
    case 1:
      return weighted_rows<kBf16, 1>(e, npad, vp, o);
    case 2:
      return weighted_rows<kBf16, 2>(e, npad, vp, o);
    case 3:
      return weighted_rows<kBf16, 3>(e, npad, vp, o);
    case 4:
      return weighted_rows<kBf16, 4>(e, npad, vp, o);
    case 5:
      return weighted_rows<kBf16, 5>(e, npad, vp, o);
    case 6:
      return weighted_rows<kBf16, 6>(e, npad, vp, o);
    case 7:
      return weighted_rows<kBf16, 7>(e, npad, vp, o);
    default:
      return weighted_rows<kBf16, 8>(e, npad, vp, o);
  }
}

// An output row: o / sum for hd values, rounded to the output dtype.
SAPIENS_SEG_AVX512 void store_row(const float* o, float sum, int64_t hd, float* out) {
  const __m512 vs = _mm512_set1_ps(sum);
  for (int64_t d = 0; d < hd; d += 16) {
    _mm512_mask_storeu_ps(out + d, tail_mask(d, hd), _mm512_div_ps(_mm512_loadu_ps(o + d), vs));
  }
}

SAPIENS_SEG_AVX512BF16 void store_row(const float* o, float sum, int64_t hd, at::BFloat16* out) {
  const __m512 vs = _mm512_set1_ps(sum);
  for (int64_t d = 0; d < hd; d += 16) {
    const __m512 y = _mm512_div_ps(_mm512_loadu_ps(o + d), vs);
    _mm256_mask_storeu_epi16(out + d, tail_mask(d, hd),
                             reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(y)));
  }
}

// One task: query rows [r0, r1) of head h of batch b.
template <bool kBf16>
void attend_rows(const at::Tensor& q, const Shape& s, const Packed& pk, int64_t b, int64_t h,
                 int64_t r0, int64_t r1, float c, at::Tensor& out, std::vector<float>& scores,
                 std::vector<std::uint32_t>& e16, std::vector<float>& e32,
                 std::vector<std::uint32_t>& q16, std::vector<float>& q32,
                 std::vector<float>& acc) {
  const int64_t kvh = h / s.group(), bk = b * s.Hk + kvh, width = s.nv * 16;
  const int64_t pairs = s.hd / 2, out_row = s.Hq * s.hd;
  for (int64_t m0 = r0; m0 < r1; m0 += kRows) {
    const int64_t rows = std::min(kRows, r1 - m0);
    // The tile's query rows, zero-padded to kRows (padded rows' results are never stored).
    if constexpr (kBf16) {
      std::fill(q16.begin(), q16.end(), 0u);
      for (int64_t i = 0; i < rows; ++i) {
        std::memcpy(q16.data() + i * pairs, row_ptr<at::BFloat16>(q, b, h, m0 + i),
                    static_cast<size_t>(s.hd) * 2);
      }
      const std::uint32_t* kp = pk.k16.data() + bk * pk.k_size;
      for (int64_t t = 0; t < s.npad / kCols; ++t) {
        scores_bf16(q16.data(), pairs, kp + t * pairs * kCols, scores.data() + t * kCols, s.npad);
      }
    } else {
      std::fill(q32.begin(), q32.end(), 0.f);
      for (int64_t i = 0; i < rows; ++i) {
        std::memcpy(q32.data() + i * s.hd, row_ptr<float>(q, b, h, m0 + i),
                    static_cast<size_t>(s.hd) * sizeof(float));
      }
      const float* kp = pk.k32.data() + bk * pk.k_size;
      for (int64_t t = 0; t < s.npad / kCols; ++t) {
        scores_f32(q32.data(), s.hd, kp + t * s.hd * kCols, scores.data() + t * kCols, s.npad);
      }
    }
    float sums[kRows];
    for (int64_t i = 0; i < kRows; ++i) {
      const float* si = scores.data() + i * s.npad;
      if constexpr (kBf16) {
        sums[i] = softmax_row(si, s.N, s.npad, c, e16.data() + i * s.npad / 2);
      } else {
        sums[i] = softmax_row(si, s.N, s.npad, c, e32.data() + i * s.npad);
      }
    }
    if constexpr (kBf16) {
      weighted_any<true>(s.nv, e16.data(), s.npad, pk.v16.data() + bk * pk.v_size, acc.data());
    } else {
      weighted_any<false>(s.nv, e32.data(), s.npad, pk.v32.data() + bk * pk.v_size, acc.data());
    }
    using Out = std::conditional_t<kBf16, at::BFloat16, float>;
    for (int64_t i = 0; i < rows; ++i) {
      Out* dst = out.data_ptr<Out>() + (b * s.N + m0 + i) * out_row + h * s.hd;
      store_row(acc.data() + i * width, sums[i], s.hd, dst);
    }
  }
}

template <bool kBf16>
void attend(const at::Tensor& q, const Shape& s, const Packed& pk, at::Tensor& out) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hd)));
  const float c = scale * 1.4426950408889634f;  // exp(x) = 2^(x log2 e)
  const int64_t blocks = (s.N + kTaskRows - 1) / kTaskRows;
  at::parallel_for(0, s.B * s.Hq * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(kRows * s.npad));
    std::vector<std::uint32_t> e16(kBf16 ? static_cast<size_t>(kRows * s.npad / 2) : 0);
    std::vector<float> e32(kBf16 ? 0 : static_cast<size_t>(kRows * s.npad));
    std::vector<std::uint32_t> q16(kBf16 ? static_cast<size_t>(kRows * s.hd / 2) : 0);
    std::vector<float> q32(kBf16 ? 0 : static_cast<size_t>(kRows * s.hd));
    std::vector<float> acc(static_cast<size_t>(kRows * s.nv * 16));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t blk = task % blocks, bh = task / blocks;
      const int64_t r0 = blk * kTaskRows, r1 = std::min(s.N, r0 + kTaskRows);
      attend_rows<kBf16>(q, s, pk, bh / s.Hq, bh % s.Hq, r0, r1, c, out, scores, e16, e32, q16, q32,
                         acc);
    }
  });
}

#pragma GCC diagnostic pop

#endif  // SAPIENS_SEG_X86

bool forced_libtorch() {
  const char* env = std::getenv("SAPIENS_SEG_CPU_ATTENTION");
  return env && std::string(env) == "libtorch";
}

at::Tensor libtorch_attention(const at::Tensor& q, at::Tensor k, at::Tensor v) {
  const int64_t B = q.size(0), Hq = q.size(1), N = q.size(2), hd = q.size(3);
  if (k.size(1) != Hq) {
    k = k.repeat_interleave(Hq / k.size(1), 1);
    v = v.repeat_interleave(Hq / v.size(1), 1);
  }
  return at::scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape({B, N, Hq * hd});
}

}  // namespace

const char* to_string(CpuAttentionPath path) {
  switch (path) {
    case CpuAttentionPath::kAvx512:
      return "avx512";
    case CpuAttentionPath::kAvx512Bf16:
      return "avx512-bf16";
    default:
      return "libtorch";
  }
}

CpuAttentionPath cpu_attention_path(at::ScalarType dtype, int64_t hd) {
  const CpuFeatures& f = host_cpu_features();
  if (forced_libtorch() || hd < 1 || hd > kMaxHeadDim || !f.avx512_core()) {
    return CpuAttentionPath::kLibTorch;
  }
  if (dtype == at::kFloat) return CpuAttentionPath::kAvx512;
  if (dtype == at::kBFloat16 && f.avx512_bf16 && hd % 2 == 0) return CpuAttentionPath::kAvx512Bf16;
  return CpuAttentionPath::kLibTorch;
}

std::vector<std::string> cpu_attention_lines() {
  const CpuFeatures& f = host_cpu_features();
  const std::string lib = "LibTorch's scaled_dot_product_attention";
  std::vector<std::string> lines;
  if (forced_libtorch()) {
    for (const char* d : {"float32", "bfloat16", "float16"}) {
      lines.push_back(std::string(d) + ": " + lib + " (SAPIENS_SEG_CPU_ATTENTION=libtorch)");
    }
    return lines;
  }
  const std::string no512 = lib + " (the library's kernel needs AVX-512 F/BW/DQ/VL, FMA)";
  // Sapiens2 in float32 keeps LibTorch's attention on every CPU (v2/sapiens2.cpp says why).
  const std::string kernel32 = "the library's AVX-512 kernel (Sapiens v1; Sapiens2: " + lib + ")";
  lines.push_back("float32: " + (f.avx512_core() ? kernel32 : no512));
  lines.push_back("bfloat16: " + (!f.avx512_core() ? no512
                                  : f.avx512_bf16
                                      ? std::string("the library's AVX512-BF16 kernel")
                                      : lib + " (the library's kernel needs AVX512-BF16)"));
  lines.push_back("float16: " + lib);
  return lines;
}

at::Tensor cpu_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         CpuAttentionPath path) {
  auto fail = [](const std::string& why) {
    throw Error(ErrorCode::kInvalidInput, "cpu_attention: " + why);
  };
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) fail("q, k, v must be [B, heads, N, hd]");
  if (k.sizes() != v.sizes() || q.size(0) != k.size(0) || q.size(2) != k.size(2) ||
      q.size(3) != k.size(3) || k.size(1) < 1 || q.size(1) % k.size(1) != 0) {
    fail("q, k, v shapes do not match (k and v [B, Hk, N, hd] with Hk dividing q's heads)");
  }
  if (q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type()) {
    fail("q, k, v dtypes differ");
  }
  if (path == CpuAttentionPath::kLibTorch) return libtorch_attention(q, k, v);
  Shape s;
  s.B = q.size(0);
  s.Hq = q.size(1);
  s.Hk = k.size(1);
  s.N = q.size(2);
  s.hd = q.size(3);
  s.npad = round_up(std::max<int64_t>(s.N, 1), kCols);
  s.nv = (s.hd + 15) / 16;
  if (!q.device().is_cpu() || !k.device().is_cpu() || !v.device().is_cpu()) fail("not on the CPU");
  if (q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1) fail("last dim not contiguous");
  if (cpu_attention_path(q.scalar_type(), s.hd) != path) {
    fail(std::string("the ") + to_string(path) + " path cannot run " +
         std::string(c10::toString(q.scalar_type())) + " with head dim " + std::to_string(s.hd) +
         " on this CPU");
  }
  at::Tensor out = at::empty({s.B, s.N, s.Hq * s.hd}, q.options());
  if (s.N == 0 || s.B == 0) return out;
#ifdef SAPIENS_SEG_X86
  Packed pk;
  if (path == CpuAttentionPath::kAvx512Bf16) {
    pack_bf16(k, v, s, pk);
    attend<true>(q, s, pk, out);
  } else {
    pack_f32(k, v, s, pk);
    attend<false>(q, s, pk, out);
  }
#endif
  return out;
}

}  // namespace sapiens_seg::core::attention
