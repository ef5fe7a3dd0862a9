// AVX2 helpers shared by the host loops (host.cpp, wheel_cubic.cpp): fetching the source samples
// of 8 output values at once. Only for functions compiled with SAPIENS_SEG_AVX2 (cpu.hpp) and
// called where host_simd() is Simd::kAvx2.
//
// The horizontal passes read, for output value i (a pixel's channel), samples at
// S + off[i] + k * CN for taps k = 0, 1, ...: consecutive source pixels, CN bytes apart. One
// 32-bit gather per lane brings the bytes off[i] .. off[i] + 3, which hold two taps when CN <= 3
// (bytes 0 and CN), so a pair of taps costs one gather.
#pragma once

#include "cpu.hpp"

#include <cstdint>

#ifdef SAPIENS_SEG_X86
#include <immintrin.h>
#endif

namespace sapiens_seg::core::resize_detail::avx2 {

// How many bytes from a value's first sample the loads of its taps first and first + 1 cover
// (the tables use it to stop the vector loops before a row's end on every machine).
constexpr int pair_reach(int cn, int first) {
  return cn == 4 ? (first + 1) * cn + 4 : first * cn + 4;
}

#ifdef SAPIENS_SEG_X86

SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE __m256i gather(const std::uint8_t* S, __m256i off) {
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(S), off, 1);
}

// Taps 0 and 1 of the 8 values whose first sample is at S + off, as int16 pairs (tap 0 in the
// low half of each 32-bit lane, tap 1 in the high half): _mm256_madd_epi16's operand.
template <int CN>
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE __m256i tap_pairs(const std::uint8_t* S, __m256i off) {
  static_assert(CN >= 1 && CN <= 4);
  if constexpr (CN <= 3) {
    const __m256i g = gather(S, off);
    const char z = -128;  // a pshufb index with the top bit set writes 0
    const __m256i pick =
        _mm256_setr_epi8(0, z, CN, z, 4, z, 4 + CN, z, 8, z, 8 + CN, z, 12, z, 12 + CN, z, 0, z, CN,
                         z, 4, z, 4 + CN, z, 8, z, 8 + CN, z, 12, z, 12 + CN, z);
    return _mm256_shuffle_epi8(g, pick);
  } else {
    const __m256i lo = _mm256_set1_epi32(0xFF);
    const __m256i g0 = _mm256_and_si256(gather(S, off), lo);
    const __m256i g1 = _mm256_and_si256(gather(S + CN, off), lo);
    return _mm256_or_si256(g0, _mm256_slli_epi32(g1, 16));
  }
}

// Taps 0 and 1 of the 8 values as int32 lanes.
template <int CN>
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE void tap_ints(const std::uint8_t* S, __m256i off, __m256i& t0,
                                                  __m256i& t1) {
  static_assert(CN >= 1 && CN <= 4);
  const __m256i lo = _mm256_set1_epi32(0xFF);
  const __m256i g = gather(S, off);
  t0 = _mm256_and_si256(g, lo);
  if constexpr (CN == 3) {
    t1 = _mm256_srli_epi32(g, 24);
  } else if constexpr (CN <= 2) {
    t1 = _mm256_and_si256(_mm256_srli_epi32(g, 8 * CN), lo);
  } else {
    t1 = _mm256_and_si256(gather(S + CN, off), lo);
  }
}

// 8 values (0..255 after rounding) as bytes at out.
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE void store8_u8(std::uint8_t* out, __m256i v) {
  const __m256i w = _mm256_packs_epi32(v, v);  // [v0..3 v0..3 | v4..7 v4..7] as int16
  const __m256i b = _mm256_packus_epi16(w, w);
  const __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi32(lo, hi));
}

// 16 values as bytes at out.
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE void store16_u8(std::uint8_t* out, __m256i a, __m256i b) {
  const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);  // a0..7 b0..7
  const __m256i u = _mm256_packus_epi16(w, w);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm256_castsi256_si128(_mm256_permute4x64_epi64(u, 0x08)));
}

// Rounded half to even and clamped to 0..255, as int32 lanes: the scalar code's
// clamp(round_even(v)) for any float.
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE __m256i round_clamp(__m256 v) {
  const __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 c = _mm256_min_ps(_mm256_max_ps(r, _mm256_setzero_ps()), _mm256_set1_ps(255.f));
  return _mm256_cvttps_epi32(c);
}

#endif  // SAPIENS_SEG_X86

}  // namespace sapiens_seg::core::resize_detail::avx2
