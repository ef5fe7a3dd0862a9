// Vector loads and stores of float32, bfloat16 and float16 as float32 lanes, and a float32 exp,
// for the library's own CPU loops (head/channel_ops, v2/cpu_ops). Every function is compiled
// for its instruction set alone (target attributes), so a file that includes this may call them
// only after cpu/cpuid.hpp said the CPU runs them: AVX-512 F/BW/VL with FMA (avx512_core) for the
// 16-lane ones, AVX2 with FMA and F16C (avx2_fma_f16c) for the 8-lane ones.
//
// Conversions round as c10's own: bfloat16 to nearest even with NaN kept quiet (0x7FC0),
// float16 through the hardware's round-to-nearest-even.
#pragma once

#include "cpuid.hpp"

#ifdef SAPIENS_SEG_X86
#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#define SAPIENS_SEG_VEC512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define SAPIENS_SEG_VEC256 __attribute__((target("avx2,fma,f16c")))

namespace sapiens_seg::core::vec {

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

SAPIENS_SEG_VEC512 inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
SAPIENS_SEG_VEC512 inline __m512 load16(const c10::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
SAPIENS_SEG_VEC512 inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
SAPIENS_SEG_VEC512 inline void store16(float* p, __m512 v) {
  _mm512_storeu_ps(p, v);
}
// Round to nearest even, NaN to the quiet NaN 0x7FC0: c10::BFloat16's own conversion.
SAPIENS_SEG_VEC512 inline void store16(c10::BFloat16* p, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
SAPIENS_SEG_VEC512 inline void store16(c10::Half* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

SAPIENS_SEG_VEC512 inline __m512 exp16(__m512 x) {
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

SAPIENS_SEG_VEC256 inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
SAPIENS_SEG_VEC256 inline __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
SAPIENS_SEG_VEC256 inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
SAPIENS_SEG_VEC256 inline void store8(float* p, __m256 v) {
  _mm256_storeu_ps(p, v);
}
SAPIENS_SEG_VEC256 inline void store8(c10::BFloat16* p, __m256 v) {
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
SAPIENS_SEG_VEC256 inline void store8(c10::Half* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

SAPIENS_SEG_VEC256 inline __m256 exp8(__m256 x) {
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

// silu(z) = z / (1 + exp(-z)), LibTorch's formula, with the exp above.
SAPIENS_SEG_VEC512 inline __m512 silu16(__m512 z) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), z));
  return _mm512_div_ps(z, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
SAPIENS_SEG_VEC256 inline __m256 silu8(__m256 z) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), z));
  return _mm256_div_ps(z, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// Sum of the 16 (8) lanes.
SAPIENS_SEG_VEC512 inline float hsum16(__m512 v) {
  return _mm512_reduce_add_ps(v);
}
SAPIENS_SEG_VEC256 inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

#pragma GCC diagnostic pop

}  // namespace sapiens_seg::core::vec

#endif  // SAPIENS_SEG_X86
