// resize_tensor: resize_u8's arithmetic as ATen ops, so it runs where the image tensor lives (the
// device pipeline uploads uint8 pixels and resizes them on the GPU). Every float step is its own
// op (one rounding each, as the host loops and OpenCV round), and the sums run in the same order
// as theirs, so both paths give the same bytes; tests/python/test_resize.py holds both to the
// opencv-python wheel.
#include <ATen/ATen.h>

#include "resize.hpp"
#include "sapiens_seg/error.hpp"
#include "taps.hpp"
#include "wheel_cubic.hpp"

namespace sapiens_seg::core {

at::Tensor to_device(const at::Tensor& host, const c10::Device& device) {
  if (device.is_cpu()) return host;
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

using resize_detail::Taps;

namespace {

struct TapTensors {
  at::Tensor index;  // int64 [ksize, out]
  at::Tensor fixed;  // int32 [ksize, out]
};

TapTensors tap_tensors(const Taps& t, int64_t out, const c10::Device& device) {
  const int64_t k = t.ksize;
  at::Tensor i = at::empty({k, out}, at::kLong), w = at::empty({k, out}, at::kInt);
  auto ia = i.accessor<int64_t, 2>();
  auto wa = w.accessor<int32_t, 2>();
  for (int64_t d = 0; d < out; ++d) {
    for (int64_t j = 0; j < k; ++j) {
      ia[j][d] = t.index[static_cast<std::size_t>(d * k + j)];
      wa[j][d] = t.fixed[static_cast<std::size_t>(d * k + j)];
    }
  }
  return {to_device(i, device), to_device(w, device)};
}

// [h, w, C] uint8 -> [h, W, C] int32: the fixed-point horizontal pass (exact integer sums).
at::Tensor hpass_fixed(const at::Tensor& img, const TapTensors& x) {
  const int64_t W = x.index.size(1);
  at::Tensor acc;
  for (int64_t k = 0; k < x.index.size(0); ++k) {
    at::Tensor term = img.index_select(1, x.index[k]).to(at::kInt) * x.fixed[k].view({1, W, 1});
    acc = k == 0 ? term : acc + term;
  }
  return acc;
}

// INTER_LINEAR's vertical pass on the horizontal rows [h, W, C] (int32).
at::Tensor vpass_linear(const at::Tensor& rows, const TapTensors& y) {
  const int64_t H = y.index.size(1);
  const at::Tensor r0 = at::bitwise_right_shift(rows.index_select(0, y.index[0]), 4);
  const at::Tensor r1 = at::bitwise_right_shift(rows.index_select(0, y.index[1]), 4);
  at::Tensor v = at::bitwise_right_shift(r0 * y.fixed[0].view({H, 1, 1}), 16) +
                 at::bitwise_right_shift(r1 * y.fixed[1].view({H, 1, 1}), 16);
  return at::bitwise_right_shift(v.add_(2), 2).clamp_(0, 255).to(at::kByte);
}

// OpenCV's cubic vertical pass: float32 on the first multiple of 8 values of each output row
// (W * C of them), integer on the rest (see vpass_cubic in host.cpp).
at::Tensor vpass_cubic(const at::Tensor& rows, const TapTensors& y) {
  const int64_t H = y.index.size(1), W = rows.size(1), C = rows.size(2);
  const at::Tensor scaled = y.fixed.to(at::kFloat) * (1.f / (2048.f * 2048.f));  // exact
  at::Tensor t, iacc;
  for (int64_t k = 3; k >= 0; --k) {
    const at::Tensor r = rows.index_select(0, y.index[k]);
    const at::Tensor term = r.to(at::kFloat) * scaled[k].view({H, 1, 1});
    t = k == 3 ? term : term + t;
  }
  for (int64_t k = 0; k < 4; ++k) {
    const at::Tensor term = rows.index_select(0, y.index[k]) * y.fixed[k].view({H, 1, 1});
    iacc = k == 0 ? term : iacc + term;
  }
  at::Tensor vec = at::round(t).clamp_(0, 255).to(at::kByte);  // not const: returned by move
  const int64_t n = W * C, vec_end = n / 8 * 8;
  if (vec_end == n) return vec;
  const at::Tensor tail =
      at::bitwise_right_shift(iacc + (1 << 21), 22).clamp_(0, 255).to(at::kByte);
  const at::Tensor flat = vec.reshape({H, n}).clone();
  flat.narrow(1, vec_end, n - vec_end).copy_(tail.reshape({H, n}).narrow(1, vec_end, n - vec_end));
  return flat.view({H, W, C});
}

at::Tensor run_fixed(const at::Tensor& img, const Taps& tx, const Taps& ty, int64_t H, int64_t W) {
  const auto dev = img.device();
  const TapTensors x = tap_tensors(tx, W, dev), y = tap_tensors(ty, H, dev);
  const at::Tensor rows = hpass_fixed(img, x);
  return tx.ksize == 2 ? vpass_linear(rows, y) : vpass_cubic(rows, y);
}

at::Tensor run_area_integer(const at::Tensor& img, int fx, int fy, int64_t H, int64_t W) {
  const int64_t C = img.size(2);
  const at::Tensor sum =
      img.contiguous().view({H, fy, W, fx, C}).to(at::kInt).sum({1, 3}, false, at::kInt);
  if (fx == 2 && fy == 2 && (C == 1 || C == 3 || C == 4)) {
    return at::bitwise_right_shift(sum + 2, 2).to(at::kByte);
  }
  const float inv_area = 1.f / static_cast<float>(fx * fy);
  return at::round(sum.to(at::kFloat) * inv_area).clamp_(0, 255).to(at::kByte);
}

// Per output pixel, its (source, weight) entries as `m` rows of index/weight tensors (padded with
// weight 0, whose terms add exactly +0 to a non-negative sum).
std::pair<at::Tensor, at::Tensor> area_columns(int in, int out, const c10::Device& device) {
  const auto tab = resize_detail::area_table(in, out);
  std::vector<int> count(static_cast<std::size_t>(out), 0);
  for (const auto& e : tab) ++count[static_cast<std::size_t>(e.dst)];
  const int m = *std::max_element(count.begin(), count.end());
  at::Tensor i = at::zeros({m, out}, at::kLong), w = at::zeros({m, out}, at::kFloat);
  auto ia = i.accessor<int64_t, 2>();
  auto wa = w.accessor<float, 2>();
  std::fill(count.begin(), count.end(), 0);
  for (const auto& e : tab) {
    const int k = count[static_cast<std::size_t>(e.dst)]++;
    ia[k][e.dst] = e.src;
    wa[k][e.dst] = e.weight;
  }
  return {to_device(i, device), to_device(w, device)};
}

at::Tensor run_area_general(const at::Tensor& img, int64_t H, int64_t W) {
  const auto dev = img.device();
  const auto [xi, xw] = area_columns(static_cast<int>(img.size(1)), static_cast<int>(W), dev);
  const auto [yi, yw] = area_columns(static_cast<int>(img.size(0)), static_cast<int>(H), dev);
  // Horizontal: buf = ((s0 * a0) + s1 * a1) + ..., per source row.
  at::Tensor buf;
  for (int64_t k = 0; k < xi.size(0); ++k) {
    const at::Tensor term = img.index_select(1, xi[k]).to(at::kFloat) * xw[k].view({1, W, 1});
    buf = k == 0 ? term : buf + term;
  }
  // Vertical: sum = b0 * buf0, then sum += bk * bufk.
  at::Tensor sum;
  for (int64_t k = 0; k < yi.size(0); ++k) {
    const at::Tensor term = yw[k].view({H, 1, 1}) * buf.index_select(0, yi[k]);
    sum = k == 0 ? term : sum + term;
  }
  return at::round(sum).clamp_(0, 255).to(at::kByte);
}

}  // namespace

at::Tensor resize_tensor(const at::Tensor& img, int64_t H, int64_t W, Interp interp,
                         CubicFlavor flavor) {
  if (img.dim() != 3 || img.scalar_type() != at::kByte || img.size(2) < 1 || img.size(2) > 4 ||
      img.size(0) < 1 || img.size(1) < 1 || H < 1 || W < 1 || H > (1 << 30) || W > (1 << 30)) {
    throw Error(ErrorCode::kInternal, "resize_tensor needs a uint8 [h, w, C] image, C in 1..4");
  }
  const int h = static_cast<int>(img.size(0)), w = static_cast<int>(img.size(1));
  const int Hi = static_cast<int>(H), Wi = static_cast<int>(W);
  if (h == Hi && w == Wi) return img;
  const int fx = resize_detail::integer_factor(w, Wi), fy = resize_detail::integer_factor(h, Hi);
  if (interp == Interp::kLinear && fx == 2 && fy == 2) interp = Interp::kArea;
  switch (interp) {
    case Interp::kLinear:
      return run_fixed(img, resize_detail::linear_taps(w, Wi, true),
                       resize_detail::linear_taps(h, Hi, false), H, W);
    case Interp::kArea:
      if (resize_detail::scale_of(w, Wi) >= 1 && resize_detail::scale_of(h, Hi) >= 1) {
        if (fx > 0 && fy > 0) return run_area_integer(img, fx, fy, H, W);
        return run_area_general(img, H, W);
      }
      return run_fixed(img, resize_detail::area_mode_taps(w, Wi, true),
                       resize_detail::area_mode_taps(h, Hi, false), H, W);
    case Interp::kCubic:
      if (flavor == CubicFlavor::kWheel) {  // as resize_u8
        const resize_detail::IppPath path = resize_detail::wheel_ipp_path();
        if (path != resize_detail::IppPath::kOwn && w >= 4 && h >= 4) {
          return resize_detail::wheel_cubic_tensor(img, H, W, path);
        }
      }
      return run_fixed(img, resize_detail::cubic_taps(w, Wi), resize_detail::cubic_taps(h, Hi), H,
                       W);
  }
  return img;
}

}  // namespace sapiens_seg::core
