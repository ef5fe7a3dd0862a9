#include "aten_arith.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include <ATen/Version.h>

#include "cpuid.hpp"

#ifdef SAPIENS_SEG_X86
#include <immintrin.h>
#endif

// Compiled with -ffp-contract=off (CMakeLists.txt): LibTorch's kernels round every product and
// every sum; a contracted multiply-add would not.

namespace sapiens_seg::core::cpu::aten_arith {

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "AVX512";
    case Isa::kAvx2:
      return "AVX2";
    default:
      return "DEFAULT";
  }
}

Isa libtorch_isa() {
  static const Isa isa = [] {
    const std::string c = at::get_cpu_capability();
    if (c == "AVX512") return Isa::kAvx512;
    if (c == "AVX2") return Isa::kAvx2;
    return Isa::kDefault;
  }();
  return isa;
}

int64_t lanes(Isa isa) {
  return isa == Isa::kAvx512 ? 16 : 8;
}

// ---- DEFAULT: LibTorch's generic Vectorized<float>, 8 lanes of scalar code -------------------

namespace base {

struct V {
  static constexpr int64_t n = 8;
  struct T {
    float v[8];
  };
  template <class F>
  static T map(const F& f) {
    T r;
    for (int64_t i = 0; i < n; ++i) r.v[i] = f(i);
    return r;
  }
  static T zero() { return set1(0.0f); }
  static T set1(float x) {
    return map([&](int64_t) { return x; });
  }
  static T load(const float* p) {
    return map([&](int64_t i) { return p[i]; });
  }
  static void store(float* p, const T& a) { std::memcpy(p, a.v, sizeof(a.v)); }
  static T add(const T& a, const T& b) {
    return map([&](int64_t i) { return a.v[i] + b.v[i]; });
  }
  static T mul(const T& a, const T& b) {
    return map([&](int64_t i) { return a.v[i] * b.v[i]; });
  }
  static T div(const T& a, const T& b) {
    return map([&](int64_t i) { return a.v[i] / b.v[i]; });
  }
  static T neg(const T& a) {
    return map([&](int64_t i) { return -a.v[i]; });
  }
  static T exp(const T& a) {  // vec_base's exp: std::exp on each lane
    return map([&](int64_t i) { return std::exp(a.v[i]); });
  }
  static T round_bf16(const T& a);
  static T load_bf16(const uint16_t* p);
  static void store_bf16(uint16_t* p, const T& a);
};
using VS = V;

#include "aten_arith_kernels.inc"

V::T V::round_bf16(const T& a) {
  return map([&](int64_t i) { return base::round_bf16(a.v[i]); });
}
V::T V::load_bf16(const uint16_t* p) {
  return map([&](int64_t i) { return widen_bf16(p[i]); });
}
void V::store_bf16(uint16_t* p, const T& a) {
  for (int64_t i = 0; i < n; ++i) p[i] = bits_bf16(a.v[i]);
}

}  // namespace base

#ifdef SAPIENS_SEG_X86

// GCC 12's AVX-512 headers pass an undefined vector as the unused merge source of unmasked
// conversions, which -Wmaybe-uninitialized reports once inlined (as in cpu/vec.hpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// ---- AVX2: Vectorized<float> on __m256, exp from SLEEF ---------------------------------------

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {

// LibTorch's Vectorized<float>::exp in its AVX2 build (exported by libtorch_cpu).
extern "C" __m256 Sleef_expf8_u10(__m256);

struct V {
  static constexpr int64_t n = 8;
  using T = __m256;
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T a) { _mm256_storeu_ps(p, a); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T neg(T a) { return _mm256_xor_ps(_mm256_set1_ps(-0.0f), a); }
  static T exp(T a) { return Sleef_expf8_u10(a); }
  static T round_bf16(T a) {
    const __m256i u = _mm256_castps_si256(a);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    r = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
    const __m256 nan = _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r),
                            _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan);
  }
  static T load_bf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static void store_bf16(uint16_t* p, T a) {
    const __m256i r = _mm256_srli_epi32(_mm256_castps_si256(round_bf16(a)), 16);
    // The values fit 16 bits; packus works within 128-bit lanes, hence the split.
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
};
using VS = V;

#include "aten_arith_kernels.inc"

}  // namespace avx2
#pragma GCC pop_options

// ---- AVX512: Vectorized<float> on __m512, exp from SLEEF -------------------------------------

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace avx512 {

extern "C" __m512 Sleef_expf16_u10(__m512);

struct V {
  static constexpr int64_t n = 16;
  using T = __m512;
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T a) { _mm512_storeu_ps(p, a); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  static T neg(T a) { return _mm512_xor_ps(_mm512_set1_ps(-0.0f), a); }
  static T exp(T a) { return Sleef_expf16_u10(a); }
  static T round_bf16(T a) {
    const __m512i u = _mm512_castps_si512(a);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q),
                              _mm512_set1_epi32(0x7FC00000));
    return _mm512_castsi512_ps(r);
  }
  static T load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static void store_bf16(uint16_t* p, T a) {
    const __m512i r = _mm512_srli_epi32(_mm512_castps_si512(round_bf16(a)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
};
// LibTorch's sum runs its AVX2 kernel in the AVX512 build (measured: its bits are the 8-lane
// cascade's; tests/cpp/test_fused_passes.cpp).
using VS = avx2::V;

#include "aten_arith_kernels.inc"

}  // namespace avx512
#pragma GCC pop_options

#pragma GCC diagnostic pop

#endif  // SAPIENS_SEG_X86

namespace {

template <class S>
const Kernels<S>& kernels_of(Isa isa) {
#ifdef SAPIENS_SEG_X86
  // LibTorch picks its build by the same instructions; a forced one the CPU lacks never gets here
  // (ATEN_CPU_CAPABILITY cannot raise LibTorch's above the CPU's).
  if (isa == Isa::kAvx512 && host_cpu_features().avx512_core()) return avx512::kernels_here<S>();
  if (isa == Isa::kAvx2 && host_cpu_features().avx2_fma_f16c()) return avx2::kernels_here<S>();
#else
  (void)isa;
#endif
  return base::kernels_here<S>();
}

}  // namespace

const Kernels<float>& kernels(Isa isa) {
  return kernels_of<float>(isa);
}

const Kernels<std::uint16_t>& kernels_bf16(Isa isa) {
  return kernels_of<std::uint16_t>(isa);
}

}  // namespace sapiens_seg::core::cpu::aten_arith
