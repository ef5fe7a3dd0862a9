// resize_u8 on the host: OpenCV's resize structure (a horizontal pass per source row into a small
// cache of rows, then a vertical pass per output row), with its arithmetic operation for
// operation. Output rows are spread over LibTorch's intra-op threads; each thread keeps its own
// row cache, so the result does not depend on how rows are split.
//
// Every loop has a portable form (plain C++, the reference; it also finishes the values the
// vector form leaves at the ends of a row) and, on x86, an AVX2 form chosen at run time
// (cpu.hpp). The vector forms compute each value with the same operations in the same order,
// only many values at a time; integer sums are exact in any grouping, float ones are not
// regrouped. The horizontal tables are rearranged here for the vector loads (per output value,
// structure of arrays) but come from taps.cpp, which alone decides taps and weights.
//
// Built with -ffp-contract=off (CMakeLists.txt): OpenCV's x86-64 build has no FMA in these
// loops, and a contracted multiply-add rounds differently.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>

#include "avx2.hpp"
#include "cpu.hpp"
#include "resize.hpp"
#include "sapiens_seg/error.hpp"
#include "taps.hpp"
#include "wheel_cubic.hpp"

namespace sapiens_seg::core {

using resize_detail::AreaEntry;
using resize_detail::Simd;
using resize_detail::Taps;

Interp parse_interp(const std::string& name) {
  if (name == "linear") return Interp::kLinear;
  if (name == "area") return Interp::kArea;
  if (name == "cubic") return Interp::kCubic;
  throw Error(ErrorCode::kInvalidInput,
              "unknown interpolation '" + name + "' (linear, area or cubic)");
}

const char* to_string(Interp interp) {
  switch (interp) {
    case Interp::kLinear:
      return "linear";
    case Interp::kArea:
      return "area";
    case Interp::kCubic:
      return "cubic";
  }
  return "?";
}

namespace {

namespace avx2 = resize_detail::avx2;

// Output rows per task: enough to amortise the rows a task must compute twice at its top edge.
constexpr int64_t kRowGrain = 16;

struct Geometry {
  const std::uint8_t* src;
  std::size_t sstride;
  int h, w, cn;
  std::uint8_t* dst;
  std::size_t dstride;
  int H, W;
  Simd simd;
  const std::uint8_t* src_row(int y) const { return src + static_cast<std::size_t>(y) * sstride; }
  std::uint8_t* dst_row(int64_t y) const { return dst + static_cast<std::size_t>(y) * dstride; }
};

// Round to nearest, ties to even, for |v| < 2^22, in plain float arithmetic (what cvRound and
// _mm_cvtps_epi32 give in the default mode).
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return v >= 0 ? (v + kMagic) - kMagic : (v - kMagic) + kMagic;
}

inline std::uint8_t clamp_u8(int v) {
  return static_cast<std::uint8_t>(std::clamp(v, 0, 255));
}

// The first index in [0, n) at which off[i] + reach passes `limit` (n if none): the vector
// loads of the values before it stay inside the source row.
int loads_end(const std::vector<std::int32_t>& off, int reach, int limit) {
  const int n = static_cast<int>(off.size());
  for (int i = 0; i < n; ++i) {
    if (off[static_cast<std::size_t>(i)] + reach > limit) return i;
  }
  return n;
}

// ---- separable fixed-point filters (INTER_LINEAR, INTER_AREA enlarging, OpenCV's cubic) ------

// The horizontal table per output value (pixel and channel), with each pixel's K taps moved onto
// K consecutive source pixels: a clamped tap repeats a border pixel, and adding its weight to
// that pixel's changes no sum (the sums are exact integers). Consecutive pixels let the vector
// loop fetch two taps of a value with one load.
struct FixedRow {
  int K = 0, n = 0;               // n = W * cn values
  int row_bytes = 0;              // bytes of the row the taps read: max(w, K) * cn
  bool pad = false;               // w < K: a row is first copied into a K-pixel buffer
  std::vector<std::int32_t> off;  // [n] byte offset of the value's first tap
  std::vector<std::int16_t> w01;  // [2n] weights of taps 0 and 1, value after value
  std::vector<std::int16_t> w23;  // [2n] taps 2 and 3 (K = 4)
  int simd_end = 0;               // values [0, simd_end) take the vector loop
  int pixel_load_end = 0;         // 3 channels: values [0, this) may load 8 bytes per pixel
};

FixedRow fixed_row(const Taps& t, int w, int W, int cn) {
  const int K = t.ksize;
  FixedRow r;
  r.K = K;
  r.n = W * cn;
  r.pad = w < K;
  const int span = std::max(w, K);
  r.row_bytes = span * cn;
  r.off.resize(static_cast<std::size_t>(r.n));
  r.w01.resize(static_cast<std::size_t>(r.n) * 2);
  if (K == 4) r.w23.resize(static_cast<std::size_t>(r.n) * 2);
  for (int dx = 0; dx < W; ++dx) {
    const std::int32_t* idx = t.index.data() + static_cast<std::size_t>(dx) * K;
    const std::int16_t* wt = t.fixed.data() + static_cast<std::size_t>(dx) * K;
    const int s = std::min(*std::min_element(idx, idx + K), span - K);
    int merged[4] = {0, 0, 0, 0};
    for (int k = 0; k < K; ++k) {
      if (idx[k] < s || idx[k] >= s + K) {
        throw Error(ErrorCode::kInternal, "resize: taps do not fit consecutive pixels");
      }
      merged[idx[k] - s] += wt[k];
    }
    for (int k = 0; k < K; ++k) {
      if (merged[k] < -32768 || merged[k] > 32767) {
        throw Error(ErrorCode::kInternal, "resize: merged weight out of range");
      }
    }
    for (int c = 0; c < cn; ++c) {
      const std::size_t i = static_cast<std::size_t>(dx) * cn + c;
      r.off[i] = s * cn + c;
      r.w01[2 * i] = static_cast<std::int16_t>(merged[0]);
      r.w01[2 * i + 1] = static_cast<std::int16_t>(merged[1]);
      if (K == 4) {
        r.w23[2 * i] = static_cast<std::int16_t>(merged[2]);
        r.w23[2 * i + 1] = static_cast<std::int16_t>(merged[3]);
      }
    }
  }
  r.simd_end = loads_end(r.off, resize_detail::avx2::pair_reach(cn, K - 2), r.row_bytes);
  if (cn == 3) {
    // The pixel-pair loop (hpass_linear3_avx2) reads 8 bytes from each pixel's first tap, i.e.
    // from the offset of its channel 0 value.
    int k = 0;
    while (k < W && r.off[static_cast<std::size_t>(k) * 3] + 8 <= r.row_bytes) ++k;
    r.pixel_load_end = 3 * k;
  }
  return r;
}

// K = 2 rows keep what INTER_LINEAR's vertical pass uses of them, each sum shifted right by 4
// (OpenCV packs them to int16 the same way): the weights are >= 0 and sum to at most 2049, so
// the shifted sum (<= 255 * 2049 >> 4) fits. K = 4 rows keep the int32 sums.
template <int K>
using FixedRowValue = std::conditional_t<K == 2, std::int16_t, std::int32_t>;

// Values [i0, n) of the horizontal pass.
template <int CN, int K>
void hpass_fixed(const std::uint8_t* S, const FixedRow& t, int i0, FixedRowValue<K>* D) {
  const std::int32_t* off = t.off.data();
  const std::int16_t* a = t.w01.data();
  const std::int16_t* b = t.w23.data();
  constexpr std::ptrdiff_t kCn = CN;  // pointer offsets in ptrdiff_t
  for (int i = i0; i < t.n; ++i) {
    const std::uint8_t* p = S + off[i];
    const auto j = static_cast<std::ptrdiff_t>(i);
    std::int32_t v = p[0] * a[2 * j] + p[kCn] * a[2 * j + 1];
    if constexpr (K == 4) {
      D[i] = v + p[2 * kCn] * b[2 * j] + p[3 * kCn] * b[2 * j + 1];
    } else {
      D[i] = static_cast<std::int16_t>(v >> 4);
    }
  }
}

// INTER_LINEAR's vertical pass (VResizeLinearVec_32s8u and its scalar twin agree): each row term
// (already shifted by 4) keeps the high half of its 16 x 16-bit product with the weight, and
// the sum is rounded by its last 2 bits.
void vpass_linear(const std::int16_t* r0, const std::int16_t* r1, std::int16_t b0, std::int16_t b1,
                  std::uint8_t* out, int x0, int n) {
  for (int x = x0; x < n; ++x) {
    const auto h0 = static_cast<std::int16_t>((static_cast<std::int32_t>(r0[x]) * b0) >> 16);
    const auto h1 = static_cast<std::int16_t>((static_cast<std::int32_t>(r1[x]) * b1) >> 16);
    out[x] = clamp_u8((h0 + h1 + 2) >> 2);
  }
}

// OpenCV's cubic vertical pass: the first n / 8 * 8 values in float32 (VResizeCubicVec_32s8u:
// the weights scaled by 2^-22, accumulated from the last row to the first, rounded to even), the
// remainder of the row in integer arithmetic (FixedPtCast, rounding half up).
inline float cubic_vscale(std::int16_t b) {
  return b * (1.f / (resize_detail::kCoefScale * resize_detail::kCoefScale));
}

void vpass_cubic(const std::int32_t* const r[4], const std::int16_t* b, std::uint8_t* out, int x0,
                 int n) {
  const float f0 = cubic_vscale(b[0]), f1 = cubic_vscale(b[1]), f2 = cubic_vscale(b[2]),
              f3 = cubic_vscale(b[3]);
  const int vec_end = n / 8 * 8;
  for (int x = x0; x < vec_end; ++x) {
    float t = static_cast<float>(r[3][x]) * f3;
    t = static_cast<float>(r[2][x]) * f2 + t;
    t = static_cast<float>(r[1][x]) * f1 + t;
    t = static_cast<float>(r[0][x]) * f0 + t;
    out[x] = clamp_u8(static_cast<int>(round_even(t)));
  }
  for (int x = std::max(x0, vec_end); x < n; ++x) {
    const std::int32_t v =
        r[0][x] * b[0] + r[1][x] * b[1] + r[2][x] * b[2] + r[3][x] * b[3] + (1 << 21);
    out[x] = clamp_u8(v >> 22);
  }
}

#ifdef SAPIENS_SEG_X86
// The AVX2 forms: each returns the first value it left to the portable loop.

// Two consecutive pixels' 8-byte loads (a pixel's two taps are its first 6 bytes) as one lane.
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE __m128i pixel_pair(const std::uint8_t* S, std::int32_t a,
                                                       std::int32_t b) {
  return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(S + a)),
                            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(S + b)));
}

// INTER_LINEAR's horizontal pass for 3 channels without gathers (the gathers' one load per value
// made large downscales, whose taps never share a load, twice OpenCV's time): 8 pixels, 24
// values, per step, each pixel's taps fetched by one 8-byte load. A 128-bit lane's 4 values lie
// in 2 consecutive pixels, in one of 3 patterns (the first value's channel), so pshufb puts each
// value's two taps side by side for _mm256_madd_epi16, in value order. Returns the first value
// left to the other loops (a multiple of 24).
SAPIENS_SEG_AVX2 int hpass_linear3_avx2(const std::uint8_t* S, const FixedRow& t, std::int16_t* D) {
  const std::int32_t* off = t.off.data();
  const auto* a = reinterpret_cast<const __m256i*>(t.w01.data());
  const char z = -128;  // a pshufb index with the top bit set writes 0
  // [Pk | Pk+1], tap 0 of channel c at byte c of its pixel, tap 1 at 3 + c.
  const __m128i first_c0 = _mm_setr_epi8(0, z, 3, z, 1, z, 4, z, 2, z, 5, z, 8, z, 11, z);
  const __m128i first_c1 = _mm_setr_epi8(1, z, 4, z, 2, z, 5, z, 8, z, 11, z, 9, z, 12, z);
  const __m128i first_c2 = _mm_setr_epi8(2, z, 5, z, 8, z, 11, z, 9, z, 12, z, 10, z, 13, z);
  const __m256i pick_a = _mm256_set_m128i(first_c1, first_c0);
  const __m256i pick_b = _mm256_set_m128i(first_c0, first_c2);
  const __m256i pick_c = _mm256_set_m128i(first_c2, first_c1);
  int i = 0;
  for (; i + 24 <= t.pixel_load_end; i += 24) {
    const std::int32_t* o = off + i;  // pixel k of the step starts at o[3 * k]
    const __m256i la = _mm256_set_m128i(pixel_pair(S, o[3], o[6]), pixel_pair(S, o[0], o[3]));
    const __m256i lb = _mm256_set_m128i(pixel_pair(S, o[12], o[15]), pixel_pair(S, o[6], o[9]));
    const __m256i lc = _mm256_set_m128i(pixel_pair(S, o[18], o[21]), pixel_pair(S, o[15], o[18]));
    const __m256i va = _mm256_srai_epi32(
        _mm256_madd_epi16(_mm256_shuffle_epi8(la, pick_a), _mm256_loadu_si256(a + i / 8)), 4);
    const __m256i vb = _mm256_srai_epi32(
        _mm256_madd_epi16(_mm256_shuffle_epi8(lb, pick_b), _mm256_loadu_si256(a + i / 8 + 1)), 4);
    const __m256i vc = _mm256_srai_epi32(
        _mm256_madd_epi16(_mm256_shuffle_epi8(lc, pick_c), _mm256_loadu_si256(a + i / 8 + 2)), 4);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(D + i),
                        _mm256_permute4x64_epi64(_mm256_packs_epi32(va, vb), 0xD8));
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(D + i + 16),
        _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packs_epi32(vc, vc), 0xD8)));
  }
  return i;
}

template <int CN, int K>
SAPIENS_SEG_AVX2 int hpass_fixed_avx2(const std::uint8_t* S, const FixedRow& t,
                                      FixedRowValue<K>* D) {
  const std::int32_t* off = t.off.data();
  int i = 0;
  if constexpr (K == 2) {
    const auto* a = reinterpret_cast<const __m256i*>(t.w01.data());  // one pair per value
    if constexpr (CN == 3) i = hpass_linear3_avx2(S, t, D);
    for (; i + 16 <= t.simd_end; i += 16) {
      const __m256i o0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(off + i));
      const __m256i o1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(off + i + 8));
      __m256i v0 = _mm256_madd_epi16(avx2::tap_pairs<CN>(S, o0), _mm256_loadu_si256(a + i / 8));
      __m256i v1 = _mm256_madd_epi16(avx2::tap_pairs<CN>(S, o1), _mm256_loadu_si256(a + i / 8 + 1));
      v0 = _mm256_srai_epi32(v0, 4);
      v1 = _mm256_srai_epi32(v1, 4);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(D + i),
                          _mm256_permute4x64_epi64(_mm256_packs_epi32(v0, v1), 0xD8));
    }
  } else {
    const auto* a = reinterpret_cast<const __m256i*>(t.w01.data());
    const auto* b = reinterpret_cast<const __m256i*>(t.w23.data());
    const __m256i step2 = _mm256_set1_epi32(2 * CN);
    for (; i + 8 <= t.simd_end; i += 8) {
      const __m256i o = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(off + i));
      const __m256i v01 =
          _mm256_madd_epi16(avx2::tap_pairs<CN>(S, o), _mm256_loadu_si256(a + i / 8));
      const __m256i v23 = _mm256_madd_epi16(avx2::tap_pairs<CN>(S, _mm256_add_epi32(o, step2)),
                                            _mm256_loadu_si256(b + i / 8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(D + i), _mm256_add_epi32(v01, v23));
    }
  }
  return i;
}

// 16 values of INTER_LINEAR's vertical pass as int16 (no lambdas here: they would not inherit
// the AVX2 target).
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE __m256i linear16(const std::int16_t* r0, const std::int16_t* r1,
                                                     __m256i w0, __m256i w1) {
  const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0));
  const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1));
  const __m256i s = _mm256_add_epi16(_mm256_mulhi_epi16(a0, w0), _mm256_mulhi_epi16(a1, w1));
  return _mm256_srai_epi16(_mm256_add_epi16(s, _mm256_set1_epi16(2)), 2);
}

SAPIENS_SEG_AVX2 int vpass_linear_avx2(const std::int16_t* r0, const std::int16_t* r1,
                                       std::int16_t b0, std::int16_t b1, std::uint8_t* out, int n) {
  const __m256i w0 = _mm256_set1_epi16(b0), w1 = _mm256_set1_epi16(b1);
  int x = 0;
  for (; x + 32 <= n; x += 32) {
    const __m256i u = _mm256_packus_epi16(linear16(r0 + x, r1 + x, w0, w1),
                                          linear16(r0 + x + 16, r1 + x + 16, w0, w1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + x), _mm256_permute4x64_epi64(u, 0xD8));
  }
  return x;
}

// 8 values of the cubic vertical pass, rounded and clamped, as int32.
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE __m256i cubic8(const std::int32_t* const r[4], int x,
                                                   const __m256 f[4]) {
  __m256 t = _mm256_setzero_ps();
  for (int k = 3; k >= 0; --k) {
    const __m256 v =
        _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r[k] + x)));
    t = k == 3 ? _mm256_mul_ps(v, f[3]) : _mm256_add_ps(_mm256_mul_ps(v, f[k]), t);
  }
  return avx2::round_clamp(t);
}

SAPIENS_SEG_AVX2 int vpass_cubic_avx2(const std::int32_t* const r[4], const std::int16_t* b,
                                      std::uint8_t* out, int n) {
  const __m256 f[4] = {_mm256_set1_ps(cubic_vscale(b[0])), _mm256_set1_ps(cubic_vscale(b[1])),
                       _mm256_set1_ps(cubic_vscale(b[2])), _mm256_set1_ps(cubic_vscale(b[3]))};
  const int vec_end = n / 8 * 8;  // the float part; the rest is the portable loop's
  int x = 0;
  for (; x + 16 <= vec_end; x += 16)
    avx2::store16_u8(out + x, cubic8(r, x, f), cubic8(r, x + 8, f));
  for (; x + 8 <= vec_end; x += 8) avx2::store8_u8(out + x, cubic8(r, x, f));
  return x;
}
#endif  // SAPIENS_SEG_X86

template <int CN, int K>
void run_fixed(const Geometry& g, const Taps& tx, const Taps& ty) {
  using Value = FixedRowValue<K>;
  const int n = g.W * CN;
  const FixedRow table = fixed_row(tx, g.w, g.W, CN);
  const bool vec = g.simd == Simd::kAvx2;
  at::parallel_for(0, g.H, kRowGrain, [&](int64_t y0, int64_t y1) {
    // Horizontally filtered source rows, K of them cached by source row index.
    std::vector<Value> store(static_cast<std::size_t>(n) * K);
    std::vector<std::uint8_t> padded(table.pad ? static_cast<std::size_t>(table.row_bytes) : 0);
    Value* slot[K];
    int slot_row[K];
    for (int k = 0; k < K; ++k)
      slot[k] = store.data() + static_cast<std::size_t>(n) * k, slot_row[k] = -1;
    auto hpass = [&](int sy, Value* D) {
      const std::uint8_t* S = g.src_row(sy);
      if (table.pad) {  // taps past the row's end weigh 0; give them bytes to read
        std::memcpy(padded.data(), S, static_cast<std::size_t>(g.w) * CN);
        S = padded.data();
      }
      int i = 0;
#ifdef SAPIENS_SEG_X86
      if (vec) i = hpass_fixed_avx2<CN, K>(S, table, D);
#endif
      hpass_fixed<CN, K>(S, table, i, D);
    };
    const Value* rows[K];
    for (int64_t dy = y0; dy < y1; ++dy) {
      const std::int32_t* sy = ty.index.data() + static_cast<std::size_t>(dy) * K;
      for (int k = 0; k < K; ++k) {
        int found = -1;
        for (int j = 0; j < K; ++j) {
          if (slot_row[j] == sy[k]) found = j;
        }
        if (found < 0) {
          // Evict a slot no tap of this output row uses.
          for (int j = 0; j < K && found < 0; ++j) {
            bool used = false;
            for (int q = 0; q < K; ++q) used = used || slot_row[j] == sy[q];
            if (!used) found = j;
          }
          hpass(sy[k], slot[found]);
          slot_row[found] = sy[k];
        }
        rows[k] = slot[found];
      }
      std::uint8_t* out = g.dst_row(dy);
      const std::int16_t* b = ty.fixed.data() + static_cast<std::size_t>(dy) * K;
      int x = 0;
      if constexpr (K == 2) {
#ifdef SAPIENS_SEG_X86
        if (vec) x = vpass_linear_avx2(rows[0], rows[1], b[0], b[1], out, n);
#endif
        vpass_linear(rows[0], rows[1], b[0], b[1], out, x, n);
      } else {
#ifdef SAPIENS_SEG_X86
        if (vec) x = vpass_cubic_avx2(rows, b, out, n);
#endif
        vpass_cubic(rows, b, out, x, n);
      }
    }
  });
}

template <int K>
void run_fixed_cn(const Geometry& g, const Taps& tx, const Taps& ty) {
  switch (g.cn) {
    case 1:
      return run_fixed<1, K>(g, tx, ty);
    case 2:
      return run_fixed<2, K>(g, tx, ty);
    case 3:
      return run_fixed<3, K>(g, tx, ty);
    default:
      return run_fixed<4, K>(g, tx, ty);
  }
}

// ---- INTER_AREA, integer factor -----------------------------------------------------------

// OpenCV's 2x2 mean, (a + b + c + d + 2) >> 2, for output pixels [x0, W) of one row.
template <int CN>
void area2x2(const std::uint8_t* r0, const std::uint8_t* r1, std::uint8_t* out, int x0, int W) {
  for (int dx = x0; dx < W; ++dx) {
    const int s = 2 * CN * dx;
    for (int c = 0; c < CN; ++c) {
      out[dx * CN + c] = static_cast<std::uint8_t>(
          (r0[s + c] + r0[s + CN + c] + r1[s + c] + r1[s + CN + c] + 2) >> 2);
    }
  }
}

#ifdef SAPIENS_SEG_X86
// The same with the two samples of each output value put side by side by a shuffle and added by
// _mm256_maddubs_epi16 (bytes times 1, summed in pairs): int16 pair sums of 32 bytes at p.
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE __m256i pair_sums(__m256i v, __m256i order) {
  return _mm256_maddubs_epi16(_mm256_shuffle_epi8(v, order), _mm256_set1_epi8(1));
}

SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE __m256i mean4(__m256i top, __m256i bottom) {
  return _mm256_srli_epi16(_mm256_add_epi16(_mm256_add_epi16(top, bottom), _mm256_set1_epi16(2)),
                           2);
}

template <int CN>
SAPIENS_SEG_AVX2 int area2x2_avx2(const std::uint8_t* r0, const std::uint8_t* r1, std::uint8_t* out,
                                  int W) {
  static_assert(CN == 1 || CN == 3 || CN == 4);
  int dx = 0;
  if constexpr (CN == 3) {
    // 4 output pixels a step: each 128-bit lane makes 2 of them from 12 source bytes.
    const char z = -128;  // a pshufb index with the top bit set writes 0
    const __m256i order = _mm256_setr_epi8(0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11, z, z, z, z, 0, 3,
                                           1, 4, 2, 5, 6, 9, 7, 10, 8, 11, z, z, z, z);
    // The loads reach 28 bytes past the step's first source byte and the two 8-byte stores 14
    // past its first output byte: stop where either would leave the row.
    for (; dx + 5 <= W; dx += 4) {
      const auto x = static_cast<std::ptrdiff_t>(dx);
      const __m256i v0 = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(r0 + 6 * x + 12),
                                             reinterpret_cast<const __m128i*>(r0 + 6 * x));
      const __m256i v1 = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(r1 + 6 * x + 12),
                                             reinterpret_cast<const __m128i*>(r1 + 6 * x));
      const __m256i m = mean4(pair_sums(v0, order), pair_sums(v1, order));
      const __m256i u = _mm256_packus_epi16(m, m);  // each lane: 6 output bytes, then 2 zeros
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 3 * x), _mm256_castsi256_si128(u));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 3 * x + 6), _mm256_extracti128_si256(u, 1));
    }
  } else {
    // 32 output bytes a step from 64 bytes of each row (one channel: the pairs are adjacent
    // already; four: the shuffle interleaves two pixels).
    const __m256i order = _mm256_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15, 0,
                                           4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    constexpr int kStep = 32 / CN;  // output pixels a step
    const __m256i ones = _mm256_set1_epi8(1);
    for (; dx + kStep <= W; dx += kStep) {
      const auto x = static_cast<std::ptrdiff_t>(dx);
      __m256i v[4];  // rows 0, 1 of the first 32 bytes, then of the next
      for (int k = 0; k < 4; ++k) {
        const std::uint8_t* row =
            (k & 1 ? r1 : r0) + 2 * x * CN + static_cast<std::ptrdiff_t>(k >> 1) * 32;
        v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
        v[k] = CN == 1 ? _mm256_maddubs_epi16(v[k], ones) : pair_sums(v[k], order);
      }
      const __m256i lo = mean4(v[0], v[1]), hi = mean4(v[2], v[3]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + CN * x),
                          _mm256_permute4x64_epi64(_mm256_packus_epi16(lo, hi), 0xD8));
    }
  }
  return dx;
}
#endif  // SAPIENS_SEG_X86

template <int CN>
void run_area2x2(const Geometry& g) {
  const bool vec = g.simd == Simd::kAvx2;
  at::parallel_for(0, g.H, kRowGrain, [&](int64_t y0, int64_t y1) {
    for (int64_t dy = y0; dy < y1; ++dy) {
      const std::uint8_t* r0 = g.src_row(static_cast<int>(2 * dy));
      const std::uint8_t* r1 = g.src_row(static_cast<int>(2 * dy + 1));
      std::uint8_t* out = g.dst_row(dy);
      int dx = 0;
#ifdef SAPIENS_SEG_X86
      if (vec) dx = area2x2_avx2<CN>(r0, r1, out, g.W);
#endif
      area2x2<CN>(r0, r1, out, dx, g.W);
    }
  });
}

// Other integer factors: the float mean of each block, rounded to even.
void run_area_integer(const Geometry& g, int fx, int fy) {
  const int cn = g.cn;
  const float inv_area = 1.f / static_cast<float>(fx * fy);
  const int row_len = g.W * fx * cn;  // the source bytes the output row covers
  at::parallel_for(0, g.H, kRowGrain, [&](int64_t y0, int64_t y1) {
    // Integer sums are exact in any order: add the block's rows first (contiguous, vectorised),
    // then the columns of each block.
    std::vector<std::uint32_t> col(static_cast<std::size_t>(row_len));
    for (int64_t dy = y0; dy < y1; ++dy) {
      std::uint8_t* out = g.dst_row(dy);
      const std::uint8_t* top = g.src_row(static_cast<int>(dy * fy));
      for (int i = 0; i < row_len; ++i) col[static_cast<std::size_t>(i)] = top[i];
      for (int sy = 1; sy < fy; ++sy) {
        const std::uint8_t* row = top + static_cast<std::size_t>(sy) * g.sstride;
        for (int i = 0; i < row_len; ++i) col[static_cast<std::size_t>(i)] += row[i];
      }
      const std::uint32_t* c0 = col.data();
      const std::ptrdiff_t block = static_cast<std::ptrdiff_t>(fx) * cn;  // values per output pixel
      for (int dx = 0; dx < g.W; ++dx, c0 += block) {
        for (int c = 0; c < cn; ++c) {
          std::uint32_t sum = 0;
          for (int sx = 0; sx < fx; ++sx) sum += c0[sx * cn + c];
          out[dx * cn + c] =
              clamp_u8(static_cast<int>(round_even(static_cast<float>(sum) * inv_area)));
        }
      }
    }
  });
}

// ---- INTER_AREA, other shrinks: float overlap weights ------------------------------------

// The horizontal overlaps per output value. An output pixel's sources are consecutive pixels,
// so its table entries become taps at consecutive pixels, as many as the longest run, the
// missing ones with weight 0: their terms are +0, and adding +0 to a sum of non-negative terms
// changes nothing, so every value is the float sum of OpenCV's order.
struct AreaRow {
  int taps = 0, n = 0;
  std::vector<std::int32_t> off;  // [n] byte offset of the value's first tap
  std::vector<float> wt;          // [taps * n] weight of tap k of value i at k * n + i
  int simd_end = 0;               // values [0, simd_end) take the vector loop
};

AreaRow area_row(const std::vector<AreaEntry>& tab, int w, int W, int cn) {
  std::vector<int> first(static_cast<std::size_t>(W), -1), count(static_cast<std::size_t>(W), 0);
  for (const AreaEntry& e : tab) {
    auto& f = first[static_cast<std::size_t>(e.dst)];
    if (f < 0) f = e.src;
    if (e.src != f + count[static_cast<std::size_t>(e.dst)]) {
      throw Error(ErrorCode::kInternal, "resize: area sources not consecutive");
    }
    ++count[static_cast<std::size_t>(e.dst)];
  }
  AreaRow r;
  r.n = W * cn;
  r.taps = *std::max_element(count.begin(), count.end());
  r.off.resize(static_cast<std::size_t>(r.n));
  r.wt.assign(static_cast<std::size_t>(r.taps) * r.n, 0.f);
  std::vector<int> start(static_cast<std::size_t>(W));
  for (int dx = 0; dx < W; ++dx) {
    if (count[static_cast<std::size_t>(dx)] == 0) {
      throw Error(ErrorCode::kInternal, "resize: an output pixel without area sources");
    }
    // Padding taps go after the run, or before it at the row's end; either way they add +0.
    start[static_cast<std::size_t>(dx)] = std::min(first[static_cast<std::size_t>(dx)], w - r.taps);
    for (int c = 0; c < cn; ++c) {
      r.off[static_cast<std::size_t>(dx) * cn + c] = start[static_cast<std::size_t>(dx)] * cn + c;
    }
  }
  for (const AreaEntry& e : tab) {
    const int k = e.src - start[static_cast<std::size_t>(e.dst)];
    for (int c = 0; c < cn; ++c) {
      r.wt[static_cast<std::size_t>(k) * r.n + static_cast<std::size_t>(e.dst * cn + c)] = e.weight;
    }
  }
  r.simd_end = loads_end(r.off, resize_detail::avx2::pair_reach(cn, (r.taps - 1) / 2 * 2), w * cn);
  return r;
}

template <int CN>
void hpass_area(const std::uint8_t* S, const AreaRow& t, int i0, float* D) {
  const std::size_t n = static_cast<std::size_t>(t.n);
  for (int i = i0; i < t.n; ++i) {
    const std::uint8_t* p = S + t.off[static_cast<std::size_t>(i)];
    const float* w = t.wt.data() + i;
    float a = static_cast<float>(p[0]) * w[0];
    for (int k = 1; k < t.taps; ++k)
      a = a + static_cast<float>(p[static_cast<std::ptrdiff_t>(k) * CN]) * w[k * n];
    D[i] = a;
  }
}

// The vertical pass: sum = beta * row for an output row's first source row, sum + beta * row for
// the others, in OpenCV's order; the last one rounds the sum to `out`.
void vpass_area(const float* row, float beta, bool first, float* sum, std::uint8_t* out, int x0,
                int n) {
  for (int x = x0; x < n; ++x) {
    const float t = first ? beta * row[x] : sum[x] + beta * row[x];
    if (out) {
      out[x] = clamp_u8(static_cast<int>(round_even(t)));
    } else {
      sum[x] = t;
    }
  }
}

#ifdef SAPIENS_SEG_X86
template <int CN>
SAPIENS_SEG_AVX2 int hpass_area_avx2(const std::uint8_t* S, const AreaRow& t, float* D) {
  const std::size_t n = static_cast<std::size_t>(t.n);
  int i = 0;
  for (; i + 8 <= t.simd_end; i += 8) {
    const __m256i o = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.off.data() + i));
    const float* w = t.wt.data() + i;
    __m256 a = _mm256_setzero_ps();
    for (int k = 0; k < t.taps; k += 2) {
      __m256i p0, p1;
      avx2::tap_ints<CN>(S + static_cast<std::ptrdiff_t>(k) * CN, o, p0, p1);
      const __m256 t0 = _mm256_mul_ps(_mm256_cvtepi32_ps(p0), _mm256_loadu_ps(w + k * n));
      a = k == 0 ? t0 : _mm256_add_ps(a, t0);
      if (k + 1 < t.taps) {
        a = _mm256_add_ps(a,
                          _mm256_mul_ps(_mm256_cvtepi32_ps(p1), _mm256_loadu_ps(w + (k + 1) * n)));
      }
    }
    _mm256_storeu_ps(D + i, a);
  }
  return i;
}

SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE __m256 area_term(const float* row, __m256 beta, bool first,
                                                     const float* sum) {
  const __m256 t = _mm256_mul_ps(beta, _mm256_loadu_ps(row));
  return first ? t : _mm256_add_ps(_mm256_loadu_ps(sum), t);
}

SAPIENS_SEG_AVX2 int vpass_area_avx2(const float* row, float beta, bool first, float* sum,
                                     std::uint8_t* out, int n) {
  const __m256 b = _mm256_set1_ps(beta);
  int x = 0;
  if (out) {
    for (; x + 16 <= n; x += 16) {
      avx2::store16_u8(out + x, avx2::round_clamp(area_term(row + x, b, first, sum + x)),
                       avx2::round_clamp(area_term(row + x + 8, b, first, sum + x + 8)));
    }
  } else {
    for (; x + 8 <= n; x += 8) _mm256_storeu_ps(sum + x, area_term(row + x, b, first, sum + x));
  }
  return x;
}
#endif  // SAPIENS_SEG_X86

template <int CN>
void run_area_general(const Geometry& g) {
  const AreaRow xrow = area_row(resize_detail::area_table(g.w, g.W), g.w, g.W, CN);
  const std::vector<AreaEntry> ytab = resize_detail::area_table(g.h, g.H);
  // first[dy]: the first ytab entry of output row dy (the table is ordered by output row).
  std::vector<std::size_t> first(static_cast<std::size_t>(g.H) + 1, 0);
  for (const AreaEntry& e : ytab) ++first[static_cast<std::size_t>(e.dst) + 1];
  for (int dy = 0; dy < g.H; ++dy) {
    if (first[static_cast<std::size_t>(dy) + 1] == 0) {
      throw Error(ErrorCode::kInternal, "resize: an output row without area sources");
    }
    first[static_cast<std::size_t>(dy) + 1] += first[static_cast<std::size_t>(dy)];
  }
  const int n = g.W * CN;
  const bool vec = g.simd == Simd::kAvx2;
  at::parallel_for(0, g.H, kRowGrain, [&](int64_t y0, int64_t y1) {
    std::vector<float> buf(static_cast<std::size_t>(n)), sum(static_cast<std::size_t>(n));
    int buf_row = -1;  // a source row shared by two output rows is filtered once
    for (std::size_t j = first[static_cast<std::size_t>(y0)];
         j < first[static_cast<std::size_t>(y1)]; ++j) {
      const AreaEntry& e = ytab[j];
      if (e.src != buf_row) {
        const std::uint8_t* S = g.src_row(e.src);
        int i = 0;
#ifdef SAPIENS_SEG_X86
        if (vec) i = hpass_area_avx2<CN>(S, xrow, buf.data());
#endif
        hpass_area<CN>(S, xrow, i, buf.data());
        buf_row = e.src;
      }
      const auto dy = static_cast<std::size_t>(e.dst);
      const bool is_first = j == first[dy], is_last = j + 1 == first[dy + 1];
      std::uint8_t* out = is_last ? g.dst_row(e.dst) : nullptr;
      int x = 0;
#ifdef SAPIENS_SEG_X86
      if (vec) x = vpass_area_avx2(buf.data(), e.weight, is_first, sum.data(), out, n);
#endif
      vpass_area(buf.data(), e.weight, is_first, sum.data(), out, x, n);
    }
  });
}

void run_area_general_cn(const Geometry& g) {
  switch (g.cn) {
    case 1:
      return run_area_general<1>(g);
    case 2:
      return run_area_general<2>(g);
    case 3:
      return run_area_general<3>(g);
    default:
      return run_area_general<4>(g);
  }
}

}  // namespace

namespace resize_detail {

void resize_u8_simd(const PixelsU8& src, const MutablePixelsU8& dst, Interp interp,
                    CubicFlavor flavor, Simd simd) {
  if (!src.data || !dst.data || src.height < 1 || src.width < 1 || dst.height < 1 ||
      dst.width < 1 || src.channels < 1 || src.channels > 4 || dst.channels != src.channels) {
    throw Error(ErrorCode::kInternal, "resize_u8: invalid image geometry");
  }
#ifndef SAPIENS_SEG_X86
  simd = Simd::kPortable;
#endif
  const int cn = src.channels;
  const Geometry g{src.data,
                   src.stride ? src.stride : static_cast<std::size_t>(src.width) * cn,
                   src.height,
                   src.width,
                   cn,
                   dst.data,
                   dst.stride ? dst.stride : static_cast<std::size_t>(dst.width) * cn,
                   dst.height,
                   dst.width,
                   simd};
  if (g.h == g.H && g.w == g.W) {  // OpenCV copies
    for (int y = 0; y < g.h; ++y) {
      std::memcpy(g.dst_row(y), g.src_row(y), static_cast<std::size_t>(g.w) * cn);
    }
    return;
  }
  const int fx = integer_factor(g.w, g.W);
  const int fy = integer_factor(g.h, g.H);
  if (interp == Interp::kLinear && fx == 2 && fy == 2) interp = Interp::kArea;
  switch (interp) {
    case Interp::kLinear:
      return run_fixed_cn<2>(g, linear_taps(g.w, g.W, true), linear_taps(g.h, g.H, false));
    case Interp::kArea:
      if (scale_of(g.w, g.W) >= 1 && scale_of(g.h, g.H) >= 1) {
        if (fx == 2 && fy == 2 && cn != 2) {  // OpenCV's 2x2 vector code (not for 2 channels)
          return cn == 1 ? run_area2x2<1>(g) : cn == 3 ? run_area2x2<3>(g) : run_area2x2<4>(g);
        }
        if (fx > 0 && fy > 0) return run_area_integer(g, fx, fy);
        return run_area_general_cn(g);
      }
      return run_fixed_cn<2>(g, area_mode_taps(g.w, g.W, true), area_mode_taps(g.h, g.H, false));
    case Interp::kCubic:
      if (flavor == CubicFlavor::kWheel) {
        // The wheel hands sources under 4 pixels on a side to OpenCV's own code (IPP refuses
        // them), and runs OpenCV's own code everywhere on CPUs IPP is not used on.
        const IppPath path = wheel_ipp_path();
        if (path != IppPath::kOwn && g.w >= 4 && g.h >= 4) {
          return wheel_cubic_host(g.src, g.sstride, g.h, g.w, cn, g.dst, g.dstride, g.H, g.W, path,
                                  simd);
        }
      }
      return run_fixed_cn<4>(g, cubic_taps(g.w, g.W), cubic_taps(g.h, g.H));
  }
}

}  // namespace resize_detail

void resize_u8(const PixelsU8& src, const MutablePixelsU8& dst, Interp interp, CubicFlavor flavor) {
  resize_detail::resize_u8_simd(src, dst, interp, flavor, resize_detail::host_simd());
}

}  // namespace sapiens_seg::core
