// seg_up host code: weight preparation, the head's schedule of GEMMs and kernels, and the
// upsample + argmax entry point.
#include "kernels/seg_up/head.hpp"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "kernels/fastbb/fastbb.hpp"
#include "kernels/seg_up/launch.hpp"

namespace sapiens_seg::kernels::seg_up {
namespace {

constexpr double kInstanceNormEps = 1e-5;  // InstanceNorm2d's default in VitHead
constexpr std::int64_t kTileRows = 16384;  // rows of the 1x1 convolutions' scratch tile

cudaStream_t stream_of(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.device().index());
}

}  // namespace

HeadWeights prepare_head(const std::vector<at::Tensor>& deconv,
                         const std::vector<at::Tensor>& conv_w,
                         const std::vector<at::Tensor>& conv_b, const at::Tensor& seg_w,
                         const at::Tensor& seg_b, c10::Device device, at::ScalarType dtype) {
  TORCH_CHECK(!deconv.empty() && deconv.size() <= 6, "prepare_head: ", deconv.size(),
              " deconvolutions (1 to 6 supported)");
  TORCH_CHECK(conv_w.size() == conv_b.size(), "prepare_head: ", conv_w.size(), " conv weights but ",
              conv_b.size(), " biases");
  HeadWeights h;
  // Conversion on the host, then one upload of the converted tensor: the device never holds a
  // float32 copy of a weight it runs in 16 bits.
  auto put = [&](const at::Tensor& t) { return t.to(dtype).contiguous().to(device); };
  std::int64_t width = deconv[0].dim() == 4 ? deconv[0].size(0) : -1;
  for (size_t s = 0; s < deconv.size(); ++s) {
    const at::Tensor& d = deconv[s];
    TORCH_CHECK(d.dim() == 4 && d.size(0) == width && d.size(2) == 4 && d.size(3) == 4,
                "prepare_head: deconvolution ", s, " must be [", width, ", out, 4, 4], got ",
                d.sizes());
    h.deconv.push_back(put(d.permute({2, 3, 1, 0})));  // [ky, kx, out, in]
    width = d.size(1);
  }
  for (size_t s = 0; s < conv_w.size(); ++s) {
    const at::Tensor& c = conv_w[s];
    TORCH_CHECK(c.dim() == 4 && c.size(1) == width && c.size(2) == 1 && c.size(3) == 1,
                "prepare_head: conv ", s, " must be [out, ", width, ", 1, 1], got ", c.sizes());
    TORCH_CHECK(conv_b[s].dim() == 1 && conv_b[s].size(0) == c.size(0), "prepare_head: conv ", s,
                " bias must be [", c.size(0), "], got ", conv_b[s].sizes());
    h.conv_w.push_back(put(c.reshape({c.size(0), c.size(1)})));
    h.conv_b.push_back(put(conv_b[s]));
    width = c.size(0);
  }
  TORCH_CHECK(
      seg_w.dim() == 4 && seg_w.size(1) == width && seg_w.size(2) == 1 && seg_w.size(3) == 1,
      "prepare_head: conv_seg must be [K, ", width, ", 1, 1], got ", seg_w.sizes());
  h.classes = seg_w.size(0);
  TORCH_CHECK(seg_b.dim() == 1 && seg_b.size(0) == h.classes,
              "prepare_head: conv_seg bias must be [", h.classes, "], got ", seg_b.sizes());
  const std::int64_t Kp = (h.classes + 7) / 8 * 8;
  h.seg_w = put(at::constant_pad_nd(seg_w.reshape({h.classes, width}), {0, 0, 0, Kp - h.classes}));
  h.seg_b = put(at::constant_pad_nd(seg_b, {0, Kp - h.classes}));
  return h;
}

std::pair<at::Tensor, at::Tensor> channel_stats(const at::Tensor& x, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.is_cuda(),
              "channel_stats: x must be a contiguous CUDA [P, C] matrix");
  const std::int64_t P = x.size(0), C = x.size(1);
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor partials = at::empty({std::max<std::int64_t>(channel_stats_scratch(P, C), 1)}, f32);
  at::Tensor scale = at::empty({C}, f32), shift = at::empty({C}, f32);
  launch_channel_stats(to_dtype(x.scalar_type()), x.const_data_ptr(), P, C, static_cast<float>(eps),
                       partials.data_ptr<float>(), scale.data_ptr<float>(), shift.data_ptr<float>(),
                       stream_of(x));
  return {scale, shift};
}

void norm_silu_(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.is_cuda(),
              "norm_silu_: x must be a contiguous CUDA [P, C] matrix");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && shift.scalar_type() == at::kFloat &&
                  scale.numel() == x.size(1) && shift.numel() == x.size(1),
              "norm_silu_: scale and shift must be float32 [", x.size(1), "]");
  launch_norm_silu(to_dtype(x.scalar_type()), x.data_ptr(), scale.const_data_ptr<float>(),
                   shift.const_data_ptr<float>(), x.size(0), x.size(1), stream_of(x));
}

at::Tensor head_forward(fastbb::Gemm& gemm, const HeadWeights& w, const at::Tensor& feat,
                        std::int64_t gh, std::int64_t gw, std::int64_t band_rows) {
  TORCH_CHECK(feat.dim() == 2 && feat.size(0) == gh * gw && feat.is_contiguous() && feat.is_cuda(),
              "head_forward: feat must be a contiguous CUDA [", gh * gw, ", C] matrix, got ",
              feat.sizes());
  const c10::cuda::CUDAGuard guard(feat.device());
  const DType t = to_dtype(feat.scalar_type());
  const cudaStream_t stream = stream_of(feat);
  const auto opts = feat.options();

  at::Tensor act = feat;    // [H * W, channels]
  at::Tensor scale, shift;  // undefined: act is used as is (the backbone's final norm)
  std::int64_t H = gh, W = gw;
  for (const at::Tensor& taps : w.deconv) {
    const std::int64_t Cin = act.size(1), Cout = taps.size(2), Wp = W + 2;
    at::Tensor padded = at::zeros({padded_rows(H, W), Cin}, opts);
    launch_pad_norm_silu(t, act.const_data_ptr(),
                         scale.defined() ? scale.const_data_ptr<float>() : nullptr,
                         shift.defined() ? shift.const_data_ptr<float>() : nullptr,
                         padded.data_ptr(), H, W, Cin, stream);
    act = at::Tensor();  // the previous map is no longer read: its memory serves the next one
    at::Tensor y = at::empty({4 * H * W, Cout}, opts);
    const std::int64_t band = std::min(H, band_rows > 0 ? band_rows : deconv_band_rows(W));
    at::Tensor plane = at::empty({band * Wp, Cout}, opts);
    for (int py = 0; py < 2; ++py) {
      for (int px = 0; px < 2; ++px) {
        for (std::int64_t i0 = 0; i0 < H; i0 += band) {
          // Input rows i0 .. i0+n-1 -> output rows 2*i0+py ..; each tap block starts i0 rows on.
          const std::int64_t n = std::min(band, H - i0), Mb = n * Wp;
          const at::Tensor out = plane.narrow(0, 0, Mb);
          bool first = true;
          for (const auto& ty : kTaps[py]) {
            for (const auto& tx : kTaps[px]) {
              const at::Tensor a = padded.narrow(0, tap_row_offset(ty[0], tx[0], Wp) + i0 * Wp, Mb);
              gemm.linear(a, taps[ty[1]][tx[1]], at::Tensor(), first ? at::Tensor() : out,
                          fastbb::Activation::kNone, out);
              first = false;
            }
          }
          launch_scatter_parity(t, out.const_data_ptr(),
                                y.narrow(0, 2 * i0 * 2 * W, 2 * n * 2 * W).data_ptr(), n, W, Wp,
                                Cout, py, px, stream);
        }
      }
    }
    padded = at::Tensor();
    plane = at::Tensor();
    std::tie(scale, shift) = channel_stats(y, kInstanceNormEps);
    act = y;
    H *= 2;
    W *= 2;
  }

  const std::int64_t P = H * W;
  at::Tensor tile;
  for (size_t s = 0; s < w.conv_w.size(); ++s) {
    norm_silu_(act, scale, shift);
    const std::int64_t Cin = act.size(1), Cout = w.conv_w[s].size(0);
    if (Cout == Cin) {  // in place, through the row tile
      if (!tile.defined() || tile.size(1) != Cout) {
        tile = at::empty({std::min(kTileRows, P), Cout}, opts);
      }
      for (std::int64_t r = 0; r < P; r += kTileRows) {
        const std::int64_t n = std::min(kTileRows, P - r);
        const at::Tensor out = tile.narrow(0, 0, n);
        gemm.linear(act.narrow(0, r, n), w.conv_w[s], w.conv_b[s], at::Tensor(),
                    fastbb::Activation::kNone, out);
        act.narrow(0, r, n).copy_(out);
      }
    } else {
      at::Tensor next = at::empty({P, Cout}, opts);
      gemm.linear(act, w.conv_w[s], w.conv_b[s], at::Tensor(), fastbb::Activation::kNone, next);
      act = next;
    }
    std::tie(scale, shift) = channel_stats(act, kInstanceNormEps);
  }
  tile = at::Tensor();
  norm_silu_(act, scale, shift);
  at::Tensor logits = at::empty({P, w.seg_w.size(0)}, opts);
  gemm.linear(act, w.seg_w, w.seg_b, at::Tensor(), fastbb::Activation::kNone, logits);
  return logits;
}

at::Tensor head_forward_reference(const HeadWeights& w, const at::Tensor& feat, std::int64_t gh,
                                  std::int64_t gw) {
  TORCH_CHECK(feat.dim() == 2 && feat.size(0) == gh * gw, "head_forward_reference: feat must be [",
              gh * gw, ", C], got ", feat.sizes());
  // InstanceNorm over the pixels of each channel (biased variance, fp32), then SiLU, rounded to
  // the map's dtype once, as the kernels apply it where the next layer reads the map.
  auto norm_silu = [](const at::Tensor& x) {
    const at::Tensor f = x.to(at::kFloat);
    const at::Tensor mean = f.mean(0, true);
    const at::Tensor var = (f - mean).square().mean(0, true);
    return at::silu((f - mean) * at::rsqrt(var + kInstanceNormEps)).to(x.scalar_type());
  };
  at::Tensor act = feat.view({gh, gw, feat.size(1)});
  bool raw = true;  // the backbone's output goes into the first deconvolution as it is
  for (const at::Tensor& taps : w.deconv) {
    const at::Tensor in = raw ? act : norm_silu(act.flatten(0, 1)).view(act.sizes());
    act = subpixel_deconv_reference(in, taps);
    raw = false;
  }
  const std::int64_t H = act.size(0), W = act.size(1);
  at::Tensor m = act.reshape({H * W, act.size(2)});
  for (size_t s = 0; s < w.conv_w.size(); ++s) {
    m = at::addmm(w.conv_b[s], norm_silu(m), w.conv_w[s].t());
  }
  return at::addmm(w.seg_b, norm_silu(m), w.seg_w.t());
}

at::Tensor subpixel_deconv_reference(const at::Tensor& x, const at::Tensor& taps,
                                     std::int64_t band_rows) {
  TORCH_CHECK(x.dim() == 3 && taps.dim() == 4 && taps.size(0) == 4 && taps.size(1) == 4 &&
                  taps.size(3) == x.size(2),
              "subpixel_deconv_reference: x [H, W, Cin] and taps [4, 4, Cout, Cin] expected");
  const std::int64_t H = x.size(0), W = x.size(1), Cin = x.size(2), Cout = taps.size(2);
  const std::int64_t Wp = W + 2;
  const std::int64_t band = std::min(H, band_rows > 0 ? band_rows : deconv_band_rows(W));
  at::Tensor padded = at::zeros({padded_rows(H, W), Cin}, x.options());
  padded.narrow(0, 0, (H + 2) * Wp)
      .view({H + 2, Wp, Cin})
      .slice(0, 1, H + 1)
      .slice(1, 1, W + 1)
      .copy_(x);
  at::Tensor y = at::empty({H, 2, W, 2, Cout}, x.options());
  for (int py = 0; py < 2; ++py) {
    for (int px = 0; px < 2; ++px) {
      for (std::int64_t i0 = 0; i0 < H; i0 += band) {
        const std::int64_t n = std::min(band, H - i0), Mb = n * Wp;
        at::Tensor plane = at::zeros({Mb, Cout}, x.options());
        for (const auto& ty : kTaps[py]) {
          for (const auto& tx : kTaps[px]) {
            plane.addmm_(padded.narrow(0, tap_row_offset(ty[0], tx[0], Wp) + i0 * Wp, Mb),
                         taps[ty[1]][tx[1]].t());
          }
        }
        y.narrow(0, i0, n).select(3, px).select(1, py).copy_(
            plane.view({n, Wp, Cout}).narrow(1, 0, W));
      }
    }
  }
  return y.view({2 * H, 2 * W, Cout});
}

void upsample_argmax(const at::Tensor& logits, std::int64_t classes, const at::Tensor& labels) {
  TORCH_CHECK(logits.dim() == 3 && logits.stride(2) == 1 && logits.stride(1) == logits.size(2) &&
                  logits.stride(0) == logits.size(1) * logits.size(2),
              "upsample_argmax: logits must be a contiguous [h, w, channels] tensor, got ",
              logits.sizes());
  TORCH_CHECK(classes >= 1 && classes <= logits.size(2) && classes <= 256,
              "upsample_argmax: ", classes, " classes of ", logits.size(2),
              " channels (at most 256 fit uint8 labels)");
  TORCH_CHECK(labels.dim() == 2 && labels.is_contiguous() && labels.scalar_type() == at::kByte,
              "upsample_argmax: labels must be a contiguous uint8 [H, W] tensor");
  TORCH_CHECK(logits.is_cuda() && labels.device() == logits.device(),
              "upsample_argmax: logits and labels must be on one CUDA device");
  const c10::cuda::CUDAGuard guard(logits.device());
  launch_upsample_argmax(to_dtype(logits.scalar_type()), logits.const_data_ptr(), logits.size(0),
                         logits.size(1), static_cast<int>(classes), logits.size(2),
                         labels.data_ptr<std::uint8_t>(), labels.size(0), labels.size(1),
                         stream_of(logits));
}

}  // namespace sapiens_seg::kernels::seg_up
