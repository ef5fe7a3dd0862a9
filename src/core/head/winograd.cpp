#include "winograd.hpp"

#include <algorithm>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "../cpu/cpuid.hpp"
#include "../cpu/vec.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core::head {
namespace {

// Output parity -> the kernel taps its two input rows (a = 0, 1) take: with the input at offset 1
// in the padded grid, output row 2i + py reads padded rows i + py + a (cpu_head.cpp's tap_of,
// re-indexed from the tile's first row).
constexpr int kTap[2][2] = {{3, 1}, {2, 0}};

// Tiles a band holds: V and M are 9 x tiles x channels float32 each (10.6 MB at 768 channels), so
// a band's transforms and GEMMs stay in the last-level cache. On Zen 3 (head_bench, 2 cores)
// bands of 192 to 3072 tiles and one batched GEMM (bmm) instead of nine all ran within the
// machine's noise of this.
constexpr int64_t kBandTiles = 384;

struct Band {
  const float* padded;                           // [(H + 3) * Wp, Cin]
  float* v;                                      // [9, tiles, Cin]
  const float* m;                                // [9, tiles, Cout]
  float* y;                                      // [2H * 2W, Cout]
  int64_t H, W, Wp, tw, Cin, Cout, tiles, row0;  // row0: the band's first tile row
  int py, px;
};

// V = B' d B of tile t for input channels [c0, Cin).
void input_tile_channels(const Band& b, int64_t t, int64_t c0) {
  const int64_t Cin = b.Cin, plane = b.tiles * Cin;
  const int64_t ti = b.row0 + t / b.tw, tj = t % b.tw;
  const float* d0 = b.padded + ((2 * ti + b.py) * b.Wp + 2 * tj + b.px) * Cin;
  const float* d1 = d0 + b.Wp * Cin;
  const float* d2 = d1 + b.Wp * Cin;
  float* v = b.v + t * Cin;
  for (int64_t c = c0; c < Cin; ++c) {
    // Rows first (B' d), then columns ((B' d) B).
    const float r00 = d0[c] - d1[c], r01 = d0[Cin + c] - d1[Cin + c],
                r02 = d0[2 * Cin + c] - d1[2 * Cin + c];
    const float r10 = d1[c], r11 = d1[Cin + c], r12 = d1[2 * Cin + c];
    const float r20 = d2[c] - d1[c], r21 = d2[Cin + c] - d1[Cin + c],
                r22 = d2[2 * Cin + c] - d1[2 * Cin + c];
    v[c] = r00 - r01;
    v[plane + c] = r01;
    v[2 * plane + c] = r02 - r01;
    v[3 * plane + c] = r10 - r11;
    v[4 * plane + c] = r11;
    v[5 * plane + c] = r12 - r11;
    v[6 * plane + c] = r20 - r21;
    v[7 * plane + c] = r21;
    v[8 * plane + c] = r22 - r21;
  }
}

// Y = A' M A of tiles [t0, t1), written to the output pixels (2(2ti + di) + py, 2(2tj + dj) + px)
// that lie inside the map.
void output_tiles_base(const Band& b, int64_t t0, int64_t t1) {
  const int64_t Cout = b.Cout, plane = b.tiles * Cout, W2 = 2 * b.W;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t ti = b.row0 + t / b.tw, tj = t % b.tw;
    const int64_t oi = 2 * ti, oj = 2 * tj;
    const bool down = oi + 1 < b.H, right = oj + 1 < b.W;
    float* y00 = b.y + ((2 * oi + b.py) * W2 + 2 * oj + b.px) * Cout;
    // Pixels past the map's edge are never written (nor pointed at).
    float* y01 = right ? y00 + 2 * Cout : y00;
    float* y10 = down ? y00 + 2 * W2 * Cout : y00;
    float* y11 = down && right ? y10 + 2 * Cout : y00;
    const float* m = b.m + t * Cout;
    // The guards are the same for the whole tile (false only on an odd-sized map's last row or
    // column), so the branch predictor takes them for free.
    for (int64_t c = 0; c < Cout; ++c) {
      const float s00 = m[c] + m[3 * plane + c], s01 = m[plane + c] + m[4 * plane + c],
                  s02 = m[2 * plane + c] + m[5 * plane + c];
      const float s10 = m[3 * plane + c] + m[6 * plane + c],
                  s11 = m[4 * plane + c] + m[7 * plane + c],
                  s12 = m[5 * plane + c] + m[8 * plane + c];
      y00[c] = s00 + s01;
      if (right) y01[c] = s01 + s02;
      if (down) y10[c] = s10 + s11;
      if (down && right) y11[c] = s11 + s12;
    }
  }
}

void input_tiles_base(const Band& b, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) input_tile_channels(b, t, 0);
}
#ifdef SAPIENS_SEG_X86
// The same two loops, 8 channels at a time (the compiler does not vectorise the scalar ones: 9
// output streams are more runtime alias checks than it will version a loop for). Additions and
// subtractions in the same order, so the results are the scalar loops' to the bit.
SAPIENS_SEG_VEC256 void input_tiles_avx2(const Band& b, int64_t t0, int64_t t1) {
  const int64_t Cin = b.Cin, plane = b.tiles * Cin, C8 = Cin / 8 * 8;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t ti = b.row0 + t / b.tw, tj = t % b.tw;
    const float* d0 = b.padded + ((2 * ti + b.py) * b.Wp + 2 * tj + b.px) * Cin;
    const float* d1 = d0 + b.Wp * Cin;
    const float* d2 = d1 + b.Wp * Cin;
    float* v = b.v + t * Cin;
    for (int64_t c = 0; c < C8; c += 8) {
      const __m256 a0 = _mm256_loadu_ps(d0 + c), a1 = _mm256_loadu_ps(d0 + Cin + c),
                   a2 = _mm256_loadu_ps(d0 + 2 * Cin + c);
      const __m256 r10 = _mm256_loadu_ps(d1 + c), r11 = _mm256_loadu_ps(d1 + Cin + c),
                   r12 = _mm256_loadu_ps(d1 + 2 * Cin + c);
      const __m256 c0 = _mm256_loadu_ps(d2 + c), c1 = _mm256_loadu_ps(d2 + Cin + c),
                   c2 = _mm256_loadu_ps(d2 + 2 * Cin + c);
      const __m256 r00 = _mm256_sub_ps(a0, r10), r01 = _mm256_sub_ps(a1, r11),
                   r02 = _mm256_sub_ps(a2, r12);
      const __m256 r20 = _mm256_sub_ps(c0, r10), r21 = _mm256_sub_ps(c1, r11),
                   r22 = _mm256_sub_ps(c2, r12);
      _mm256_storeu_ps(v + c, _mm256_sub_ps(r00, r01));
      _mm256_storeu_ps(v + plane + c, r01);
      _mm256_storeu_ps(v + 2 * plane + c, _mm256_sub_ps(r02, r01));
      _mm256_storeu_ps(v + 3 * plane + c, _mm256_sub_ps(r10, r11));
      _mm256_storeu_ps(v + 4 * plane + c, r11);
      _mm256_storeu_ps(v + 5 * plane + c, _mm256_sub_ps(r12, r11));
      _mm256_storeu_ps(v + 6 * plane + c, _mm256_sub_ps(r20, r21));
      _mm256_storeu_ps(v + 7 * plane + c, r21);
      _mm256_storeu_ps(v + 8 * plane + c, _mm256_sub_ps(r22, r21));
    }
    if (C8 < Cin) input_tile_channels(b, t, C8);  // channels past the last multiple of 8
  }
}

SAPIENS_SEG_VEC256 void output_tiles_avx2(const Band& b, int64_t t0, int64_t t1) {
  const int64_t Cout = b.Cout, plane = b.tiles * Cout, W2 = 2 * b.W, C8 = Cout / 8 * 8;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t ti = b.row0 + t / b.tw, tj = t % b.tw;
    const int64_t oi = 2 * ti, oj = 2 * tj;
    if (oi + 1 >= b.H || oj + 1 >= b.W || C8 < Cout) {  // an edge tile, or channels past 8k
      output_tiles_base(b, t, t + 1);
      continue;
    }
    float* y00 = b.y + ((2 * oi + b.py) * W2 + 2 * oj + b.px) * Cout;
    float* y01 = y00 + 2 * Cout;
    float* y10 = y00 + 2 * W2 * Cout;
    float* y11 = y10 + 2 * Cout;
    const float* m = b.m + t * Cout;
    for (int64_t c = 0; c < Cout; c += 8) {
      const __m256 m0 = _mm256_loadu_ps(m + c), m1 = _mm256_loadu_ps(m + plane + c),
                   m2 = _mm256_loadu_ps(m + 2 * plane + c), m3 = _mm256_loadu_ps(m + 3 * plane + c),
                   m4 = _mm256_loadu_ps(m + 4 * plane + c), m5 = _mm256_loadu_ps(m + 5 * plane + c),
                   m6 = _mm256_loadu_ps(m + 6 * plane + c), m7 = _mm256_loadu_ps(m + 7 * plane + c),
                   m8 = _mm256_loadu_ps(m + 8 * plane + c);
      const __m256 s00 = _mm256_add_ps(m0, m3), s01 = _mm256_add_ps(m1, m4),
                   s02 = _mm256_add_ps(m2, m5);
      const __m256 s10 = _mm256_add_ps(m3, m6), s11 = _mm256_add_ps(m4, m7),
                   s12 = _mm256_add_ps(m5, m8);
      _mm256_storeu_ps(y00 + c, _mm256_add_ps(s00, s01));
      _mm256_storeu_ps(y01 + c, _mm256_add_ps(s01, s02));
      _mm256_storeu_ps(y10 + c, _mm256_add_ps(s10, s11));
      _mm256_storeu_ps(y11 + c, _mm256_add_ps(s11, s12));
    }
  }
}
#endif

using TilesFn = void (*)(const Band&, int64_t, int64_t);

}  // namespace

at::Tensor winograd_deconv_filters(const at::Tensor& weight) {
  if (weight.dim() != 4 || weight.size(2) != 4 || weight.size(3) != 4) {
    throw Error(ErrorCode::kInternal, "winograd_deconv_filters: weight must be [in, out, 4, 4]");
  }
  const at::Tensor w = weight.to(at::kCPU, at::kDouble);
  const int64_t Cin = w.size(0), Cout = w.size(1);
  at::Tensor u = at::empty({4, 9, Cin, Cout}, w.options());
  for (int py = 0; py < 2; ++py) {
    for (int px = 0; px < 2; ++px) {
      auto g = [&](int a, int b) { return w.select(3, kTap[px][b]).select(2, kTap[py][a]); };
      const at::Tensor g00 = g(0, 0), g01 = g(0, 1), g10 = g(1, 0), g11 = g(1, 1);
      // U = G g G' with G = [1 0; 1 1; 0 1].
      const at::Tensor rows[3][3] = {{g00, g00 + g01, g01},
                                     {g00 + g10, g00 + g01 + g10 + g11, g01 + g11},
                                     {g10, g10 + g11, g11}};
      for (int a = 0; a < 3; ++a) {
        for (int b = 0; b < 3; ++b) u[py * 2 + px][a * 3 + b].copy_(rows[a][b]);
      }
    }
  }
  return u.to(at::kFloat).contiguous();
}

void winograd_deconv(const at::Tensor& padded, int64_t H, int64_t W, const at::Tensor& filters,
                     const at::Tensor& y, const RowsDone& done) {
  const int64_t Cin = padded.size(1), Cout = filters.size(3), Wp = W + 3;
  if (padded.scalar_type() != at::kFloat || !padded.is_contiguous() ||
      padded.size(0) != (H + 3) * Wp || filters.scalar_type() != at::kFloat ||
      !filters.is_contiguous() || filters.size(2) != Cin || y.scalar_type() != at::kFloat ||
      !y.is_contiguous() || y.numel() != 4 * H * W * Cout) {
    throw Error(ErrorCode::kInternal, "winograd_deconv: operands of unexpected shape or layout (" +
                                          std::to_string(H) + "x" + std::to_string(W) + ")");
  }
  const int64_t th = (H + 1) / 2, tw = (W + 1) / 2;
  const int64_t band_rows = std::max<int64_t>(1, kBandTiles / tw);
  const int64_t max_tiles = std::min(th, band_rows) * tw;
  const auto opt = padded.options();
  const at::Tensor v = at::empty({9, max_tiles, Cin}, opt);
  const at::Tensor m = at::empty({9, max_tiles, Cout}, opt);

  TilesFn in_fn = input_tiles_base, out_fn = output_tiles_base;
#ifdef SAPIENS_SEG_X86
  if (host_cpu_features().avx2_fma_f16c()) {  // what SAPIENS_SEG_VEC256 compiles for
    in_fn = input_tiles_avx2;
    out_fn = output_tiles_avx2;
  }
#endif
  // Enough tiles per thread that a chunk is worth a task, few enough to share a band out.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max(Cin, Cout));

  for (int64_t r0 = 0; r0 < th; r0 += band_rows) {
    const int64_t tiles = std::min(band_rows, th - r0) * tw;
    for (int p = 0; p < 4; ++p) {
      const Band b{padded.data_ptr<float>(),
                   v.data_ptr<float>(),
                   m.data_ptr<float>(),
                   y.data_ptr<float>(),
                   H,
                   W,
                   Wp,
                   tw,
                   Cin,
                   Cout,
                   tiles,
                   r0,
                   p / 2,
                   p % 2};
      at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) { in_fn(b, t0, t1); });
      // V and M are read as [9][tiles][C] with this band's tile count as the plane stride.
      const at::Tensor vb = v.view({-1}).narrow(0, 0, 9 * tiles * Cin).view({9, tiles, Cin});
      const at::Tensor mb = m.view({-1}).narrow(0, 0, 9 * tiles * Cout).view({9, tiles, Cout});
      const at::Tensor u = filters[p];
      for (int64_t k = 0; k < 9; ++k) {
        at::Tensor out = mb[k];
        at::mm_out(out, vb[k], u[k]);
      }
      at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) { out_fn(b, t0, t1); });
    }
    const int64_t row0 = 4 * r0, rows = std::min(4 * (r0 + band_rows), 2 * H) - row0;
    done(row0, rows);
  }
}

}  // namespace sapiens_seg::core::head
