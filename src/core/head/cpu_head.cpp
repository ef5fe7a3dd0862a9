#include "cpu_head.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include "../cpu/cpuid.hpp"
#include "../cpu/gemm.hpp"
#include "../settings.hpp"
#include "channel_ops.hpp"
#include "sapiens_seg/error.hpp"
#include "winograd.hpp"

namespace sapiens_seg::core::head {
namespace {

constexpr double kInstanceNormEps = 1e-5;  // InstanceNorm2d defaults, in both families' heads

// Per-channel mean and variance of an activation map, gathered tile by tile as it is produced.
// Each tile is shifted by the mean seen so far, so the sum of squares does not cancel when
// |mean| >> std, and tiles merge in float64 (Chan et al.'s pairwise update).
struct ChannelStats {
  int64_t n = 0;
  std::vector<double> mean, m2;
  std::vector<float> shift;

  // `count` pixels of x (CPU, float32, bfloat16 or float16, channels innermost and contiguous), in
  // groups of `group` pixels `group_stride` elements apart.
  void add(const at::Tensor& x, int64_t count, int64_t group, int64_t group_stride) {
    const int64_t C = x.size(-1);
    if (count == 0) return;
    if (shift.empty()) {
      // A rough centre from the first pixels; any value works, a close one keeps precision.
      const at::Tensor first = x.view({-1, C}).narrow(0, 0, std::min<int64_t>(group, 64));
      const at::Tensor m = first.to(at::kFloat).mean(0).contiguous();
      shift.assign(m.data_ptr<float>(), m.data_ptr<float>() + C);
      mean.assign(static_cast<size_t>(C), 0.0);
      m2.assign(static_cast<size_t>(C), 0.0);
    }
    std::vector<double> s1(static_cast<size_t>(C)), s2(static_cast<size_t>(C));
    shifted_sums(x, count, group, group_stride, shift.data(), s1.data(), s2.data());
    const double k = static_cast<double>(count), total = static_cast<double>(n) + k;
    for (size_t c = 0; c < static_cast<size_t>(C); ++c) {
      const double tm = shift[c] + s1[c] / k, tm2 = s2[c] - s1[c] * s1[c] / k;
      const double delta = tm - mean[c];
      m2[c] += tm2 + delta * delta * (static_cast<double>(n) * k / total);
      mean[c] += delta * (k / total);
      shift[c] = static_cast<float>(mean[c]);
    }
    n += count;
  }

  // InstanceNorm (biased variance) as y = x * scale + shift, in float32.
  std::pair<at::Tensor, at::Tensor> affine(double eps) const {
    const auto C = static_cast<int64_t>(mean.size());
    at::Tensor scale = at::empty({C}, at::kFloat), bias = at::empty({C}, at::kFloat);
    for (int64_t c = 0; c < C; ++c) {
      const double rstd =
          1.0 / std::sqrt(std::max(m2[static_cast<size_t>(c)] / static_cast<double>(n), 0.0) + eps);
      scale.data_ptr<float>()[c] = static_cast<float>(rstd);
      bias.data_ptr<float>()[c] = static_cast<float>(-mean[static_cast<size_t>(c)] * rstd);
    }
    return {scale, bias};
  }
};

// Rows of a [pixels, channels] tile in the head: large enough for the GEMMs to run at full speed
// (2048-row tiles run the 768-wide 1x1 convolutions at a quarter of it), small enough to stay in
// the last-level cache.
constexpr int64_t kTileRows = 8192;

// silu(x * scale + shift) into `out` (any layout, same shape as x), computed in float32.
void norm_silu_into(const at::Tensor& out, const at::Tensor& x,
                    const std::pair<at::Tensor, at::Tensor>& affine) {
  norm_silu(out, x, affine.first, affine.second);
}

// An activation map of H x W pixels, C channels, as rows of `pitch` pixels of which the first
// `valid` are the map's (the rest are the padding columns the sub-pixel GEMMs compute and nobody
// reads), in one of two orders:
//  - raster (parity false): [H * W, C], pixel (y, x) at row y * W + x; pitch and valid are W;
//  - by output parity (parity true), as deconv_gemm leaves it: four planes (py, px) in that order,
//    each of H / 2 rows, row i of plane (py, px) holding pixels (2i + py, 2j + px) for j < W / 2.
//    The GEMMs write their tiles straight into place there: gathering them into raster order
//    cost a copy of every deconvolution's output (about 150 ms of a 4 s bfloat16 v1 call on a
//    2-core AMX Xeon).
// The consumers read either order: the next deconvolution's padded input (oneDNN's: gathered into
// raster order), the 1x1 convolutions (pixel by pixel, order-blind) and the classifier, which
// scatters each tile to its pixels in the logits.
struct Map {
  at::Tensor data;  // [planes() * plane_rows() * pitch, C]
  int64_t H = 0, W = 0, pitch = 0;
  bool parity = false;

  static Map raster(at::Tensor data, int64_t H, int64_t W) {
    return {std::move(data), H, W, W, false};
  }
  int64_t planes() const { return parity ? 4 : 1; }
  int64_t plane_rows() const { return parity ? H / 2 : H; }
  int64_t valid() const { return parity ? W / 2 : W; }
  int64_t channels() const { return data.size(1); }
  // Plane p's pixels as [plane_rows, valid, C] (strided over the padding columns; a raster map's
  // one plane is [H, W, C]).
  at::Tensor plane(int64_t p) const {
    const int64_t rows = plane_rows(), C = channels();
    return data.narrow(0, p * rows * pitch, rows * pitch)
        .view({rows, pitch, C})
        .narrow(1, 0, valid());
  }
  // Where plane p's pixels go in an [H, W, C] grid in raster order.
  at::Tensor in_grid(const at::Tensor& grid, int64_t p) const {
    return parity ? grid.slice(0, p / 2, H, 2).slice(1, p % 2, W, 2) : grid;
  }
};

// act's pixels into `grid` ([H, W, C], any strides with the last contiguous) in raster order,
// normalised + SiLU on the way unless `stats` is empty; `grid` may be act's own storage (in place)
// when act is raster and stats is not empty.
void write_raster(const at::Tensor& grid, const Map& act, const ChannelStats& stats) {
  const bool raw = stats.n == 0;
  const std::pair<at::Tensor, at::Tensor> affine =
      raw ? std::pair<at::Tensor, at::Tensor>() : stats.affine(kInstanceNormEps);
  for (int64_t p = 0; p < act.planes(); ++p) {
    const at::Tensor src = act.plane(p);
    const at::Tensor dst = act.in_grid(grid, p);
    if (!raw) {
      norm_silu_into(dst, src, affine);
    } else {
      dst.copy_(src);
    }
  }
}

// The deconvolutions' input: act (raw when stats is empty, else normalised + SiLU on the way) at
// pixel (1, 1) of a `rows` x `cols` grid, then `spare` pixels; everything around the map is zero.
// Returns [rows * cols + spare, Cin]. Only the border is cleared, not the whole map (155 MB at
// v1's last stage).
at::Tensor padded_input(const Map& act, const ChannelStats& stats, int64_t rows, int64_t cols,
                        int64_t spare) {
  const int64_t Cin = act.channels(), H = act.H, W = act.W;
  at::Tensor padded = at::empty({rows * cols + spare, Cin}, act.data.options());
  const at::Tensor grid = padded.narrow(0, 0, rows * cols).view({rows, cols, Cin});
  grid.select(0, 0).zero_();
  grid.slice(0, H + 1, rows).zero_();
  grid.slice(0, 1, H + 1).select(1, 0).zero_();
  grid.slice(0, 1, H + 1).slice(1, W + 1, cols).zero_();
  padded.narrow(0, rows * cols, spare).zero_();
  write_raster(grid.slice(0, 1, H + 1).slice(1, 1, W + 1), act, stats);
  return padded;
}

// One ConvTranspose2d(k4, s2, p1) of the head as four 2x2 sub-pixel convolutions, one per output
// parity (py, px). Output pixel (2i+py, 2j+px) takes input rows i+dy and columns j+dx with kernel
// taps ky = 1 - 2dy (py = 0, dy in {0,-1}) or ky = 2 - 2dy (py = 1, dy in {0,1}), likewise in x.
// With the input zero-padded by one pixel and stored as rows of width W+2, each tap is a GEMM over
// a contiguous block of rows shifted by a constant, and the four taps accumulate in place, in
// the parity plane of the output (a Map by parity, pitch W+2). (LibTorch's CPU transposed
// convolution, NCHW, reached about the same GEMM speed on AVX-512 but allocates every
// intermediate.) `act` is raw or to be normalised with `stats`; the output's statistics are
// gathered into `next` tile by tile as the GEMMs land.
Map deconv_gemm(Map act, const ChannelStats& stats, const at::Tensor& taps, ChannelStats& next) {
  // Output parity -> the (offset, kernel tap) pairs of its two input rows (or columns).
  const int64_t tap_of[2][2][2] = {{{0, 1}, {-1, 3}}, {{0, 2}, {1, 0}}};
  const int64_t H = act.H, W = act.W, HC = taps.size(3), Wp = W + 2;
  // Two spare rows: the last tap's block of the last chunk reaches two rows past the grid.
  const at::Tensor padded = padded_input(act, stats, H + 2, Wp, 2);
  // The previous stage's output lives on in `padded`; releasing it before the next, 4x larger map
  // is allocated lowers the peak by a quarter of that map.
  const auto options = act.data.options();
  act.data = at::Tensor();
  at::Tensor y = at::empty({4 * H * Wp, HC}, options);
  const int64_t chunk = std::max<int64_t>(1, kTileRows / Wp);
  for (int py = 0; py < 2; ++py) {
    for (int px = 0; px < 2; ++px) {
      const int64_t plane = (py * 2 + px) * H;  // its first row
      for (int64_t i0 = 0; i0 < H; i0 += chunk) {
        const int64_t rows = std::min(chunk, H - i0), M = rows * Wp;
        at::Tensor o = y.narrow(0, (plane + i0) * Wp, M);
        bool first = true;
        for (const auto& ty : tap_of[py]) {
          for (const auto& tx : tap_of[px]) {
            const int64_t off = (i0 + 1 + ty[0]) * Wp + 1 + tx[0];
            const at::Tensor a = padded.narrow(0, off, M);
            const at::Tensor w = taps[ty[1]][tx[1]];
            if (first) {
              at::mm_out(o, a, w);
              first = false;
            } else {
              o.addmm_(a, w);
            }
          }
        }
        // Columns W and W+1 of each row are the padding's garbage.
        next.add(o, rows * W, W, Wp * HC);
      }
    }
  }
  return {y, 2 * H, 2 * W, Wp, true};
}

// The same deconvolution by Winograd F(2x2, 2x2) (winograd.hpp), float32: the input normalised
// into a grid padded by one pixel before and two after (tiles of an odd-sized map reach one row
// or column past it), the statistics gathered band by band as the output lands.
Map deconv_winograd(Map act, const ChannelStats& stats, const at::Tensor& filters,
                    ChannelStats& next) {
  const int64_t H = act.H, W = act.W, Cout = filters.size(3);
  const at::Tensor padded = padded_input(act, stats, H + 3, W + 3, 0);
  const auto options = act.data.options();
  act.data = at::Tensor();  // as in deconv_gemm: the raw map goes before the larger one is made
  at::Tensor y = at::empty({4 * H * W, Cout}, options);
  winograd_deconv(padded, H, W, filters, y, [&](int64_t row0, int64_t rows) {
    const int64_t n = rows * 2 * W;
    next.add(y.narrow(0, row0 * 2 * W, n), n, n, 0);
  });
  return Map::raster(std::move(y), 2 * H, 2 * W);
}

// A [P, C] matrix as the NCHW-sized, channels-last [1, C, h, w] tensor it already is in memory.
at::Tensor as_channels_last(const at::Tensor& m, int64_t h, int64_t w) {
  return m.view({1, h, w, m.size(1)}).permute({0, 3, 1, 2});
}

// A channels-last [1, C, h, w] result back to [h*w, C] (a view; a copy only where LibTorch chose
// another layout).
at::Tensor as_matrix(const at::Tensor& t) {
  return t.contiguous(at::MemoryFormat::ChannelsLast)
      .permute({0, 2, 3, 1})
      .reshape({-1, t.size(1)});
}

// The same deconvolution through oneDNN (LibTorch routes channels-last convolutions to its
// mkldnn_convolution): a raster input is normalised in place, since the raw map is not read again;
// a map by parity (a sub-pixel GEMM layer before this one) is gathered into raster order on the
// way.
Map deconv_onednn(Map act, const ChannelStats& stats, const at::Tensor& w, ChannelStats& next) {
  const int64_t H = act.H, W = act.W;
  at::Tensor m = act.parity ? at::empty({H * W, act.channels()}, act.data.options()) : act.data;
  if (act.parity || stats.n != 0) write_raster(m.view({H, W, -1}), act, stats);
  act.data = at::Tensor();
  const at::Tensor x = as_channels_last(m, H, W);
  m = at::Tensor();
  at::Tensor y = as_matrix(at::conv_transpose2d(x, w, {}, /*stride=*/2, /*padding=*/1));
  next.add(y, y.size(0), y.size(0), 0);
  return Map::raster(std::move(y), 2 * H, 2 * W);
}

// out = silu(norm(x)) W (+ b where `b` is defined) for one tile of pixels (1x1 convolution),
// `tile` as scratch; `out` may be `x` itself. A GEMM: LibTorch's BLAS on `w_io` [in, out], or,
// where the float32 GEMMs go to oneDNN (cpu/gemm.hpp's kOnednn), oneDNN's matmul (the inner
// product LibTorch's mkldnn linear reaches) on `w_oi` [out, in]. oneDNN's head path once ran these
// as LibTorch convolutions, tile by tile: each call reordered the weight again and went through
// the convolution's set-up, which on an AMX Xeon (2 cores) took longer than the convolutions
// themselves (oneDNN's verbose log of one Sapiens2 0.4b float32 call: 288 weight reorders of
// 64 x 64 and 29 x 64, 0.6 s, beside 0.84 s of 1x1 convolutions, on a busy machine).
void conv1x1_tile(cpu::GemmPolicy policy, const at::Tensor& out, const at::Tensor& x,
                  const std::pair<at::Tensor, at::Tensor>& affine, const at::Tensor& w_io,
                  const at::Tensor& w_oi, const at::Tensor& b, const at::Tensor& tile) {
  norm_silu_into(tile, x, affine);
  if (policy == cpu::GemmPolicy::kOnednn) {
    out.copy_(cpu::linear(tile, w_oi, b, policy));
  } else if (b.defined()) {
    at::Tensor o = out;
    at::addmm_out(o, b, tile, w_io);
  } else {
    at::Tensor o = out;
    at::mm_out(o, tile, w_io);
  }
}

// The 1x1 convolutions' and the classifier's tiles: `units` rows of a map plane, a unit being one
// pixel of a raster map (tiles of kTileRows pixels) or one row of `pitch` pixels of a map by
// parity (tiles of whole rows, so the statistics can step over the padding columns).
struct Tiles {
  int64_t unit = 1, per_tile = kTileRows, units = 0;
  explicit Tiles(const Map& m)
      : unit(m.parity ? m.pitch : 1),
        per_tile(std::max<int64_t>(1, kTileRows / unit)),
        units(m.parity ? m.plane_rows() : m.H * m.W) {}
  int64_t max_pixels() const { return std::min(per_tile, units) * unit; }
};

}  // namespace

const char* to_string(CpuHeadPath path) {
  switch (path) {
    case CpuHeadPath::kOnednn:
      return "onednn";
    case CpuHeadPath::kMixed:
      return "mixed";
    case CpuHeadPath::kGemm:
      break;
  }
  return "gemm";
}

const char* to_string(Winograd w) {
  switch (w) {
    case Winograd::kWide:
      return "wide";
    case Winograd::kAll:
      return "all";
    case Winograd::kOff:
      break;
  }
  return "off";
}

Winograd cpu_head_winograd_for(const CpuFeatures& cpu, at::ScalarType dtype) {
  if (dtype != at::kFloat) return Winograd::kOff;  // its transforms are float32 passes
  // Measured by head_bench on Zen 3 (2026-12-07, 2 cores, AVX2; benchmarks/results/amd-zen3/
  // cpu-head-winograd.json): v1's head 10.1-11.2 s against 12.5 s with oneDNN's deconvolutions,
  // Sapiens2's 1.47 against 1.65 s. On an AMX Xeon (Intel AVX-512, 2026-12-07, intel-xeon-amx/
  // cpu-head-winograd-amx.json): v1's head 5.26 s against 6.44 s with the sub-pixel GEMMs (its
  // default there), Sapiens2's wide layers 0.12-0.20 s against 0.16-0.21 s, its 128 -> 64 0.34
  // against oneDNN's 0.29 s (kWide leaves that one to oneDNN). Not measured on AMD's AVX-512
  // cores (Zen 4; Zen 5's float32 GEMMs are oneDNN's, where cpu_head_winograd says kOff).
  return cpu.amd && cpu.avx512_core() ? Winograd::kOff : Winograd::kWide;
}

Winograd cpu_head_winograd(at::ScalarType dtype) {
  const std::string v = read_settings().cpu_winograd;
  if (v.empty() || v == "auto") {
    // Its GEMMs run on LibTorch's BLAS: where the float32 policy moves every GEMM to oneDNN
    // (cpu/gemm.hpp, SAPIENS_SEG_CPU_GEMM=onednn included), the direct oneDNN path keeps them
    // there.
    if (dtype == at::kFloat && cpu::float32_gemm().policy == cpu::GemmPolicy::kOnednn) {
      return Winograd::kOff;
    }
    return cpu_head_winograd_for(host_cpu_features(), dtype);
  }
  if (v == "off" || dtype != at::kFloat) return Winograd::kOff;
  if (v == "on") return Winograd::kWide;
  if (v == "all") return Winograd::kAll;
  throw Error(ErrorCode::kInvalidInput,
              "SAPIENS_SEG_CPU_WINOGRAD must be 'auto', 'on', 'all' or 'off', got '" + v + "'");
}

CpuHeadPath cpu_head_path_for(const CpuFeatures& cpu, at::ScalarType dtype, int64_t width) {
  // bfloat16, measured by head_bench on an AMX Xeon (2026-12-07, 2 cores; benchmarks/results/
  // intel-xeon-amx/cpu-head-mixed-amx.json): oneDNN's deconvolutions ran Sapiens2's 128 -> 64 and
  // 256 -> 128 1.36x and 1.14x as fast as the sub-pixel GEMMs, its 512 -> 256 at 0.94x and
  // 1024 -> 512 at 0.78x, and v1's 768-wide head at 0.85-0.90x (ab/cpu-head-planes-new-v1-*.json).
  // Not measured on AVX512-BF16 without AMX (Zen 4), which keeps the GEMMs, nor in float16.
  if (dtype == at::kBFloat16 && cpu.amx_bf16_os()) return CpuHeadPath::kMixed;
  if (dtype != at::kFloat) return CpuHeadPath::kGemm;
  // Measured by head_bench (2026-12-02): on Zen 1 (AVX2 + FMA, 2 cores) v1's head in float32 took
  // 30.5 s through oneDNN, 34.1 s through MKL's GEMMs (64 against 57 GFLOP/s), and Sapiens2's
  // narrow head the same either way. On AVX-512 Intel Xeons the GEMMs won or tied v1's 768-wide
  // head (10.2 against 10.6 s; with AMX 6.1 against 6.4 s, and 5.17 against 5.10 s a day later)
  // and lost Sapiens2's 64-wide one by about a tenth (1.47 against 1.34 s; with AMX 1.15 against
  // 1.04 s, then 0.97 against 0.88 s). On AMD's AVX-512 cores oneDNN was not measured against the
  // GEMMs, so they keep them.
  if (!cpu.avx512_core()) return CpuHeadPath::kOnednn;
  // Where MKL is off its fast path for this CPU (cpu/gemm.hpp), the GEMMs here would be too.
  if (cpu::float32_gemm_for(cpu).policy == cpu::GemmPolicy::kOnednn) return CpuHeadPath::kOnednn;
  return width <= kNarrowHeadWidth && !cpu.amd ? CpuHeadPath::kOnednn : CpuHeadPath::kGemm;
}

CpuHeadPath cpu_head_path(at::ScalarType dtype, int64_t width) {
  if (!at::hasMKLDNN()) return CpuHeadPath::kGemm;  // no oneDNN: LibTorch's slow convolutions
  if (const std::string v = read_settings().cpu_head; !v.empty()) {
    if (v == "gemm") return CpuHeadPath::kGemm;
    if (v == "onednn") return CpuHeadPath::kOnednn;
    if (v == "mixed") return CpuHeadPath::kMixed;
    throw Error(ErrorCode::kInvalidInput,
                "SAPIENS_SEG_CPU_HEAD must be 'gemm', 'onednn' or 'mixed', got '" + v + "'");
  }
  // SAPIENS_SEG_CPU_GEMM=onednn moves the head's float32 GEMMs too.
  if (dtype == at::kFloat && cpu::float32_gemm().policy == cpu::GemmPolicy::kOnednn) {
    return CpuHeadPath::kOnednn;
  }
  return cpu_head_path_for(host_cpu_features(), dtype, width);
}

CpuHead::CpuHead(const HeadWeights& w, CpuHeadPath path, Winograd winograd) : path_(path) {
  for (const at::Tensor& d : w.deconv_w) {
    const int64_t narrowest = std::min(d.size(0), d.size(1));
    const bool wide = narrowest >= kWinogradMinChannels;
    if (d.scalar_type() == at::kFloat &&
        (winograd == Winograd::kAll || (winograd == Winograd::kWide && wide))) {
      method_.push_back(Deconv::kWinograd);
      deconv_.push_back(winograd_deconv_filters(d));
      continue;
    }
    const bool onednn = path == CpuHeadPath::kOnednn ||
                        (path == CpuHeadPath::kMixed && narrowest <= kNarrowHeadWidth);
    method_.push_back(onednn ? Deconv::kOnednn : Deconv::kGemm);
    // GEMM operands as [in, out] matrices, contiguous: MKL runs these narrow GEMMs at half speed
    // with the transposed ([out, in]) layout. [in, out, ky, kx] becomes [ky, kx, in, out].
    // oneDNN gets its weight channels-last, the layout LibTorch converts it to for a
    // channels-last input on every call otherwise (an 8 MB copy per call for Sapiens2's first).
    deconv_.push_back(onednn ? d.contiguous(at::MemoryFormat::ChannelsLast)
                             : d.permute({2, 3, 0, 1}).contiguous());
  }
  // The 1x1 convolutions as matrices: [in, out] for LibTorch's BLAS, [out, in] (a linear layer's
  // weight) for oneDNN's matmul (conv1x1_tile); kilobytes each.
  auto in_out = [](const at::Tensor& c) { return c.view({c.size(0), -1}).t().contiguous(); };
  auto out_in = [](const at::Tensor& c) { return c.view({c.size(0), -1}).contiguous(); };
  // The 1x1 convolutions' biases are not used: each convolution is followed by InstanceNorm
  // without affine, which subtracts every channel's mean over the image and so any per-channel
  // constant added before it (the same normalised map in exact arithmetic; in floating point
  // within rounding, and the GEMM skips a copy of the broadcast bias into its output, 72 copies
  // of 8192 x 768 in a v1 call). The classifier's bias stays.
  for (const at::Tensor& c : w.conv_w) {
    conv_w_.push_back(in_out(c));
    conv_w_oi_.push_back(out_in(c));
  }
  seg_w_ = in_out(w.seg_w);
  seg_w_oi_ = out_in(w.seg_w);
  seg_b_ = w.seg_b.contiguous();
}

int64_t CpuHead::winograd_layers() const {
  return std::count(method_.begin(), method_.end(), Deconv::kWinograd);
}

int64_t CpuHead::onednn_layers() const {
  return std::count(method_.begin(), method_.end(), Deconv::kOnednn);
}

at::Tensor CpuHead::forward(const at::Tensor& feat, int64_t gh, int64_t gw) const {
  const auto stages = static_cast<int64_t>(deconv_.size());
  const int64_t B = feat.size(0), K = seg_b_.size(0);
  at::Tensor logits = at::empty({B, K, gh << stages, gw << stages}, feat.options());
  // The 1x1 convolutions' GEMMs follow the float32 policy of this call (cpu/gemm.hpp).
  const cpu::GemmPolicy policy = cpu::policy_for(
      feat.scalar_type(),
      feat.scalar_type() == at::kFloat ? cpu::float32_gemm().policy : cpu::GemmPolicy::kSplit);

  for (int64_t b = 0; b < B; ++b) {
    Map act = Map::raster(feat[b], gh, gw);  // raw (stats empty) or to be normalised
    ChannelStats stats;
    for (size_t i = 0; i < deconv_.size(); ++i) {
      const at::Tensor& w = deconv_[i];
      ChannelStats next;
      switch (method_[i]) {
        case Deconv::kWinograd:
          act = deconv_winograd(std::move(act), stats, w, next);
          break;
        case Deconv::kGemm:
          act = deconv_gemm(std::move(act), stats, w, next);
          break;
        case Deconv::kOnednn:
          act = deconv_onednn(std::move(act), stats, w, next);
          break;
      }
      stats = std::move(next);
    }

    // The 1x1 convolutions work pixel by pixel, in whichever order the map is stored (padding
    // columns included: they are computed and never read).
    const Tiles tiles(act);
    const int64_t group = act.parity ? act.valid() : 0;
    for (size_t s = 0; s < conv_w_.size(); ++s) {
      const int64_t Cin = act.channels(), Cout = conv_w_[s].size(1);
      const auto affine = stats.affine(kInstanceNormEps);
      // A layer as wide as its input overwrites it, tile by tile (never the caller's feat);
      // another gets a map of its own.
      Map out = act;
      if (Cout != Cin || deconv_.empty()) {
        out.data = at::empty({act.data.size(0), Cout}, act.data.options());
      }
      const at::Tensor tile = at::empty({tiles.max_pixels(), Cin}, act.data.options());
      ChannelStats next;
      for (int64_t p = 0; p < act.planes(); ++p) {
        for (int64_t u = 0; u < tiles.units; u += tiles.per_tile) {
          const int64_t k = std::min(tiles.per_tile, tiles.units - u), n = k * tiles.unit;
          const int64_t r = p * tiles.units * tiles.unit + u * tiles.unit;
          const at::Tensor rows = out.data.narrow(0, r, n);
          conv1x1_tile(policy, rows, act.data.narrow(0, r, n), affine, conv_w_[s], conv_w_oi_[s],
                       at::Tensor(), tile.narrow(0, 0, n));
          if (act.parity) {
            next.add(rows, k * group, group, act.pitch * Cout);
          } else {
            next.add(rows, n, n, 0);
          }
        }
      }
      act = std::move(out);
      stats = std::move(next);
    }
    // The classifier tile by tile into a cache-sized [pixels, K] block, transposed from there
    // into the logits' planes (scattered to the tile's pixels of one parity for a map by parity):
    // a [P, K] map transposed as a whole was read back from memory with a stride of K (0.07 s of
    // a 12 s Sapiens2 0.4b call at 1024x768, AMX Xeon, 2 threads).
    const auto affine = stats.affine(kInstanceNormEps);
    const int64_t H = act.H, W = act.W;
    const at::Tensor out = at::empty({tiles.max_pixels(), K}, act.data.options());
    const at::Tensor tile = at::empty({tiles.max_pixels(), act.channels()}, act.data.options());
    const at::Tensor planes = logits[b].view({K, H * W});
    for (int64_t p = 0; p < act.planes(); ++p) {
      // This plane's pixels in the logits: [K, plane_rows, valid].
      const at::Tensor dst =
          act.parity ? logits[b].view({K, H / 2, 2, W / 2, 2}).select(4, p % 2).select(2, p / 2)
                     : at::Tensor();
      for (int64_t u = 0; u < tiles.units; u += tiles.per_tile) {
        const int64_t k = std::min(tiles.per_tile, tiles.units - u), n = k * tiles.unit;
        const int64_t r = p * tiles.units * tiles.unit + u * tiles.unit;
        const at::Tensor o = out.narrow(0, 0, n);
        conv1x1_tile(policy, o, act.data.narrow(0, r, n), affine, seg_w_, seg_w_oi_, seg_b_,
                     tile.narrow(0, 0, n));
        if (act.parity) {
          dst.narrow(1, u, k).copy_(
              o.view({k, act.pitch, K}).narrow(1, 0, act.valid()).permute({2, 0, 1}));
        } else {
          planes.narrow(1, r, n).copy_(o.t());
        }
      }
    }
  }
  return logits;
}

}  // namespace sapiens_seg::core::head
