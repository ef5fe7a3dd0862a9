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

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "../cpu/cpuid.hpp"
#include "../cpu/cpuinfo.hpp"
#include "../settings.hpp"
#include "sapiens_seg/error.hpp"

#ifdef SAPIENS_SEG_X86
#include <immintrin.h>
#define SAPIENS_SEG_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))
#define SAPIENS_SEG_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512bf16")))
#define SAPIENS_SEG_AVX2 __attribute__((target("avx2,fma")))
#define SAPIENS_SEG_AMX \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512bf16,amx-tile,amx-bf16")))
#endif

namespace sapiens_seg::core::attention {

namespace {

// Register tiles, AVX-512: kRows query rows by 4 vectors of 16 keys (24 accumulators of the 32
// ZMM registers) for the scores, kRows rows by up to 4 vectors of the head dim for the weighted
// sum of V (half as many rows for head dims over 64). AVX2 has 16 YMM registers: kRows rows by 2
// vectors of 8 (12 accumulators), over the same packed panels 16 keys or 16 head-dim columns at a
// time, and kAvx2Rows rows per pass so that each K or V panel read from L2/L3 (0.8 MB each per
// head at 1024x768) serves four such tiles, not one. On the Zen 1 CPU it was written on, whose
// 128-bit FMA units are the limit either way, that moved it from 0.99-1.06x (one run, 6 rows
// per pass) to 1.05-1.12x LibTorch's speed (benchmarks/results/cpu-attention-avx2.json). The
// AVX-512 paths take kAvx512Rows per pass for the same reason: on an AMX Xeon (2 MB of L2 per
// core) that made the float32 kernel 1.04-1.06x (hd 60), 1.08-1.16x (hd 64) and 1.32-1.46x
// (hd 80) as fast, with the same bits (benchmarks/README.md, "The CPU attention kernel").
constexpr int64_t kRows = 6;
constexpr int64_t kLanes = 16;              // floats per ZMM register
constexpr int64_t kCols = 64;               // keys per score tile; N is padded to a multiple of it
constexpr int64_t kMaxHeadDim = 128;        // 8 vectors of 16
constexpr int64_t kAvx2Rows = 4 * kRows;    // query rows per pass of the AVX2 path (below)
constexpr int64_t kAvx512Rows = 4 * kRows;  // and of the AVX-512 paths
constexpr int64_t kAmxRows = 32;            // and of the AMX path: two tiles of 16 rows
constexpr int64_t kTaskRows = 96;           // a multiple of every path's rows per pass

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
//
// The panels are LibTorch tensors, uninitialised but for their padding: a std::vector zero-filled
// the whole 13 MB a layer (Sapiens2 0.4b in bfloat16) and, being freed at 6 MB and more, came back
// as fresh pages every call, a fault per 4 KB; the allocator's reused blocks and the padding alone
// written give the same panels.
struct Packed {
  at::Tensor k, v;                 // int32 words (bfloat16 pairs) or float32
  int64_t k_size = 0, v_size = 0;  // elements per (batch, kv head)
  template <class Word>
  const Word* k_data() const {
    return static_cast<const Word*>(k.data_ptr());
  }
  template <class Word>
  const Word* v_data() const {
    return static_cast<const Word*>(v.data_ptr());
  }
};

// Packs every (batch, kv head) with `one(bh, k panel, v panel)`, after zeroing what `one` leaves
// unwritten: V's rows from v_used_rows on (v_rows rows of v_width words in all), which the
// weighted sums multiply by zero probabilities (a NaN left there by an earlier call would make
// them NaN); and, so that the panels are the same whatever the allocator hands out, the k_words
// words of each key past N in K's last tile (their scores are masked) and V's columns past hd
// (their sums are never stored).
template <class Word, class One>
void pack_any(const Shape& s, int64_t k_size, int64_t v_rows, int64_t v_width, int64_t k_words,
              int64_t v_used_rows, Packed& out, const One& one) {
  const auto dtype = std::is_same_v<Word, float> ? at::kFloat : at::kInt;
  out.k_size = k_size;
  out.v_size = v_rows * v_width;
  out.k = at::empty({s.B * s.Hk * out.k_size}, at::TensorOptions().dtype(dtype));
  out.v = at::empty({s.B * s.Hk * out.v_size}, at::TensorOptions().dtype(dtype));
  at::parallel_for(0, s.B * s.Hk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      Word* kp = static_cast<Word*>(out.k.data_ptr()) + bh * out.k_size;
      Word* vp = static_cast<Word*>(out.v.data_ptr()) + bh * out.v_size;
      for (int64_t n = s.N; n < s.npad; ++n) {  // the keys of the last tile past N
        Word* kt = kp + (n / kCols) * k_words * kCols + n % kCols;
        for (int64_t p = 0; p < k_words; ++p) kt[p * kCols] = Word{0};
      }
      for (int64_t t = 0; t < v_used_rows; ++t) {
        std::fill(vp + t * v_width + s.hd, vp + (t + 1) * v_width, Word{0});
      }
      std::fill(vp + v_used_rows * v_width, vp + out.v_size, Word{0});
      one(bh, kp, vp);
    }
  });
}

void pack_bf16(const at::Tensor& k, const at::Tensor& v, const Shape& s, Packed& out) {
  const int64_t pairs = s.hd / 2, width = s.nv * 16;
  pack_any<std::uint32_t>(s, s.npad * pairs, s.npad / 2, width, pairs, (s.N + 1) / 2, out,
                          [&](int64_t bh, std::uint32_t* kp, std::uint32_t* vp) {
                            const int64_t b = bh / s.Hk, h = bh % s.Hk;
                            for (int64_t n = 0; n < s.N; ++n) {
                              const at::BFloat16* kr = row_ptr<at::BFloat16>(k, b, h, n);
                              std::uint32_t* kt = kp + (n / kCols) * pairs * kCols + n % kCols;
                              for (int64_t p = 0; p < pairs; ++p)
                                kt[p * kCols] = bf16_pair(kr + 2 * p);
                            }
                            for (int64_t t = 0; 2 * t < s.N; ++t) {
                              const at::BFloat16* v0 = row_ptr<at::BFloat16>(v, b, h, 2 * t);
                              const at::BFloat16* v1 = 2 * t + 1 < s.N ? v0 + v.stride(2) : nullptr;
                              std::uint32_t* vr = vp + t * width;
                              for (int64_t d = 0; d < s.hd; ++d) {
                                vr[d] = bf16_pair(v0[d], v1 ? v1[d] : at::BFloat16(0));
                              }
                            }
                          });
}

void pack_f32(const at::Tensor& k, const at::Tensor& v, const Shape& s, Packed& out) {
  const int64_t width = s.nv * 16;
  pack_any<float>(s, s.npad * s.hd, s.npad, width, s.hd, s.N, out,
                  [&](int64_t bh, float* kp, float* vp) {
                    const int64_t b = bh / s.Hk, h = bh % s.Hk;
                    for (int64_t n = 0; n < s.N; ++n) {
                      const float* kr = row_ptr<float>(k, b, h, n);
                      float* kt = kp + (n / kCols) * s.hd * kCols + n % kCols;
                      for (int64_t d = 0; d < s.hd; ++d) kt[d * kCols] = kr[d];
                      std::memcpy(vp + n * width, row_ptr<float>(v, b, h, n),
                                  static_cast<size_t>(s.hd) * sizeof(float));
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
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + j));
  if (j < n) {
    const __mmask16 k = tail_mask(j, n);
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, s + j));
  }
  return _mm512_reduce_max_ps(m);
}

// exp(c * (s[j] - max)) for j < n, 0 for n <= j < npad, into e (float32 or bfloat16); returns
// the float32 sum of the unrounded values. c = scale * log2(e).
// The loops below take whole vectors unmasked up to n and the masked one(s) after: the same
// values (the mask only zeroes the lanes past n).
SAPIENS_SEG_AVX512 inline __m512 softmax_numerator(const float* s, int64_t j, __m512 vm,
                                                   __m512 vc) {
  return exp2_nonpositive(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm), vc));
}

SAPIENS_SEG_AVX512 inline __m512 softmax_numerator(const float* s, int64_t j, int64_t n, __m512 vm,
                                                   __m512 vc) {
  return _mm512_maskz_mov_ps(tail_mask(j, n), softmax_numerator(s, j, vm, vc));
}

SAPIENS_SEG_AVX512 float softmax_row(const float* s, int64_t n, int64_t npad, float c, float* e) {
  const __m512 vm = _mm512_set1_ps(row_max(s, n)), vc = _mm512_set1_ps(c);
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 x = softmax_numerator(s, j, vm, vc);
    sum = _mm512_add_ps(sum, x);
    _mm512_storeu_ps(e + j, x);
  }
  for (; j < npad; j += 16) {
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
  auto put = [&](int64_t j, __m512 x) SAPIENS_SEG_AVX512BF16 {
    sum = _mm512_add_ps(sum, x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(e + j / 2),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
  };
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) put(j, softmax_numerator(s, j, vm, vc));
  for (; j < npad; j += 16) put(j, softmax_numerator(s, j, n, vm, vc));
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
                                          int64_t o_stride, bool carry) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j)
      acc[i][j] = carry ? _mm512_loadu_ps(o + i * o_stride + kLanes * j) : _mm512_setzero_ps();
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
                                     int64_t keys, float* o, int64_t o_stride, bool carry) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j)
      acc[i][j] = carry ? _mm512_loadu_ps(o + i * o_stride + kLanes * j) : _mm512_setzero_ps();
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

// kAvx512Rows rows of the weighted sum, in row groups that keep MR * NV accumulators within 24.
// Keys go in blocks of kCols, each block of V (16 KB at hd 64) read from L2 once and reused from
// L1 by every row group; a group's sums are carried in o from block to block. The sums run over
// the keys in order either way, so the result is the same to the bit as one pass over all keys.
template <bool kBf16, int NV>
void weighted_rows(const void* e, int64_t npad, const void* vp, float* o) {
  constexpr int MR = NV <= 4 ? kRows : kRows / 2;
  constexpr int64_t width = int64_t{NV} * 16;
  for (int64_t k0 = 0; k0 < npad; k0 += kCols) {
    for (int64_t r = 0; r < kAvx512Rows; r += MR) {
      if constexpr (kBf16) {
        const auto* ew = static_cast<const std::uint32_t*>(e) + r * (npad / 2) + k0 / 2;
        const auto* vw = static_cast<const std::uint32_t*>(vp) + k0 / 2 * width;
        weighted_bf16<MR, NV>(ew, npad / 2, vw, kCols / 2, o + r * width, width, k0 > 0);
      } else {
        const float* ef = static_cast<const float*>(e) + r * npad + k0;
        const float* vf = static_cast<const float*>(vp) + k0 * width;
        weighted_f32<MR, NV>(ef, npad, vf, kCols, o + r * width, width, k0 > 0);
      }
    }
  }
}

// Scores of kAvx512Rows query rows against one packed 64-key tile, kRows rows per register tile:
// the tile (hd x 64 floats, 16 KB at hd 64) is read from L2 once and reused from L1 by each group.
template <class Word, void (*Tile)(const Word*, int64_t, const Word*, float*, int64_t)>
void scores_rows(const Word* q, int64_t qw, const Word* kt, float* s, int64_t s_stride) {
  for (int64_t g = 0; g < kAvx512Rows; g += kRows)
    Tile(q + g * qw, qw, kt, s + g * s_stride, s_stride);
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

// ---- AMX-BF16 tiles, bfloat16 only -------------------------------------------------------------
//
// The AVX512-BF16 path's packed panels, softmax and output rows, with the two products on the
// tiles: TDPBF16PS multiplies a 16-row tile of bf16 pairs by a 16-row tile of pairs laid out as
// the packed K and V already are (a row per pair, a 32-bit column per key or per head-dim
// column), summing in float32. Every tile is 16 rows of 64 bytes: tmm0-3 the sums of a 2 x 2
// block, tmm4-5 two row tiles of the left operand, tmm6-7 two column tiles of the right one. Head
// dims a multiple of 32 only (a pair step is 16 words), which the networks' 64 is.

// Linux gives a process the tiles' register state only once it asks (ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); before that the first tile instruction faults.
bool amx_permitted() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  static const bool ok = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

// LDTILECFG's 64-byte operand: palette 1, every tile 16 rows of 64 bytes. A constant in memory:
// GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes only, so the stores of a
// configuration built on the stack were dropped as dead (the tiles then faulted unconfigured).
struct alignas(64) TileConfig {
  std::uint8_t palette, start_row;
  std::uint8_t reserved[14];
  std::uint16_t colsb[16];
  std::uint8_t rows[16];
};
constexpr TileConfig kTileConfig = {
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
static_assert(sizeof(TileConfig) == 64);

SAPIENS_SEG_AMX void amx_begin() {
  _tile_loadconfig(&kTileConfig);
}

SAPIENS_SEG_AMX void amx_end() {
  _tile_release();
}

// c[32][32] (float32, rows c_ld floats apart) = a . b over `words` pair words: a is 32 rows of
// pair words (a_ld apart), b `words` rows of 32 pair-word columns (b_ld apart), as two row tiles by
// two column tiles, 16 pair words (32 bf16) a step.
SAPIENS_SEG_AMX void tile_block(const std::uint32_t* a, int64_t a_ld, const std::uint32_t* b,
                                int64_t b_ld, int64_t words, float* c, int64_t c_ld) {
  const auto as = static_cast<size_t>(a_ld * 4), bs = static_cast<size_t>(b_ld * 4),
             cs = static_cast<size_t>(c_ld * 4);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t p = 0; p < words; p += 16) {
    _tile_loadd(4, a + p, as);
    _tile_loadd(5, a + 16 * a_ld + p, as);
    _tile_loadd(6, b + p * b_ld, bs);
    _tile_loadd(7, b + p * b_ld + 16, bs);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, cs);
  _tile_stored(1, c + 16, cs);
  _tile_stored(2, c + 16 * c_ld, cs);
  _tile_stored(3, c + 16 * c_ld + 16, cs);
}

// Scores of kAmxRows query rows (rows of qw pair words) against one packed 64-key tile
// ([qw][kCols] words), 32 keys at a time.
SAPIENS_SEG_AMX void scores_amx(const std::uint32_t* q, int64_t qw, const std::uint32_t* kt,
                                float* s, int64_t s_stride) {
  for (int64_t j = 0; j < kCols; j += 32) tile_block(q, qw, kt + j, kCols, qw, s + j, s_stride);
}

// o[i][0 .. 16*nv) = sum over keys of e[i][key] * V[key] for kAmxRows rows (e rows of npad/2
// pair words, V packed [npad/2][16*nv] words), 32 head-dim columns at a time, the keys in order.
SAPIENS_SEG_AMX void weighted_amx(int64_t nv, const void* e_words, int64_t npad,
                                  const void* v_words, float* o) {
  const auto* e = static_cast<const std::uint32_t*>(e_words);
  const auto* vp = static_cast<const std::uint32_t*>(v_words);
  const int64_t width = nv * 16;
  for (int64_t c = 0; c < width; c += 32)
    tile_block(e, npad / 2, vp + c, width, npad / 2, o + c, width);
}

// ---- AVX2 + FMA, float32 only (CPUs without AVX-512: Zen 1-3, Haswell to Alder Lake) ---------
//
// The same packed panels, scores, softmax and weighted sum as the AVX-512 float32 path, in 8-wide
// vectors. Its sums run in another order (8 lanes, not 16), so its results differ from the
// AVX-512 path's in the last float32 bits; both are held to the exact result by the tests.

SAPIENS_SEG_AVX2 inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

SAPIENS_SEG_AVX2 inline float hsum(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// All ones in the lanes j + i < n (i = 0..7), zero elsewhere.
SAPIENS_SEG_AVX2 inline __m256i lanes_below(int64_t j, int64_t n) {
  const int64_t left = std::clamp<int64_t>(n - j, 0, 8);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 2^x for x <= 0 (NaN stays NaN), the AVX-512 path's polynomial; 2^round(x) is built from its
// exponent bits, so round(x) = -127 gives +0 where the AVX-512 path's scalef gives a denormal:
// both are under 2^-126 of the row's largest term (1), below what a float32 sum of it can hold.
SAPIENS_SEG_AVX2 inline __m256 exp2_nonpositive_avx2(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-127.f), x);  // max(a, NaN) is NaN: the second operand wins
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.540353039338161e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.333355814642844e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129107628477e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866482158e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402265069591007e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471805599453e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
  // NaN converts to 0x80000000, whose exponent field comes out as 127 (2^0): p stays NaN.
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

SAPIENS_SEG_AVX2 float row_max_avx2(const float* s, int64_t n) {
  const __m256 lowest = _mm256_set1_ps(-INFINITY);
  __m256 m = lowest;
  for (int64_t j = 0; j < n; j += 8) {  // the score rows are npad long: whole loads stay inside
    const __m256 x =
        _mm256_blendv_ps(lowest, _mm256_loadu_ps(s + j), _mm256_castsi256_ps(lanes_below(j, n)));
    m = _mm256_max_ps(m, x);
  }
  return hmax(m);
}

SAPIENS_SEG_AVX2 float softmax_row_avx2(const float* s, int64_t n, int64_t npad, float c,
                                        float* e) {
  const __m256 vm = _mm256_set1_ps(row_max_avx2(s, n)), vc = _mm256_set1_ps(c);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < npad; j += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm), vc);
    const __m256 y =
        _mm256_and_ps(exp2_nonpositive_avx2(x), _mm256_castsi256_ps(lanes_below(j, n)));
    sum = _mm256_add_ps(sum, y);
    _mm256_storeu_ps(e + j, y);
  }
  return hsum(sum);
}

// Scores of kAvx2Rows query rows against one packed 64-key tile: 16 keys by kRows rows per
// register tile, the tile's 16-key strip (hd x 16 floats) reused from L1 by each group of rows.
SAPIENS_SEG_AVX2 void scores_f32_avx2(const float* q, int64_t hd, const float* kt, float* s,
                                      int64_t s_stride) {
  for (int64_t j0 = 0; j0 < kCols; j0 += 16) {
    for (int64_t g = 0; g < kAvx2Rows; g += kRows) {
      const float* qg = q + g * hd;
      __m256 acc[kRows][2];
#pragma GCC unroll 6
      for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
      for (int64_t d = 0; d < hd; ++d) {
        const float* kp = kt + d * kCols + j0;
        const __m256 b0 = _mm256_loadu_ps(kp), b1 = _mm256_loadu_ps(kp + 8);
#pragma GCC unroll 6
        for (int i = 0; i < kRows; ++i) {
          const __m256 a = _mm256_broadcast_ss(qg + i * hd + d);
          acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
      }
      float* sg = s + g * s_stride + j0;
#pragma GCC unroll 6
      for (int i = 0; i < kRows; ++i) {
        _mm256_storeu_ps(sg + i * s_stride, acc[i][0]);
        _mm256_storeu_ps(sg + i * s_stride + 8, acc[i][1]);
      }
    }
  }
}

// o[i][0 .. 16*nv) = sum over keys of e[i][key] * V[key], for kAvx2Rows rows. Keys go in blocks
// of kCols (kCols x 16*nv floats of V, 16 KB at hd 64, stay in L1 while every group of kRows rows
// and every 16-column strip takes them); the register tile is kRows rows by one strip, its sums
// carried in o from block to block.
SAPIENS_SEG_AVX2 void weighted_f32_avx2(int64_t nv, const float* e, int64_t npad, const float* vp,
                                        float* o) {
  const int64_t width = nv * 16;
  std::fill(o, o + kAvx2Rows * width, 0.f);
  for (int64_t k0 = 0; k0 < npad; k0 += kCols) {
    for (int64_t g = 0; g < kAvx2Rows; g += kRows) {
      const float* eg = e + g * npad + k0;
      for (int64_t c = 0; c < width; c += 16) {
        float* og = o + g * width + c;
        __m256 acc[kRows][2];
#pragma GCC unroll 6
        for (int i = 0; i < kRows; ++i) {
          acc[i][0] = _mm256_loadu_ps(og + i * width);
          acc[i][1] = _mm256_loadu_ps(og + i * width + 8);
        }
        const float* vb = vp + k0 * width + c;
        for (int64_t t = 0; t < kCols; ++t) {
          const __m256 b0 = _mm256_loadu_ps(vb + t * width),
                       b1 = _mm256_loadu_ps(vb + t * width + 8);
#pragma GCC unroll 6
          for (int i = 0; i < kRows; ++i) {
            const __m256 a = _mm256_broadcast_ss(eg + i * npad + t);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
          }
        }
#pragma GCC unroll 6
        for (int i = 0; i < kRows; ++i) {
          _mm256_storeu_ps(og + i * width, acc[i][0]);
          _mm256_storeu_ps(og + i * width + 8, acc[i][1]);
        }
      }
    }
  }
}

SAPIENS_SEG_AVX2 void store_row_avx2(const float* o, float sum, int64_t hd, float* out) {
  const __m256 vs = _mm256_set1_ps(sum);
  for (int64_t d = 0; d < hd; d += 8) {
    const __m256 y = _mm256_div_ps(_mm256_loadu_ps(o + d), vs);
    if (d + 8 <= hd) {
      _mm256_storeu_ps(out + d, y);
    } else {
      _mm256_maskstore_ps(out + d, lanes_below(d, hd), y);
    }
  }
}

// ---- one driver for the three paths ------------------------------------------------------------
//
// A path's Ops: its query rows per pass, its output dtype and its four steps. Word is what the
// packed panels, the query tile and the probabilities hold (a pair of bf16 in a 32-bit word, or a
// float); per_word, the elements in a Word.
template <int64_t Rows, class OutT, auto Scores, auto Softmax, auto Weighted, auto Store,
          bool Amx = false>
struct KernelOps {
  static constexpr int64_t rows = Rows;
  static constexpr bool amx = Amx;  // the tiles are configured per thread around its tasks
  static constexpr bool bf16 = std::is_same_v<OutT, at::BFloat16>;
  static constexpr int64_t per_word = bf16 ? 2 : 1;
  using Out = OutT;
  using Word = std::conditional_t<bf16, std::uint32_t, float>;
  static const Word* k(const Packed& p) { return p.k_data<Word>(); }
  static const Word* v(const Packed& p) { return p.v_data<Word>(); }
  static constexpr auto scores = Scores;      // (q, qw, k tile, scores, stride)
  static constexpr auto softmax = Softmax;    // (scores row, N, npad, c, e row) -> sum
  static constexpr auto weighted = Weighted;  // (nv, e, npad, packed V, sums)
  static constexpr auto store = Store;        // (sums row, sum, hd, out row)
};

using SoftmaxBf16 = float (*)(const float*, int64_t, int64_t, float, std::uint32_t*);
using SoftmaxF32 = float (*)(const float*, int64_t, int64_t, float, float*);
using StoreBf16 = void (*)(const float*, float, int64_t, at::BFloat16*);
using StoreF32 = void (*)(const float*, float, int64_t, float*);

using Avx512Bf16Ops =
    KernelOps<kAvx512Rows, at::BFloat16, &scores_rows<std::uint32_t, &scores_bf16>,
              static_cast<SoftmaxBf16>(&softmax_row), &weighted_any<true>,
              static_cast<StoreBf16>(&store_row)>;
using Avx512F32Ops = KernelOps<kAvx512Rows, float, &scores_rows<float, &scores_f32>,
                               static_cast<SoftmaxF32>(&softmax_row), &weighted_any<false>,
                               static_cast<StoreF32>(&store_row)>;
using AmxBf16Ops =
    KernelOps<kAmxRows, at::BFloat16, &scores_amx, static_cast<SoftmaxBf16>(&softmax_row),
              &weighted_amx, static_cast<StoreBf16>(&store_row), true>;
using Avx2F32Ops = KernelOps<kAvx2Rows, float, &scores_f32_avx2, &softmax_row_avx2,
                             &weighted_f32_avx2, &store_row_avx2>;

// Per-thread scratch: Ops::rows rows of scores, of probabilities, of the query tile and of the
// weighted sums.
template <class Ops>
struct Scratch {
  std::vector<float> scores;
  std::vector<typename Ops::Word> e, q;
  std::vector<float> acc;
  explicit Scratch(const Shape& s)
      : scores(static_cast<size_t>(Ops::rows * s.npad)),
        e(static_cast<size_t>(Ops::rows * s.npad / Ops::per_word)),
        q(static_cast<size_t>(Ops::rows * s.hd / Ops::per_word)),
        acc(static_cast<size_t>(Ops::rows * s.nv * 16)) {}
};

// One task: query rows [r0, r1) of head h of batch b.
template <class Ops>
void attend_rows(const at::Tensor& q, const Shape& s, const Packed& pk, int64_t b, int64_t h,
                 int64_t r0, int64_t r1, float c, at::Tensor& out, Scratch<Ops>& w) {
  using Word = typename Ops::Word;
  using Out = typename Ops::Out;
  const int64_t kvh = h / s.group(), bk = b * s.Hk + kvh, width = s.nv * 16;
  const int64_t qw = s.hd / Ops::per_word, ew = s.npad / Ops::per_word, out_row = s.Hq * s.hd;
  const Word* kp = Ops::k(pk) + bk * pk.k_size;
  const Word* vp = Ops::v(pk) + bk * pk.v_size;
  for (int64_t m0 = r0; m0 < r1; m0 += Ops::rows) {
    const int64_t rows = std::min(Ops::rows, r1 - m0);
    // The tile's query rows, zero-padded to Ops::rows (padded rows' results are never stored).
    std::fill(w.q.begin(), w.q.end(), Word{0});
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(w.q.data() + i * qw, row_ptr<Out>(q, b, h, m0 + i),
                  static_cast<size_t>(s.hd) * sizeof(Out));
    }
    for (int64_t t = 0; t < s.npad / kCols; ++t) {
      Ops::scores(w.q.data(), qw, kp + t * qw * kCols, w.scores.data() + t * kCols, s.npad);
    }
    float sums[Ops::rows];
    for (int64_t i = 0; i < Ops::rows; ++i) {
      sums[i] = Ops::softmax(w.scores.data() + i * s.npad, s.N, s.npad, c, w.e.data() + i * ew);
    }
    Ops::weighted(s.nv, w.e.data(), s.npad, vp, w.acc.data());
    for (int64_t i = 0; i < rows; ++i) {
      Out* dst = out.data_ptr<Out>() + (b * s.N + m0 + i) * out_row + h * s.hd;
      Ops::store(w.acc.data() + i * width, sums[i], s.hd, dst);
    }
  }
}

template <class Ops>
void attend(const at::Tensor& q, const Shape& s, const Packed& pk, at::Tensor& out) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hd)));
  const float c = scale * 1.4426950408889634f;  // exp(x) = 2^(x log2 e)
  const int64_t blocks = (s.N + kTaskRows - 1) / kTaskRows;
  at::parallel_for(0, s.B * s.Hq * blocks, 1, [&](int64_t begin, int64_t end) {
    Scratch<Ops> w(s);
    if constexpr (Ops::amx) amx_begin();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t blk = task % blocks, bh = task / blocks;
      const int64_t r0 = blk * kTaskRows, r1 = std::min(s.N, r0 + kTaskRows);
      attend_rows<Ops>(q, s, pk, bh / s.Hq, bh % s.Hq, r0, r1, c, out, w);
    }
    if constexpr (Ops::amx) amx_end();
  });
}

#pragma GCC diagnostic pop

#endif  // SAPIENS_SEG_X86

std::string forced_attention() {
  return read_settings().cpu_attention;
}

bool forced_libtorch() {
  return forced_attention() == "libtorch";
}

// The float32 kernels were measured faster than LibTorch's attention on AMD cores only (Zen 1
// AVX2: 1.05-1.12x; Zen 4 AVX-512: 1.07-1.43x), whose float32 FMAs are 128-bit (Zen 1) or
// double-pumped (Zen 4). On an Intel Xeon with two 512-bit FMA ports MKL's GEMMs inside
// LibTorch's flash attention win: 0.94x (hd 64), 0.57x (hd 80), 0.84x (Sapiens2) for the kernel.
bool float32_kernel_pays_off() {
  return host_cpu_features().amd || forced_attention() == "kernel";
}

bool bfloat16_kernel_pays_off() {
  return bfloat16_kernel_beats_libtorch(cpu_caps()) || forced_attention() == "kernel";
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
    case CpuAttentionPath::kAmxBf16:
      return "amx-bf16";
    case CpuAttentionPath::kAvx2:
      return "avx2";
    default:
      return "libtorch";
  }
}

bool cpu_attention_runs(CpuAttentionPath path, at::ScalarType dtype, int64_t hd) {
  if (path == CpuAttentionPath::kLibTorch) return true;
  const CpuFeatures& f = host_cpu_features();
  if (hd < 1 || hd > kMaxHeadDim) return false;
  switch (path) {
    case CpuAttentionPath::kAvx512:
      return dtype == at::kFloat && f.avx512_core();
    case CpuAttentionPath::kAvx512Bf16:
      return dtype == at::kBFloat16 && hd % 2 == 0 && f.avx512_core() && f.avx512_bf16;
    case CpuAttentionPath::kAvx2:
      return dtype == at::kFloat && f.avx2_fma();
    case CpuAttentionPath::kAmxBf16:
#ifdef SAPIENS_SEG_X86
      return dtype == at::kBFloat16 && hd % 32 == 0 && f.avx512_core() && f.avx512_bf16 &&
             f.amx_bf16_os() && amx_permitted();
#else
      return false;
#endif
    default:
      return false;
  }
}

// LibTorch's flash attention (2.15) reaches the AMX tiles for its bfloat16 blocks where the CPU
// has AMX-BF16 (through oneDNN's brgemm, as far as its speed tells: 2.86x its own float32 there,
// 0.63x on a Xeon without AMX; benchmarks/results/cpu-dtype-probe-*.json). On a 2-core Sapphire
// Rapids-class Xeon it ran 3.3x (hd 64), 3.5x (hd 80) and 3.0x (hd 60) faster than the kernel's
// VDPBF16PS dot products (benchmarks/results/cpu-attention-amx.json), and with oneDNN capped at
// AVX512_CORE it still ran 2.3x its float32: the instructions decide, not the cap.
bool bfloat16_kernel_beats_libtorch(const CpuCaps& caps) {
  return !(caps.amx_tile && caps.amx_bf16);
}

CpuAttentionPath cpu_attention_path(at::ScalarType dtype, int64_t hd) {
  if (forced_libtorch()) return CpuAttentionPath::kLibTorch;
  // Widest first: the AMX tiles, then the AVX-512 vectors (twice the work per instruction of the
  // AVX2 ones). The AMX path wherever it runs: on the AMX Xeon whole bfloat16 calls
  // ran 1.006-1.052x as fast with it as with LibTorch's own AMX attention (network medians of three
  // in-process A/Bs per model, 2026-12-07;
  // benchmarks/results/intel-xeon-amx/ab/cpu-attention-amx-tiles-ab*.json), the attention
  // alone 1.21-1.29x (cpu-attention-amx-tiles.json).
  for (CpuAttentionPath p : {CpuAttentionPath::kAmxBf16, CpuAttentionPath::kAvx512Bf16,
                             CpuAttentionPath::kAvx512, CpuAttentionPath::kAvx2}) {
    if (cpu_attention_runs(p, dtype, hd)) {
      const bool pays =
          p == CpuAttentionPath::kAmxBf16 ||
          (dtype == at::kFloat ? float32_kernel_pays_off() : bfloat16_kernel_pays_off());
      return pays ? p : CpuAttentionPath::kLibTorch;
    }
  }
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
  // Sapiens2 in float32 keeps LibTorch's attention on every CPU (v2/sapiens2.cpp says why).
  const std::string v2_keeps = " (Sapiens v1; Sapiens2: " + lib + ")";
  const bool avx2 = cpu_attention_runs(CpuAttentionPath::kAvx2, at::kFloat, 64);
  const char* kernel = f.avx512_core() ? "AVX-512" : "AVX2";
  lines.push_back(
      "float32: " +
      (!f.avx512_core() && !avx2 ? lib + " (the library's kernel needs AVX2 and FMA)"
       : float32_kernel_pays_off()
           ? std::string("the library's ") + kernel + " kernel" + v2_keeps
           : lib + " (the library's " + kernel +
                 " kernel is the faster in float32 on AMD cores only; SAPIENS_SEG_CPU_ATTENTION="
                 "kernel forces it)"));
  const bool amx = cpu_attention_runs(CpuAttentionPath::kAmxBf16, at::kBFloat16, 64);
  lines.push_back(
      "bfloat16: " +
      (!f.avx512_core() ? lib + " (the library's kernel needs AVX-512 F/BW/DQ/VL, FMA)"
       : !f.avx512_bf16 ? lib + " (the library's kernel needs AVX512-BF16)"
       : amx ? std::string("the library's AMX-BF16 kernel where the head dim is a multiple of 32 "
                           "(Sapiens v1 0.3b/1b, Sapiens2 0.4b/1b); elsewhere ") +
                   lib + " (on AMX-BF16 tiles, about 3x the library's AVX512-BF16 kernel)"
       : bfloat16_kernel_pays_off()
           ? std::string("the library's AVX512-BF16 kernel")
           : lib + " (on AMX-BF16 tiles, about 3x the library's AVX512-BF16 kernel; "
                   "SAPIENS_SEG_CPU_ATTENTION=kernel forces the kernel)"));
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
  if (!cpu_attention_runs(path, q.scalar_type(), s.hd)) {
    fail(std::string("the ") + to_string(path) + " path cannot run " +
         std::string(c10::toString(q.scalar_type())) + " with head dim " + std::to_string(s.hd) +
         " on this CPU");
  }
  at::Tensor out = at::empty({s.B, s.N, s.Hq * s.hd}, q.options());
  if (s.N == 0 || s.B == 0) return out;
#ifdef SAPIENS_SEG_X86
  Packed pk;
  switch (path) {
    case CpuAttentionPath::kAvx512Bf16:
      pack_bf16(k, v, s, pk);
      attend<Avx512Bf16Ops>(q, s, pk, out);
      break;
    case CpuAttentionPath::kAmxBf16:
      pack_bf16(k, v, s, pk);
      attend<AmxBf16Ops>(q, s, pk, out);
      break;
    case CpuAttentionPath::kAvx512:
      pack_f32(k, v, s, pk);
      attend<Avx512F32Ops>(q, s, pk, out);
      break;
    default:
      pack_f32(k, v, s, pk);
      attend<Avx2F32Ops>(q, s, pk, out);
      break;
  }
#endif
  return out;
}

}  // namespace sapiens_seg::core::attention
