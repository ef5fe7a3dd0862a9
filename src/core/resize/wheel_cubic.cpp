// The opencv-python wheel's INTER_CUBIC (Intel IPP's cubic resize), reproduced.
//
// How it was established: PyPI's full IPP (`ipp` 2026.1, whose libraries keep their symbol names)
// gives the wheel's bytes through ippiResizeCubic_8u_C3R for every code path; the routines it
// runs (the filter build, the row and column passes, the border routines of each library) were
// read from their machine code, and the arithmetic below was checked against the wheel itself
// on thousands of shapes per path (tests/python/test_resize.py keeps 64 of them, per path, in
// CI). Facts only; no IPP code is used or copied.
//
// Common to all paths:
// - Tables per axis: s = (d + 0.5) * (src / dst) - 0.5 in double, ix = floor(s), the fraction
//   t = float(s - ix); tap distances start at x = -1 - t in float32 (one rounding when t >= 0.5)
//   and step by 1.0f; each weight is the Keys kernel (B = 0, C = 0.75) of |x| evaluated in double
//   in a fixed order and rounded to float32. Weights are not normalised. Taps outside the image
//   are clamped (replicated border).
// - A horizontal pass per source row into float32 rows (not rounded), then a vertical pass over
//   four of them, rounded half to even and clamped to 0..255.
// - "Border" columns (rows) are the outputs whose taps leave the image: the first nleft with
//   ix < 1 and the last nright with ix >= src - 2.
// What differs is the accumulation order and the use of fused multiply-adds:
// - k0 (AVX-512): border columns sequentially with FMA; interior columns the same (icx) or in
//   FMA pairs (skx, whose last n % 4 interior columns pair the taps differently); vertically
//   fma(r0, v0, v1 r1) + fma(r2, v2, v3 r3).
// - l9 (AVX2): interior pixels fma(p1, w1, w2 p2) + fma(p0, w0, w3 p3), then the k0 vertical;
//   every pixel of a border row or column goes through a 2-D routine (below).
// - y8 (SSE4.2): as l9 without FMA, in other pairings.
//
// Built with -ffp-contract=off: every float operation rounds where it is written; fused
// multiply-adds are exactly the std::fma calls.
#include "wheel_cubic.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "../settings.hpp"
#include "avx2.hpp"
#include "cpu.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core::resize_detail {

// ---- which path ---------------------------------------------------------------------------------

const char* to_string(IppPath path) {
  switch (path) {
    case IppPath::kK0Icx:
      return "ipp-k0-icx";
    case IppPath::kK0Skx:
      return "ipp-k0-skx";
    case IppPath::kL9:
      return "ipp-l9";
    case IppPath::kY8:
      return "ipp-y8";
    case IppPath::kOwn:
      return "opencv";
  }
  return "?";
}

// How the wheel gets there (established from its IPP's dispatcher and OpenCV 5.0.0's start-up,
// and checked by replaying CPUs on the wheel itself):
// - OpenCV asks IPP for the CPU's features. IPP reports AVX2 only with BMI1, BMI2 and FMA. With
//   none of AVX-512F, AVX2 and SSE4.2 OpenCV does not use IPP at all.
// - OPENCV_IPP=sse42 / avx2 / avx512 narrow the features OpenCV hands to IPP (its avx512 list has
//   no VPOPCNTDQ); "disabled" keeps OpenCV's own code.
// - IPP drops AVX2 when the OS has not enabled the YMM state and the AVX-512 group when it has
//   not enabled the ZMM state; the AVX-512 library needs F, CD, BW, DQ and VL (not AVX2), the
//   AVX2 one AVX2; anything else (AVX-only CPUs included) runs the SSE4.2 library.
// - In the AVX-512 library the horizontal pass checks VPOPCNTDQ (icx variant) once more.
// - An AVX10.2-512 CPU would select a library the wheel does not contain (it would crash in
//   cv2's IPP start-up); IPP's full release has one whose arithmetic matches the AVX-512
//   library's, so such CPUs get the k0 bytes here.
IppPath ipp_path_for(const CpuFeatures& cpu, const std::string& opencv_ipp_env) {
  std::string env = opencv_ipp_env;
  std::transform(env.begin(), env.end(), env.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (env.rfind("ne", 0) == 0) env = env.size() > 3 ? env.substr(3) : "";
  const bool avx2_raw = cpu.avx2 && cpu.bmi1 && cpu.bmi2 && cpu.fma;
  if (!(cpu.avx512f || avx2_raw || cpu.sse42)) return IppPath::kOwn;
  if (env == "disabled") return IppPath::kOwn;
  bool f = cpu.avx512f, avx2 = avx2_raw, vpopcntdq = cpu.avx512_vpopcntdq;
  if (env == "sse42") f = avx2 = vpopcntdq = false;
  if (env == "avx2") f = vpopcntdq = false;
  if (env == "avx512") vpopcntdq = false;
  const bool avx_os = cpu.osxsave && cpu.avx && (cpu.xcr0 & 0x6) == 0x6;
  const bool avx512_os = cpu.osxsave && (cpu.xcr0 & 0xE0) == 0xE0;
  if (!avx_os) avx2 = false;
  const bool k0 = avx512_os && f && cpu.avx512cd && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl;
  if (k0) return vpopcntdq ? IppPath::kK0Icx : IppPath::kK0Skx;
  return avx2 ? IppPath::kL9 : IppPath::kY8;
}

IppPath wheel_ipp_path() {
  static const IppPath path = ipp_path_for(cpu_features(), read_settings().opencv_ipp);
  return path;
}

// ---- tables
// ---------------------------------------------------------------------------------------

namespace {

// The Keys kernel with B = 0, C = 0.75, in the order IPP evaluates it (double, left to right).
float ipp_kernel(float distance) {
  const double x = distance;
  const double x2 = x * x;
  double k = 0;
  if (x < 1.0) {
    k = 1.25 * x * x2 + -2.25 * x2 + 1.0;
  } else if (x < 2.0) {
    k = -0.75 * x * x2 + 3.75 * x2 - 6.0 * x + 3.0;
  }
  return static_cast<float>(k);
}

struct Axis {
  std::vector<int> ix;   // [dst]: taps ix - 1 .. ix + 2
  std::vector<float> w;  // [dst * 4]
  std::vector<int> tap;  // [dst * 4]: clamped source indices
  int nleft = 0, nright = 0;
};

Axis ipp_axis(int src, int dst) {
  Axis a;
  a.ix.resize(static_cast<std::size_t>(dst));
  a.w.resize(static_cast<std::size_t>(dst) * 4);
  a.tap.resize(static_cast<std::size_t>(dst) * 4);
  const double ratio = static_cast<double>(src) / static_cast<double>(dst);
  for (int d = 0; d < dst; ++d) {
    const double s = (static_cast<double>(d) + 0.5) * ratio - 0.5;
    const double fl = std::floor(s);
    const int ix = static_cast<int>(fl);
    const auto t = static_cast<float>(s - fl);
    float x = -1.0f - t;
    for (int k = 0; k < 4; ++k) {
      a.w[static_cast<std::size_t>(d) * 4 + k] = ipp_kernel(std::fabs(x));
      a.tap[static_cast<std::size_t>(d) * 4 + k] = std::clamp(ix - 1 + k, 0, src - 1);
      x = x + 1.0f;
    }
    a.ix[static_cast<std::size_t>(d)] = ix;
    a.nleft += ix < 1;
    a.nright += ix >= src - 2;
  }
  return a;
}

// ---- the arithmetic of each path
// -------------------------------------------------------------------

// Horizontal tap sums; p: the four samples, w: the four weights.
SAPIENS_SEG_INLINE float seq_fma(const float* p, const float* w) {
  float a = p[0] * w[0];
  a = std::fma(p[1], w[1], a);
  a = std::fma(p[2], w[2], a);
  return std::fma(p[3], w[3], a);
}
SAPIENS_SEG_INLINE float pair01_23_fma(const float* p, const float* w) {
  return std::fma(p[0], w[0], w[1] * p[1]) + std::fma(p[2], w[2], w[3] * p[3]);
}
SAPIENS_SEG_INLINE float pair12_03_fma(const float* p, const float* w) {
  return std::fma(p[1], w[1], w[2] * p[2]) + std::fma(p[0], w[0], w[3] * p[3]);
}
SAPIENS_SEG_INLINE float pair03_12(const float* p, const float* w) {
  return (w[0] * p[0] + w[3] * p[3]) + (w[1] * p[1] + w[2] * p[2]);
}
SAPIENS_SEG_INLINE float pair01_23(const float* p, const float* w) {
  return (w[0] * p[0] + w[1] * p[1]) + (w[2] * p[2] + w[3] * p[3]);
}

// Which of them a run of columns takes.
enum class Sum { kSeqFma, kPair01_23Fma, kPair12_03Fma, kPair03_12 };

template <Sum S>
SAPIENS_SEG_INLINE float tap_sum(const float* p, const float* w) {
  if constexpr (S == Sum::kSeqFma) return seq_fma(p, w);
  if constexpr (S == Sum::kPair01_23Fma) return pair01_23_fma(p, w);
  if constexpr (S == Sum::kPair12_03Fma) return pair12_03_fma(p, w);
  if constexpr (S == Sum::kPair03_12) return pair03_12(p, w);
}

// Round half to even and clamp, as cvtps2dq + packssdw + packuswb. Exact for |v| < 2^22.
SAPIENS_SEG_INLINE std::uint8_t to_u8(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float r = v >= 0 ? (v + kMagic) - kMagic : (v - kMagic) + kMagic;
  const float c = r < 0.f ? 0.f : (r > 255.f ? 255.f : r);
  return static_cast<std::uint8_t>(c);
}

struct Job {
  const std::uint8_t* src;
  std::size_t sstride;
  int h, w, cn;
  std::uint8_t* dst;
  std::size_t dstride;
  int H, W;
  const Axis* ax;
  const Axis* ay;
  int skx_paired_end = 0;  // k0-skx: interior columns from here on pair the taps 1, 2 / 0, 3
  std::vector<int> xoff;   // [W * 4]: the horizontal taps as byte offsets (tap * cn)
  // The vector loop's tables, per output value (pixel and channel), for the interior columns,
  // whose taps are four consecutive pixels.
  std::vector<std::int32_t> voff;  // [W * cn] byte offset of the value's first tap
  std::vector<float> vw;           // [4 * W * cn] weight k of value i at k * W * cn + i
  int simd_end = 0;                // interior columns before it take the vector loop
};

// Columns [x0, x1) of one source row through the horizontal tap sum S.
template <Sum S>
SAPIENS_SEG_INLINE void hcols(const Job& j, const std::uint8_t* src, float* out, int x0, int x1) {
  const int cn = j.cn;
  const int* off = j.xoff.data();
  const float* wt = j.ax->w.data();
  for (int x = x0; x < x1; ++x) {
    const auto xi = static_cast<std::ptrdiff_t>(x);  // table offsets in ptrdiff_t
    const std::uint8_t* s0 = src + off[4 * xi];
    const std::uint8_t* s1 = src + off[4 * xi + 1];
    const std::uint8_t* s2 = src + off[4 * xi + 2];
    const std::uint8_t* s3 = src + off[4 * xi + 3];
    for (int c = 0; c < cn; ++c) {
      const float p[4] = {static_cast<float>(s0[c]), static_cast<float>(s1[c]),
                          static_cast<float>(s2[c]), static_cast<float>(s3[c])};
      out[x * cn + c] = tap_sum<S>(p, wt + 4 * xi);
    }
  }
}

#ifdef SAPIENS_SEG_X86
// The vector twins of the tap sums (an FMA intrinsic rounds once, as std::fma).
template <Sum S>
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE __m256 tap_sum8(const __m256 p[4], const __m256 w[4]) {
  if constexpr (S == Sum::kSeqFma) {
    __m256 a = _mm256_mul_ps(p[0], w[0]);
    a = _mm256_fmadd_ps(p[1], w[1], a);
    a = _mm256_fmadd_ps(p[2], w[2], a);
    return _mm256_fmadd_ps(p[3], w[3], a);
  }
  if constexpr (S == Sum::kPair01_23Fma) {
    return _mm256_add_ps(_mm256_fmadd_ps(p[0], w[0], _mm256_mul_ps(w[1], p[1])),
                         _mm256_fmadd_ps(p[2], w[2], _mm256_mul_ps(w[3], p[3])));
  }
  if constexpr (S == Sum::kPair12_03Fma) {
    return _mm256_add_ps(_mm256_fmadd_ps(p[1], w[1], _mm256_mul_ps(w[2], p[2])),
                         _mm256_fmadd_ps(p[0], w[0], _mm256_mul_ps(w[3], p[3])));
  }
  if constexpr (S == Sum::kPair03_12) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(w[0], p[0]), _mm256_mul_ps(w[3], p[3])),
                         _mm256_add_ps(_mm256_mul_ps(w[1], p[1]), _mm256_mul_ps(w[2], p[2])));
  }
}

// Interior columns [x0, x1) 8 at a time (8 * CN values, CN vectors); returns where it stopped.
template <int CN, Sum S>
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE int hcols_avx2(const Job& j, const std::uint8_t* src,
                                                   float* out, int x0, int x1) {
  const std::size_t n = static_cast<std::size_t>(j.W) * CN;
  const __m256i step2 = _mm256_set1_epi32(2 * CN);
  int x = x0;
  for (; x + 8 <= x1; x += 8) {
    for (int v = 0; v < CN; ++v) {
      const std::size_t i = static_cast<std::size_t>(x) * CN + static_cast<std::size_t>(v) * 8;
      const __m256i o = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(j.voff.data() + i));
      __m256i t[4];
      avx2::tap_ints<CN>(src, o, t[0], t[1]);
      avx2::tap_ints<CN>(src, _mm256_add_epi32(o, step2), t[2], t[3]);
      __m256 p[4], w[4];
      for (int k = 0; k < 4; ++k) {
        p[k] = _mm256_cvtepi32_ps(t[k]);
        w[k] = _mm256_loadu_ps(j.vw.data() + k * n + i);
      }
      _mm256_storeu_ps(out + i, tap_sum8<S>(p, w));
    }
  }
  return x;
}

// (Not inlined: the portable-target functions between band_avx2 and here could not inline it.)
template <Sum S>
SAPIENS_SEG_AVX2 int hcols_avx2_cn(const Job& j, const std::uint8_t* src, float* out, int x0,
                                   int x1) {
  switch (j.cn) {
    case 1:
      return hcols_avx2<1, S>(j, src, out, x0, x1);
    case 2:
      return hcols_avx2<2, S>(j, src, out, x0, x1);
    case 3:
      return hcols_avx2<3, S>(j, src, out, x0, x1);
    default:
      return hcols_avx2<4, S>(j, src, out, x0, x1);
  }
}
#endif  // SAPIENS_SEG_X86

// Interior columns [x0, x1): the vector loop where it may read, then the portable one.
template <Sum S, bool kVec>
SAPIENS_SEG_INLINE void hinterior(const Job& j, const std::uint8_t* src, float* out, int x0,
                                  int x1) {
  int x = x0;
#ifdef SAPIENS_SEG_X86
  if constexpr (kVec) x = hcols_avx2_cn<S>(j, src, out, x0, std::min(x1, j.simd_end));
#endif
  hcols<S>(j, src, out, x, x1);
}

// One source row through the horizontal pass of path P into out[W * cn]. l9 and y8 leave the
// border columns out: their outputs come from the 2-D border routine.
template <IppPath P, bool kVec>
SAPIENS_SEG_INLINE void hrow(const Job& j, const std::uint8_t* src, float* out) {
  const int first = j.ax->nleft, last = std::max(first, j.W - j.ax->nright);
  if constexpr (P == IppPath::kK0Icx || P == IppPath::kK0Skx) {
    hcols<Sum::kSeqFma>(j, src, out, 0, first);
    hcols<Sum::kSeqFma>(j, src, out, last, j.W);
  }
  if constexpr (P == IppPath::kK0Icx) hinterior<Sum::kSeqFma, kVec>(j, src, out, first, last);
  if constexpr (P == IppPath::kK0Skx) {
    hinterior<Sum::kPair01_23Fma, kVec>(j, src, out, first, j.skx_paired_end);
    hinterior<Sum::kPair12_03Fma, kVec>(j, src, out, j.skx_paired_end, last);
  }
  if constexpr (P == IppPath::kL9) hinterior<Sum::kPair12_03Fma, kVec>(j, src, out, first, last);
  if constexpr (P == IppPath::kY8) hinterior<Sum::kPair03_12, kVec>(j, src, out, first, last);
}

// Values [x0, x1) of the vertical pass.
template <IppPath P>
SAPIENS_SEG_INLINE void vrow(const float* const r[4], const float* v, std::uint8_t* out, int x0,
                             int x1) {
  for (int x = x0; x < x1; ++x) {
    float s;
    if constexpr (P == IppPath::kY8) {
      s = (v[0] * r[0][x] + v[1] * r[1][x]) + (v[2] * r[2][x] + v[3] * r[3][x]);
    } else {
      s = std::fma(r[0][x], v[0], v[1] * r[1][x]) + std::fma(r[2][x], v[2], v[3] * r[3][x]);
    }
    out[x] = to_u8(s);
  }
}

#ifdef SAPIENS_SEG_X86
template <IppPath P>
SAPIENS_SEG_AVX2 SAPIENS_SEG_INLINE __m256i vsum8(const float* const r[4], const __m256 v[4],
                                                  int x) {
  __m256 a[4];
  for (int k = 0; k < 4; ++k) a[k] = _mm256_loadu_ps(r[k] + x);
  __m256 s;
  if constexpr (P == IppPath::kY8) {
    s = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(v[0], a[0]), _mm256_mul_ps(v[1], a[1])),
                      _mm256_add_ps(_mm256_mul_ps(v[2], a[2]), _mm256_mul_ps(v[3], a[3])));
  } else {
    s = _mm256_add_ps(_mm256_fmadd_ps(a[0], v[0], _mm256_mul_ps(v[1], a[1])),
                      _mm256_fmadd_ps(a[2], v[2], _mm256_mul_ps(v[3], a[3])));
  }
  return avx2::round_clamp(s);
}

template <IppPath P>
SAPIENS_SEG_AVX2 int vrow_avx2(const float* const r[4], const float* w, std::uint8_t* out, int x0,
                               int x1) {
  const __m256 v[4] = {_mm256_set1_ps(w[0]), _mm256_set1_ps(w[1]), _mm256_set1_ps(w[2]),
                       _mm256_set1_ps(w[3])};
  int x = x0;
  for (; x + 16 <= x1; x += 16) avx2::store16_u8(out + x, vsum8<P>(r, v, x), vsum8<P>(r, v, x + 8));
  return x;
}
#endif  // SAPIENS_SEG_X86

// l9 / y8: a pixel of a border row or column, straight from the source.
template <IppPath P>
SAPIENS_SEG_INLINE void border_pixel(const Job& j, int y, int x, std::uint8_t* out) {
  const int cn = j.cn;
  const auto xi = static_cast<std::ptrdiff_t>(x), yi = static_cast<std::ptrdiff_t>(y);
  const int* t = j.ax->tap.data() + 4 * xi;
  const float* w = j.ax->w.data() + 4 * xi;
  const int* rows = j.ay->tap.data() + 4 * yi;
  const float* vw = j.ay->w.data() + 4 * yi;
  for (int c = 0; c < cn; ++c) {
    float u[4];
    for (int r = 0; r < 4; ++r) {
      const std::uint8_t* S = j.src + static_cast<std::size_t>(rows[r]) * j.sstride;
      const float p[4] = {
          static_cast<float>(S[t[0] * cn + c]), static_cast<float>(S[t[1] * cn + c]),
          static_cast<float>(S[t[2] * cn + c]), static_cast<float>(S[t[3] * cn + c])};
      float a;
      if constexpr (P == IppPath::kL9) {
        a = (r == 0 || r == 3) ? std::fma(p[1], w[1], w[0] * p[0])
                               : std::fma(p[0], w[0], w[1] * p[1]);
        a = std::fma(p[2], w[2], a);
        a = std::fma(p[3], w[3], a);
      } else {
        a = pair01_23(p, w);
      }
      u[r] = vw[r] * a;
    }
    out[c] = to_u8((u[0] + u[2]) + (u[1] + u[3]));
  }
}

// Output rows [y0, y1) of path P, with a cache of four horizontally filtered source rows.
template <IppPath P, bool kVec>
SAPIENS_SEG_INLINE void band(const Job& j, int64_t y0, int64_t y1) {
  const int n = j.W * j.cn;
  std::vector<float> store(static_cast<std::size_t>(n) * 4);
  float* slot[4];
  int slot_row[4];
  for (int k = 0; k < 4; ++k)
    slot[k] = store.data() + static_cast<std::size_t>(n) * k, slot_row[k] = -1;
  constexpr bool kBorder2d = P == IppPath::kL9 || P == IppPath::kY8;
  const Axis& ay = *j.ay;
  const Axis& ax = *j.ax;
  // The values the vertical pass computes (l9 / y8: the interior columns').
  const int v0 = kBorder2d ? ax.nleft * j.cn : 0;
  const int v1 = kBorder2d ? std::max(v0, (j.W - ax.nright) * j.cn) : n;
  for (int64_t dy = y0; dy < y1; ++dy) {
    const int* rows = ay.tap.data() + 4 * dy;
    std::uint8_t* out = j.dst + static_cast<std::size_t>(dy) * j.dstride;
    const bool border_row = dy < ay.nleft || dy >= j.H - ay.nright;
    if (kBorder2d && border_row) {
      for (int x = 0; x < j.W; ++x)
        border_pixel<P>(j, static_cast<int>(dy), x, out + static_cast<std::ptrdiff_t>(x) * j.cn);
      continue;
    }
    const float* r[4];
    for (int k = 0; k < 4; ++k) {
      int found = -1;
      for (int s = 0; s < 4; ++s) {
        if (slot_row[s] == rows[k]) found = s;
      }
      if (found < 0) {
        for (int s = 0; s < 4 && found < 0; ++s) {
          bool used = false;
          for (int q = 0; q < 4; ++q) used = used || slot_row[s] == rows[q];
          if (!used) found = s;
        }
        hrow<P, kVec>(j, j.src + static_cast<std::size_t>(rows[k]) * j.sstride, slot[found]);
        slot_row[found] = rows[k];
      }
      r[k] = slot[found];
    }
    int x = v0;
#ifdef SAPIENS_SEG_X86
    if constexpr (kVec) x = vrow_avx2<P>(r, ay.w.data() + 4 * dy, out, v0, v1);
#endif
    vrow<P>(r, ay.w.data() + 4 * dy, out, x, v1);
    if constexpr (kBorder2d) {
      for (int x = 0; x < ax.nleft; ++x)
        border_pixel<P>(j, static_cast<int>(dy), x, out + static_cast<std::ptrdiff_t>(x) * j.cn);
      for (int x = std::max(ax.nleft, j.W - ax.nright); x < j.W; ++x) {
        border_pixel<P>(j, static_cast<int>(dy), x, out + static_cast<std::ptrdiff_t>(x) * j.cn);
      }
    }
  }
}

template <bool kVec>
SAPIENS_SEG_INLINE void band_path(IppPath p, const Job& j, int64_t y0, int64_t y1) {
  switch (p) {
    case IppPath::kK0Icx:
      return band<IppPath::kK0Icx, kVec>(j, y0, y1);
    case IppPath::kK0Skx:
      return band<IppPath::kK0Skx, kVec>(j, y0, y1);
    case IppPath::kL9:
      return band<IppPath::kL9, kVec>(j, y0, y1);
    default:
      return band<IppPath::kY8, kVec>(j, y0, y1);
  }
}

// The portable loops (std::fma is a library call unless the baseline has FMA).
void band_portable(IppPath p, const Job& j, int64_t y0, int64_t y1) {
  band_path<false>(p, j, y0, y1);
}

// The vector loops, and the scalar ones around them compiled for the same CPU (std::fma becomes
// one instruction; y8 has no fused operation, and -ffp-contract=off makes none).
SAPIENS_SEG_AVX2 void band_avx2(IppPath p, const Job& j, int64_t y0, int64_t y1) {
  band_path<true>(p, j, y0, y1);
}

// k0-skx: the first interior column whose taps pair 1, 2 / 0, 3 (the last n % 4 of them).
int skx_paired_end(const Axis& ax, int W) {
  const int first = ax.nleft, last = std::max(first, W - ax.nright);
  return first + (last - first) / 4 * 4;
}

// Per column 0 border, 1 paired interior, 2 interior tail: the tensor code's selector.
std::vector<std::uint8_t> skx_column_kinds(const Axis& ax, int W) {
  std::vector<std::uint8_t> kind(static_cast<std::size_t>(W), 0);
  const int first = ax.nleft, last = W - ax.nright, paired = skx_paired_end(ax, W);
  for (int x = first; x < last; ++x) kind[static_cast<std::size_t>(x)] = x < paired ? 1 : 2;
  return kind;
}

}  // namespace

void wheel_cubic_host(const std::uint8_t* src, std::size_t sstride, int h, int w, int cn,
                      std::uint8_t* dst, std::size_t dstride, int H, int W, IppPath path,
                      Simd simd) {
  if (path == IppPath::kOwn || w < 4 || h < 4) {
    throw Error(ErrorCode::kInternal, "wheel_cubic_host: OpenCV's own path is resize_u8's");
  }
  const Axis ax = ipp_axis(w, W), ay = ipp_axis(h, H);
  Job j{src, sstride, h, w, cn, dst, dstride, H, W, &ax, &ay, 0, {}, {}, {}, 0};
  j.skx_paired_end = skx_paired_end(ax, W);
  j.xoff.resize(ax.tap.size());
  for (std::size_t i = 0; i < ax.tap.size(); ++i) j.xoff[i] = ax.tap[i] * cn;
  const bool vec = simd == Simd::kAvx2;
  if (vec) {
    const std::size_t n = static_cast<std::size_t>(W) * cn;
    j.voff.resize(n);
    j.vw.resize(4 * n);
    for (int x = 0; x < W; ++x) {
      for (int c = 0; c < cn; ++c) {
        const std::size_t i = static_cast<std::size_t>(x) * cn + c;
        j.voff[i] = j.xoff[4 * static_cast<std::size_t>(x)] + c;
        for (int k = 0; k < 4; ++k) j.vw[k * n + i] = ax.w[4 * static_cast<std::size_t>(x) + k];
      }
    }
    // The loads of a value's taps reach pair_reach(cn, 2) bytes from its first tap.
    j.simd_end = ax.nleft;
    const int reach = resize_detail::avx2::pair_reach(cn, 2), row_bytes = w * cn;
    while (j.simd_end < W - ax.nright &&
           j.voff[static_cast<std::size_t>(j.simd_end) * cn + cn - 1] + reach <= row_bytes) {
      ++j.simd_end;
    }
  }
  at::parallel_for(0, H, 16, [&](int64_t y0, int64_t y1) {
#ifdef SAPIENS_SEG_X86
    if (vec) return band_avx2(path, j, y0, y1);
#endif
    band_portable(path, j, y0, y1);
  });
}

// ---- tensor ops
// -------------------------------------------------------------------------------------

namespace {

// float32 a * b + c rounded once, on any device: the product is exact in float64, the sum is
// rounded to float64 with its error known exactly (TwoSum), and rounding to odd before the
// conversion to float32 makes the double rounding a single correct one.
at::Tensor fma_exact(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
  const at::Tensor p = a.to(at::kDouble) * b.to(at::kDouble);
  const at::Tensor cd = c.to(at::kDouble);
  const at::Tensor s = p + cd;
  const at::Tensor bb = s - p;
  const at::Tensor err = (p - (s - bb)) + (cd - bb);
  const at::Tensor even = at::bitwise_and(s.view(at::kLong), 1).eq(0);
  const at::Tensor toward = at::where(err.gt(0), at::full({}, INFINITY, s.options()),
                                      at::full({}, -INFINITY, s.options()));
  const at::Tensor odd = at::where(err.ne(0).logical_and(even), at::nextafter(s, toward), s);
  return odd.to(at::kFloat);
}

at::Tensor to_u8_tensor(const at::Tensor& v) {
  return at::round(v).clamp_(0, 255).to(at::kByte);
}

struct AxisTensors {
  std::vector<at::Tensor> tap;  // 4 x int64 [dst]
  std::vector<at::Tensor> w;    // 4 x float [dst]
};

AxisTensors axis_tensors(const Axis& a, const c10::Device& dev) {
  const auto n = static_cast<int64_t>(a.ix.size());
  at::Tensor tap = at::empty({4, n}, at::kLong), w = at::empty({4, n}, at::kFloat);
  auto ta = tap.accessor<int64_t, 2>();
  auto wa = w.accessor<float, 2>();
  for (int64_t d = 0; d < n; ++d) {
    for (int64_t k = 0; k < 4; ++k) {
      ta[k][d] = a.tap[static_cast<std::size_t>(d * 4 + k)];
      wa[k][d] = a.w[static_cast<std::size_t>(d * 4 + k)];
    }
  }
  tap = tap.to(dev);
  w = w.to(dev);
  AxisTensors t;
  for (int64_t k = 0; k < 4; ++k) {
    t.tap.push_back(tap[k]);
    t.w.push_back(w[k]);
  }
  return t;
}

// Horizontal combinations on [.., W, C] samples p[k] with weights w[k] ([W] viewed [1, W, 1]).
using Quad = std::vector<at::Tensor>;
at::Tensor t_seq_fma(const Quad& p, const Quad& w) {
  at::Tensor a = p[0] * w[0];
  for (int k = 1; k < 4; ++k)
    a = fma_exact(p[static_cast<std::size_t>(k)], w[static_cast<std::size_t>(k)], a);
  return a;
}
at::Tensor t_pair01_23_fma(const Quad& p, const Quad& w) {
  return fma_exact(p[0], w[0], w[1] * p[1]) + fma_exact(p[2], w[2], w[3] * p[3]);
}
at::Tensor t_pair12_03_fma(const Quad& p, const Quad& w) {
  return fma_exact(p[1], w[1], w[2] * p[2]) + fma_exact(p[0], w[0], w[3] * p[3]);
}
at::Tensor t_pair03_12(const Quad& p, const Quad& w) {
  return (w[0] * p[0] + w[3] * p[3]) + (w[1] * p[1] + w[2] * p[2]);
}
at::Tensor t_pair01_23(const Quad& p, const Quad& w) {
  return (w[0] * p[0] + w[1] * p[1]) + (w[2] * p[2] + w[3] * p[3]);
}

// The 2-D border routine of l9 / y8 for output rows `ys` and output columns `xs` (index tensors):
// a [ys, xs, C] block.
at::Tensor t_border_block(const at::Tensor& img, const AxisTensors& x, const AxisTensors& y,
                          const at::Tensor& ys, const at::Tensor& xs, IppPath path) {
  Quad w, pcols;
  for (std::size_t k = 0; k < 4; ++k) w.push_back(x.w[k].index_select(0, xs).view({1, -1, 1}));
  std::vector<at::Tensor> u;
  for (std::size_t r = 0; r < 4; ++r) {
    const at::Tensor rows = img.index_select(0, y.tap[r].index_select(0, ys));  // [ny, w, C]
    Quad p;
    for (std::size_t k = 0; k < 4; ++k) {
      p.push_back(rows.index_select(1, x.tap[k].index_select(0, xs)).to(at::kFloat));
    }
    at::Tensor a;
    if (path == IppPath::kL9) {
      a = (r == 0 || r == 3) ? fma_exact(p[1], w[1], w[0] * p[0])
                             : fma_exact(p[0], w[0], w[1] * p[1]);
      a = fma_exact(p[2], w[2], a);
      a = fma_exact(p[3], w[3], a);
    } else {
      a = t_pair01_23(p, w);
    }
    u.push_back(y.w[r].index_select(0, ys).view({-1, 1, 1}) * a);
  }
  return to_u8_tensor((u[0] + u[2]) + (u[1] + u[3]));
}

}  // namespace

at::Tensor wheel_cubic_tensor(const at::Tensor& img, int64_t H, int64_t W, IppPath path) {
  const int h = static_cast<int>(img.size(0)), w = static_cast<int>(img.size(1));
  if (path == IppPath::kOwn || w < 4 || h < 4) {
    throw Error(ErrorCode::kInternal, "wheel_cubic_tensor: OpenCV's own path is resize_tensor's");
  }
  const auto dev = img.device();
  const Axis ax = ipp_axis(w, static_cast<int>(W)), ay = ipp_axis(h, static_cast<int>(H));
  const AxisTensors x = axis_tensors(ax, dev), y = axis_tensors(ay, dev);
  // Horizontal pass over every source row: [h, W, C] float32.
  Quad p, wx;
  for (std::size_t k = 0; k < 4; ++k) {
    p.push_back(img.index_select(1, x.tap[k]).to(at::kFloat));
    wx.push_back(x.w[k].view({1, W, 1}));
  }
  at::Tensor rows;
  switch (path) {
    case IppPath::kK0Icx:
      rows = t_seq_fma(p, wx);
      break;
    case IppPath::kK0Skx: {
      const auto kinds = skx_column_kinds(ax, static_cast<int>(W));
      const at::Tensor kind =
          at::tensor(std::vector<int64_t>(kinds.begin(), kinds.end()), at::kLong)
              .to(dev)
              .view({1, W, 1});
      rows = at::where(kind.eq(0), t_seq_fma(p, wx),
                       at::where(kind.eq(1), t_pair01_23_fma(p, wx), t_pair12_03_fma(p, wx)));
      break;
    }
    case IppPath::kL9:
      rows = t_pair12_03_fma(p, wx);
      break;
    default:
      rows = t_pair03_12(p, wx);
      break;
  }
  // Vertical pass.
  Quad r, wy;
  for (std::size_t k = 0; k < 4; ++k) {
    r.push_back(rows.index_select(0, y.tap[k]));
    wy.push_back(y.w[k].view({H, 1, 1}));
  }
  at::Tensor out = to_u8_tensor(path == IppPath::kY8
                                    ? (wy[0] * r[0] + wy[1] * r[1]) + (wy[2] * r[2] + wy[3] * r[3])
                                    : fma_exact(r[0], wy[0], wy[1] * r[1]) +
                                          fma_exact(r[2], wy[2], wy[3] * r[3]));
  if (path == IppPath::kL9 || path == IppPath::kY8) {
    const auto opt = at::TensorOptions().dtype(at::kLong).device(dev);
    const at::Tensor all_x = at::arange(W, opt), all_y = at::arange(H, opt);
    const at::Tensor border_y =
        at::cat({at::arange(ay.nleft, opt), at::arange(H - ay.nright, H, opt)});
    const at::Tensor border_x =
        at::cat({at::arange(ax.nleft, opt), at::arange(W - ax.nright, W, opt)});
    if (border_y.numel() > 0) {
      out.index_copy_(0, border_y, t_border_block(img, x, y, border_y, all_x, path));
    }
    if (border_x.numel() > 0) {
      out.index_copy_(1, border_x, t_border_block(img, x, y, all_y, border_x, path));
    }
  }
  return out;
}

}  // namespace sapiens_seg::core::resize_detail
