// resize_u8 on the host: OpenCV's resize structure (a horizontal pass per source row into a small
// cache of rows, then a vertical pass per output row), with its arithmetic operation for
// operation. Output rows are spread over LibTorch's intra-op threads; each thread keeps its own
// row cache, so the result does not depend on how rows are split.
//
// Built with -ffp-contract=off (CMakeLists.txt): OpenCV's x86-64 build has no FMA in these
// loops, and a contracted multiply-add rounds differently.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <ATen/Parallel.h>

#include "resize.hpp"
#include "sapiens_seg/error.hpp"
#include "taps.hpp"
#include "wheel_cubic.hpp"

namespace sapiens_seg::core {

using resize_detail::AreaEntry;
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

// Output rows per task: enough to amortise the rows a task must compute twice at its top edge.
constexpr int64_t kRowGrain = 16;

struct Geometry {
  const std::uint8_t* src;
  std::size_t sstride;
  int h, w, cn;
  std::uint8_t* dst;
  std::size_t dstride;
  int H, W;
};

// Round to nearest, ties to even, for |v| < 2^22, in plain float arithmetic (vectorisable
// without SSE4.1's roundps; what cvRound and _mm_cvtps_epi32 give in the default mode).
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return v >= 0 ? (v + kMagic) - kMagic : (v - kMagic) + kMagic;
}

inline std::uint8_t clamp_u8(int v) {
  return static_cast<std::uint8_t>(std::clamp(v, 0, 255));
}

// ---- separable fixed-point filters (INTER_LINEAR, INTER_AREA enlarging, OpenCV's cubic) ------

// The horizontal table as byte offsets into a row and weights, tap by tap (structure of
// arrays: the inner loop loads one offset and one weight per tap and pixel).
template <int K>
struct RowTable {
  std::vector<std::int32_t> off[K];
  std::vector<std::int32_t> wt[K];
  RowTable(const Taps& t, int W, int cn) {
    for (int k = 0; k < K; ++k) {
      off[k].resize(static_cast<std::size_t>(W));
      wt[k].resize(static_cast<std::size_t>(W));
      for (int d = 0; d < W; ++d) {
        off[k][static_cast<std::size_t>(d)] = t.index[static_cast<std::size_t>(d * K + k)] * cn;
        wt[k][static_cast<std::size_t>(d)] = t.fixed[static_cast<std::size_t>(d * K + k)];
      }
    }
  }
};

template <int CN, int K>
void hpass_fixed(const std::uint8_t* S, const RowTable<K>& t, int W, std::int32_t* D) {
  for (int dx = 0; dx < W; ++dx) {
    std::int32_t v[CN] = {};
    for (int k = 0; k < K; ++k) {
      const std::uint8_t* p = S + t.off[k][static_cast<std::size_t>(dx)];
      const std::int32_t w = t.wt[k][static_cast<std::size_t>(dx)];
      for (int c = 0; c < CN; ++c) v[c] += p[c] * w;
    }
    for (int c = 0; c < CN; ++c) D[dx * CN + c] = v[c];
  }
}

// INTER_LINEAR's vertical pass (VResizeLinearVec_32s8u and its scalar twin agree): each row term
// loses 4 bits and keeps the high half of its 16 x 16-bit product with the weight.
void vpass_linear(const std::int32_t* r0, const std::int32_t* r1, std::int16_t b0, std::int16_t b1,
                  std::uint8_t* out, int n) {
  for (int x = 0; x < n; ++x) {
    const auto a0 = static_cast<std::int16_t>(r0[x] >> 4);
    const auto a1 = static_cast<std::int16_t>(r1[x] >> 4);
    const auto h0 = static_cast<std::int16_t>((static_cast<std::int32_t>(a0) * b0) >> 16);
    const auto h1 = static_cast<std::int16_t>((static_cast<std::int32_t>(a1) * b1) >> 16);
    const int v = (h0 + h1 + 2) >> 2;
    out[x] = static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
  }
}

// OpenCV's cubic vertical pass: 8 values at a time in float32 (VResizeCubicVec_32s8u: the
// weights scaled by 2^-22, accumulated from the last row to the first, rounded to even), the
// remainder of the row in integer arithmetic (FixedPtCast, rounding half up).
void vpass_cubic(const std::int32_t* const r[4], const std::int16_t* b, std::uint8_t* out, int n) {
  const float scale = 1.f / (resize_detail::kCoefScale * resize_detail::kCoefScale);
  const float f0 = b[0] * scale, f1 = b[1] * scale, f2 = b[2] * scale, f3 = b[3] * scale;
  const int vec_end = n / 8 * 8;
  for (int x = 0; x < vec_end; ++x) {
    float t = static_cast<float>(r[3][x]) * f3;
    t = static_cast<float>(r[2][x]) * f2 + t;
    t = static_cast<float>(r[1][x]) * f1 + t;
    t = static_cast<float>(r[0][x]) * f0 + t;
    out[x] = clamp_u8(static_cast<int>(round_even(t)));
  }
  for (int x = vec_end; x < n; ++x) {
    const std::int32_t v =
        r[0][x] * b[0] + r[1][x] * b[1] + r[2][x] * b[2] + r[3][x] * b[3] + (1 << 21);
    out[x] = clamp_u8(v >> 22);
  }
}

template <int CN, int K>
void run_fixed(const Geometry& g, const Taps& tx, const Taps& ty) {
  const int n = g.W * CN;
  const RowTable<K> table(tx, g.W, CN);
  at::parallel_for(0, g.H, kRowGrain, [&](int64_t y0, int64_t y1) {
    // Horizontally filtered source rows, K of them cached by source row index.
    std::vector<std::int32_t> store(static_cast<std::size_t>(n) * K);
    std::int32_t* slot[K];
    int slot_row[K];
    for (int k = 0; k < K; ++k)
      slot[k] = store.data() + static_cast<std::size_t>(n) * k, slot_row[k] = -1;
    const std::int32_t* rows[K];
    for (int64_t dy = y0; dy < y1; ++dy) {
      for (int k = 0; k < K; ++k) {
        const int sy = ty.index[static_cast<std::size_t>(dy) * K + static_cast<std::size_t>(k)];
        int found = -1;
        for (int j = 0; j < K; ++j) {
          if (slot_row[j] == sy) found = j;
        }
        if (found < 0) {
          // Evict a slot no tap of this output row uses.
          for (int j = 0; j < K && found < 0; ++j) {
            bool used = false;
            for (int q = 0; q < K; ++q) {
              used = used ||
                     slot_row[j] ==
                         ty.index[static_cast<std::size_t>(dy) * K + static_cast<std::size_t>(q)];
            }
            if (!used) found = j;
          }
          hpass_fixed<CN, K>(g.src + static_cast<std::size_t>(sy) * g.sstride, table, g.W,
                             slot[found]);
          slot_row[found] = sy;
        }
        rows[k] = slot[found];
      }
      std::uint8_t* out = g.dst + static_cast<std::size_t>(dy) * g.dstride;
      const std::int16_t* b = ty.fixed.data() + static_cast<std::size_t>(dy) * K;
      if constexpr (K == 2) {
        vpass_linear(rows[0], rows[1], b[0], b[1], out, n);
      } else {
        vpass_cubic(rows, b, out, n);
      }
    }
  });
}

// ---- INTER_AREA, integer factor -----------------------------------------------------------

void run_area_integer(const Geometry& g, int fx, int fy) {
  const int cn = g.cn;
  const bool fast2 = fx == 2 && fy == 2 && (cn == 1 || cn == 3 || cn == 4);
  const float inv_area = 1.f / static_cast<float>(fx * fy);
  const int row_len = g.W * fx * cn;  // the source bytes the output row covers
  at::parallel_for(0, g.H, kRowGrain, [&](int64_t y0, int64_t y1) {
    // Integer sums are exact in any order: add the block's rows first (contiguous, vectorised),
    // then the columns of each block.
    std::vector<std::uint32_t> col(static_cast<std::size_t>(row_len));
    for (int64_t dy = y0; dy < y1; ++dy) {
      std::uint8_t* out = g.dst + static_cast<std::size_t>(dy) * g.dstride;
      const std::uint8_t* top = g.src + static_cast<std::size_t>(dy) * fy * g.sstride;
      for (int i = 0; i < row_len; ++i) col[static_cast<std::size_t>(i)] = top[i];
      for (int sy = 1; sy < fy; ++sy) {
        const std::uint8_t* row = top + static_cast<std::size_t>(sy) * g.sstride;
        for (int i = 0; i < row_len; ++i) col[static_cast<std::size_t>(i)] += row[i];
      }
      const std::uint32_t* c0 = col.data();
      if (fast2) {  // (a + b + c + d + 2) >> 2, as OpenCV's 2x2 vector code
        for (int dx = 0; dx < g.W; ++dx, c0 += 2 * cn) {
          for (int c = 0; c < cn; ++c) {
            out[dx * cn + c] = static_cast<std::uint8_t>((c0[c] + c0[c + cn] + 2) >> 2);
          }
        }
        continue;
      }
      for (int dx = 0; dx < g.W; ++dx, c0 += fx * cn) {
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

void run_area_general(const Geometry& g) {
  const std::vector<AreaEntry> xtab = resize_detail::area_table(g.w, g.W);
  const std::vector<AreaEntry> ytab = resize_detail::area_table(g.h, g.H);
  // First ytab entry of each output row.
  std::vector<std::size_t> first(static_cast<std::size_t>(g.H) + 1, ytab.size());
  for (std::size_t j = ytab.size(); j-- > 0;) first[static_cast<std::size_t>(ytab[j].dst)] = j;
  const int cn = g.cn, n = g.W * cn;
  at::parallel_for(0, g.H, kRowGrain, [&](int64_t y0, int64_t y1) {
    std::vector<float> buf(static_cast<std::size_t>(n)), sum(static_cast<std::size_t>(n));
    for (int64_t dy = y0; dy < y1; ++dy) {
      const std::size_t j0 = first[static_cast<std::size_t>(dy)];
      for (std::size_t j = j0; j < ytab.size() && ytab[j].dst == dy; ++j) {
        const std::uint8_t* S = g.src + static_cast<std::size_t>(ytab[j].src) * g.sstride;
        std::fill(buf.begin(), buf.end(), 0.f);
        for (const AreaEntry& e : xtab) {
          float* b = buf.data() + static_cast<std::ptrdiff_t>(e.dst) * cn;
          const std::uint8_t* s = S + static_cast<std::ptrdiff_t>(e.src) * cn;
          for (int c = 0; c < cn; ++c) b[c] += static_cast<float>(s[c]) * e.weight;
        }
        const float beta = ytab[j].weight;
        if (j == j0) {
          for (int x = 0; x < n; ++x)
            sum[static_cast<std::size_t>(x)] = beta * buf[static_cast<std::size_t>(x)];
        } else {
          for (int x = 0; x < n; ++x)
            sum[static_cast<std::size_t>(x)] += beta * buf[static_cast<std::size_t>(x)];
        }
      }
      std::uint8_t* out = g.dst + static_cast<std::size_t>(dy) * g.dstride;
      for (int x = 0; x < n; ++x)
        out[x] = clamp_u8(static_cast<int>(round_even(sum[static_cast<std::size_t>(x)])));
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

}  // namespace

void resize_u8(const PixelsU8& src, const MutablePixelsU8& dst, Interp interp, CubicFlavor flavor) {
  if (!src.data || !dst.data || src.height < 1 || src.width < 1 || dst.height < 1 ||
      dst.width < 1 || src.channels < 1 || src.channels > 4 || dst.channels != src.channels) {
    throw Error(ErrorCode::kInternal, "resize_u8: invalid image geometry");
  }
  const int cn = src.channels;
  Geometry g{src.data,
             src.stride ? src.stride : static_cast<std::size_t>(src.width) * cn,
             src.height,
             src.width,
             cn,
             dst.data,
             dst.stride ? dst.stride : static_cast<std::size_t>(dst.width) * cn,
             dst.height,
             dst.width};
  if (g.h == g.H && g.w == g.W) {  // OpenCV copies
    for (int y = 0; y < g.h; ++y) {
      std::memcpy(g.dst + y * g.dstride, g.src + y * g.sstride, static_cast<std::size_t>(g.w) * cn);
    }
    return;
  }
  const int fx = resize_detail::integer_factor(g.w, g.W);
  const int fy = resize_detail::integer_factor(g.h, g.H);
  if (interp == Interp::kLinear && fx == 2 && fy == 2) interp = Interp::kArea;
  switch (interp) {
    case Interp::kLinear:
      return run_fixed_cn<2>(g, resize_detail::linear_taps(g.w, g.W, true),
                             resize_detail::linear_taps(g.h, g.H, false));
    case Interp::kArea:
      if (resize_detail::scale_of(g.w, g.W) >= 1 && resize_detail::scale_of(g.h, g.H) >= 1) {
        if (fx > 0 && fy > 0) return run_area_integer(g, fx, fy);
        return run_area_general(g);
      }
      return run_fixed_cn<2>(g, resize_detail::area_mode_taps(g.w, g.W, true),
                             resize_detail::area_mode_taps(g.h, g.H, false));
    case Interp::kCubic:
      if (flavor == CubicFlavor::kWheel) {
        // The wheel hands sources under 4 pixels on a side to OpenCV's own code (IPP refuses
        // them), and runs OpenCV's own code everywhere on CPUs IPP is not used on.
        const resize_detail::IppPath path = resize_detail::wheel_ipp_path();
        if (path != resize_detail::IppPath::kOwn && g.w >= 4 && g.h >= 4) {
          return resize_detail::wheel_cubic_host(g.src, g.sstride, g.h, g.w, cn, g.dst, g.dstride,
                                                 g.H, g.W, path);
        }
      }
      return run_fixed_cn<4>(g, resize_detail::cubic_taps(g.w, g.W),
                             resize_detail::cubic_taps(g.h, g.H));
  }
}

}  // namespace sapiens_seg::core
