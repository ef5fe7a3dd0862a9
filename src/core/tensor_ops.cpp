#include "tensor_ops.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "backends/backends.hpp"
#include "sapiens_seg/error.hpp"
#ifdef SAPIENS_SEG_WITH_KERNELS
#include "kernels/seg_up/head.hpp"
#endif

namespace sapiens_seg::core {

at::Tensor normalize_rgb(const std::uint8_t* data, int h, int w, std::size_t stride,
                         const std::array<float, 3>& mean, const std::array<float, 3>& std) {
  const auto u8 = at::from_blob(const_cast<std::uint8_t*>(data), {h, w, 3},
                                {static_cast<int64_t>(stride), 3, 1}, at::kByte);
  const auto m = at::tensor(at::ArrayRef<float>(mean.data(), 3)).view({3, 1, 1});
  const auto s = at::tensor(at::ArrayRef<float>(std.data(), 3)).view({3, 1, 1});
  return (u8.permute({2, 0, 1}).to(at::kFloat) - m) / s;
}

namespace {

// Source indices and weights of each output coordinate of a bilinear resize `in` -> `out` by
// PyTorch's align_corners=False rule: src = (dst + 0.5) * in / out - 0.5, clamped at 0; the far
// neighbour clamps at the border.
struct BilinearTap {
  int64_t i0, i1;
  float l0, l1;
};
std::vector<BilinearTap> bilinear_taps(int64_t in, int64_t out) {
  std::vector<BilinearTap> t(static_cast<size_t>(out));
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t d = 0; d < out; ++d) {
    float src = scale * (static_cast<float>(d) + 0.5f) - 0.5f;
    src = std::max(src, 0.0f);
    const auto i0 = std::min(static_cast<int64_t>(src), in - 1);
    const int64_t i1 = i0 < in - 1 ? i0 + 1 : i0;
    const float l1 = src - static_cast<float>(i0);
    t[static_cast<size_t>(d)] = {i0, i1, 1.0f - l1, l1};
  }
  return t;
}

}  // namespace

void upsample_argmax(const at::Tensor& logits, int H, int W, std::uint8_t* labels,
                     float* full_logits) {
  if (logits.dim() != 3 || logits.scalar_type() != at::kFloat || !logits.is_contiguous() ||
      !logits.device().is_cpu()) {
    throw Error(ErrorCode::kInternal, "upsample_argmax needs contiguous fp32 CPU [K,h,w] logits");
  }
  const int64_t K = logits.size(0), h = logits.size(1), w = logits.size(2);
  if (K > 256) throw Error(ErrorCode::kInternal, "more than 256 classes do not fit uint8 labels");
  const float* src = logits.const_data_ptr<float>();
  const auto ty = bilinear_taps(h, H), tx = bilinear_taps(w, W);
  const int64_t plane = h * w, out_plane = static_cast<int64_t>(H) * W;

  if (!full_logits) {
    // Labels only. Bilinear weights are non-negative and sum to 1, so where the (up to) four
    // source pixels share one argmax, the blend has that argmax too: only pixels whose sources
    // disagree (class boundaries, a small fraction of a large image) need the K-class blend.
    // Rounding can matter only for classes tied to within float precision, where both answers
    // are argmaxes of the exact blend.
    std::vector<std::uint8_t> low(static_cast<size_t>(plane));
    at::parallel_for(0, h, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t p = r0 * w; p < r1 * w; ++p) {
        float best = src[p];
        std::uint8_t arg = 0;
        for (int64_t k = 1; k < K; ++k) {
          if (src[k * plane + p] > best) {  // strictly: the lower index wins ties
            best = src[k * plane + p];
            arg = static_cast<std::uint8_t>(k);
          }
        }
        low[static_cast<size_t>(p)] = arg;
      }
    });
    at::parallel_for(0, H, 8, [&](int64_t y_begin, int64_t y_end) {
      for (int64_t y = y_begin; y < y_end; ++y) {
        const BilinearTap& vy = ty[static_cast<size_t>(y)];
        const std::uint8_t* l0 = low.data() + vy.i0 * w;
        const std::uint8_t* l1 = low.data() + vy.i1 * w;
        std::uint8_t* out = labels + y * W;
        for (int64_t x = 0; x < W; ++x) {
          const BilinearTap& vx = tx[static_cast<size_t>(x)];
          const std::uint8_t a = l0[vx.i0];
          if (a == l0[vx.i1] && a == l1[vx.i0] && a == l1[vx.i1]) {
            out[x] = a;
            continue;
          }
          const int64_t p00 = vy.i0 * w + vx.i0, p01 = vy.i0 * w + vx.i1;
          const int64_t p10 = vy.i1 * w + vx.i0, p11 = vy.i1 * w + vx.i1;
          float best = 0;
          for (int64_t k = 0; k < K; ++k) {
            const float* s = src + k * plane;
            // The same expression as the full path below, so both round alike.
            const float v = vy.l0 * (vx.l0 * s[p00] + vx.l1 * s[p01]) +
                            vy.l1 * (vx.l0 * s[p10] + vx.l1 * s[p11]);
            if (k == 0 || v > best) {
              best = v;
              out[x] = static_cast<std::uint8_t>(k);
            }
          }
        }
      }
    });
    return;
  }

  // Rows are independent; a grain of a few rows keeps each task's sources in cache.
  at::parallel_for(0, H, 8, [&](int64_t y_begin, int64_t y_end) {
    std::vector<float> best(static_cast<size_t>(W));
    for (int64_t y = y_begin; y < y_end; ++y) {
      const BilinearTap& vy = ty[static_cast<size_t>(y)];
      std::uint8_t* out = labels + y * W;
      for (int64_t k = 0; k < K; ++k) {
        const float* r0 = src + k * plane + vy.i0 * w;
        const float* r1 = src + k * plane + vy.i1 * w;
        float* full = full_logits + k * out_plane + y * W;
        for (int64_t x = 0; x < W; ++x) {
          const BilinearTap& vx = tx[static_cast<size_t>(x)];
          const float v = vy.l0 * (vx.l0 * r0[vx.i0] + vx.l1 * r0[vx.i1]) +
                          vy.l1 * (vx.l0 * r1[vx.i0] + vx.l1 * r1[vx.i1]);
          full[x] = v;
          // Strictly greater: on an exact tie the lower class index wins, as torch.argmax.
          if (k == 0 || v > best[static_cast<size_t>(x)]) {
            best[static_cast<size_t>(x)] = v;
            out[x] = static_cast<std::uint8_t>(k);
          }
        }
      }
    }
  });
}

at::Tensor resize_normalize(const at::Tensor& rgb, int64_t H, int64_t W,
                            const std::array<float, 3>& mean, const std::array<float, 3>& std,
                            Interp interp, CubicFlavor flavor) {
  if (rgb.dim() != 3 || rgb.size(2) != 3 || rgb.scalar_type() != at::kByte || H < 1 || W < 1) {
    throw Error(ErrorCode::kInternal, "resize_normalize needs a uint8 [h, w, 3] image");
  }
  const c10::Device dev = rgb.device();
  const at::Tensor img = resize_tensor(rgb, H, W, interp, flavor);  // [H, W, 3] uint8
  // As normalize_rgb: tensor operands, so the division is a true division (ATen turns division
  // by a scalar into multiplication by its reciprocal, which rounds differently).
  const at::Tensor x = img.permute({2, 0, 1}).to(at::kFloat);
  const auto m = to_device(at::tensor(at::ArrayRef<float>(mean.data(), 3)).view({3, 1, 1}), dev);
  const auto s = to_device(at::tensor(at::ArrayRef<float>(std.data(), 3)).view({3, 1, 1}), dev);
  return (x - m) / s;
}

#ifdef SAPIENS_SEG_WITH_KERNELS
namespace {
bool fused_kernel_usable(const at::Tensor& logits) {
  const auto t = logits.scalar_type();
  return logits.is_cuda() && (t == at::kFloat || t == at::kHalf || t == at::kBFloat16) &&
         kernels_unavailable_reason(logits.device()).empty();
}
}  // namespace
#endif

at::Tensor upsample_argmax_labels(const at::Tensor& logits, int64_t H, int64_t W,
                                  int64_t band_bytes, bool fused) {
  if (logits.dim() != 3 || !at::isFloatingType(logits.scalar_type()) || H < 1 || W < 1) {
    throw Error(ErrorCode::kInternal, "upsample_argmax_labels needs float [K, h, w] logits");
  }
  const int64_t K = logits.size(0), h = logits.size(1), w = logits.size(2);
  if (K > 256) throw Error(ErrorCode::kInternal, "more than 256 classes do not fit uint8 labels");
  const auto dev = logits.device();
  at::Tensor labels = at::empty({H, W}, logits.options().dtype(at::kByte));
#ifdef SAPIENS_SEG_WITH_KERNELS
  if (fused && fused_kernel_usable(logits)) {
    kernels::seg_up::upsample_argmax(logits.permute({1, 2, 0}).contiguous(), K, labels);
    return labels;
  }
#else
  (void)fused;
#endif
  // The taps of upsample_argmax, as index and weight tensors on the device.
  auto tap_tensors = [&](int64_t in, int64_t out) {
    const auto taps = bilinear_taps(in, out);
    at::Tensor i = at::empty({2, out}, at::kLong), l = at::empty({2, out}, at::kFloat);
    auto ia = i.accessor<int64_t, 2>();
    auto la = l.accessor<float, 2>();
    for (int64_t d = 0; d < out; ++d) {
      const auto& t = taps[static_cast<size_t>(d)];
      ia[0][d] = t.i0, ia[1][d] = t.i1, la[0][d] = t.l0, la[1][d] = t.l1;
    }
    return std::pair{to_device(i, dev), to_device(l, dev)};
  };
  // (Plain variables, not structured bindings: the band lambda captures them, which clang
  // before 16 refuses for bindings.)
  const auto ytaps = tap_tensors(h, H), xtaps = tap_tensors(w, W);
  const at::Tensor &yi = ytaps.first, &yl = ytaps.second;
  const at::Tensor &xi = xtaps.first, &xl = xtaps.second;
  const at::Tensor src = logits.to(at::kFloat);
  // About six [K, rows, W] float temporaries are alive at once.
  const int64_t rows = std::clamp<int64_t>(band_bytes / (6 * K * W * 4), 1, H);
  for (int64_t y0 = 0; y0 < H; y0 += rows) {
    const int64_t n = std::min(rows, H - y0);
    auto blend_x = [&](const at::Tensor& r) {  // r: [K, n, w] -> [K, n, W]
      return xl[0] * r.index_select(2, xi[0]) + xl[1] * r.index_select(2, xi[1]);
    };
    const at::Tensor top = blend_x(src.index_select(1, yi[0].narrow(0, y0, n)));
    const at::Tensor bottom = blend_x(src.index_select(1, yi[1].narrow(0, y0, n)));
    // The same expression, operand for operand, as upsample_argmax: each product and sum is
    // one rounding there and here.
    const at::Tensor v = yl[0].narrow(0, y0, n).view({1, n, 1}) * top +
                         yl[1].narrow(0, y0, n).view({1, n, 1}) * bottom;
    labels.narrow(0, y0, n).copy_(v.argmax(0));
  }
  return labels;
}

}  // namespace sapiens_seg::core
