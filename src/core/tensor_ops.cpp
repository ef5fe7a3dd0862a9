#include "tensor_ops.hpp"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "sapiens_seg/error.hpp"

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

// Source index pair and weights of one output coordinate, by PyTorch's rule for
// align_corners=False without a scale factor: src = (dst + 0.5) * in / out - 0.5, clamped at 0.
struct Tap {
  int64_t i0, i1;
  float l0, l1;
};

std::vector<Tap> taps(int64_t in, int64_t out) {
  std::vector<Tap> t(static_cast<size_t>(out));
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
  const auto ty = taps(h, H), tx = taps(w, W);
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
        const Tap& vy = ty[static_cast<size_t>(y)];
        const std::uint8_t* l0 = low.data() + vy.i0 * w;
        const std::uint8_t* l1 = low.data() + vy.i1 * w;
        std::uint8_t* out = labels + y * W;
        for (int64_t x = 0; x < W; ++x) {
          const Tap& vx = tx[static_cast<size_t>(x)];
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
      const Tap& vy = ty[static_cast<size_t>(y)];
      std::uint8_t* out = labels + y * W;
      for (int64_t k = 0; k < K; ++k) {
        const float* r0 = src + k * plane + vy.i0 * w;
        const float* r1 = src + k * plane + vy.i1 * w;
        float* full = full_logits + k * out_plane + y * W;
        for (int64_t x = 0; x < W; ++x) {
          const Tap& vx = tx[static_cast<size_t>(x)];
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

}  // namespace sapiens_seg::core
