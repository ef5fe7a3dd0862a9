// PROVISIONAL: exact-arithmetic model of IPP's cubic, being replaced by the reproduced float32
// arithmetic.
#include "wheel_cubic.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "taps.hpp"

namespace sapiens_seg::core::resize_detail {

namespace {
struct DTaps {
  std::vector<int> idx;
  std::vector<double> w;
};
DTaps dtaps(int in, int out) {
  DTaps t;
  t.idx.resize(static_cast<std::size_t>(out) * 4);
  t.w.resize(static_cast<std::size_t>(out) * 4);
  const double A = -0.75;
  auto kin = [&](double x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
  auto kout = [&](double x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
  for (int d = 0; d < out; ++d) {
    const double s = (d + 0.5) * in / out - 0.5;
    const int i = static_cast<int>(std::floor(s));
    const double f = s - i;
    const double w[4] = {kout(1 + f), kin(f), kin(1 - f), kout(2 - f)};
    for (int k = 0; k < 4; ++k) {
      t.idx[static_cast<std::size_t>(d) * 4 + k] = std::clamp(i - 1 + k, 0, in - 1);
      t.w[static_cast<std::size_t>(d) * 4 + k] = w[k];
    }
  }
  return t;
}
}  // namespace

void wheel_cubic_host(const std::uint8_t* src, std::size_t sstride, int h, int w, int cn,
                      std::uint8_t* dst, std::size_t dstride, int H, int W) {
  const DTaps tx = dtaps(w, W), ty = dtaps(h, H);
  std::vector<double> rows(static_cast<std::size_t>(h) * W * cn);
  at::parallel_for(0, h, 16, [&](int64_t a, int64_t b) {
    for (int64_t y = a; y < b; ++y) {
      const std::uint8_t* S = src + y * sstride;
      double* D = rows.data() + y * W * cn;
      for (int x = 0; x < W; ++x)
        for (int c = 0; c < cn; ++c) {
          double v = 0;
          for (int k = 0; k < 4; ++k) v += tx.w[x * 4 + k] * S[tx.idx[x * 4 + k] * cn + c];
          D[x * cn + c] = v;
        }
    }
  });
  at::parallel_for(0, H, 16, [&](int64_t a, int64_t b) {
    for (int64_t y = a; y < b; ++y) {
      std::uint8_t* out = dst + y * dstride;
      for (int x = 0; x < W * cn; ++x) {
        double v = 0;
        for (int k = 0; k < 4; ++k)
          v += ty.w[y * 4 + k] * rows[static_cast<std::size_t>(ty.idx[y * 4 + k]) * W * cn + x];
        out[x] = static_cast<std::uint8_t>(std::clamp(std::nearbyint(v), 0.0, 255.0));
      }
    }
  });
}

at::Tensor wheel_cubic_tensor(const at::Tensor& img, int64_t H, int64_t W) {
  const at::Tensor cpu = img.to(at::kCPU).contiguous();
  at::Tensor out = at::empty({H, W, img.size(2)}, cpu.options());
  wheel_cubic_host(cpu.data_ptr<std::uint8_t>(), cpu.stride(0), static_cast<int>(img.size(0)),
                   static_cast<int>(img.size(1)), static_cast<int>(img.size(2)),
                   out.data_ptr<std::uint8_t>(), out.stride(0), static_cast<int>(H),
                   static_cast<int>(W));
  return out.to(img.device());
}

}  // namespace sapiens_seg::core::resize_detail
