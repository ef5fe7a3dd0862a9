// fastbb host side: argument checks and launches of the normalisation, activation and RoPE
// kernels, and the patch matrix of the embedding.
#include "kernels/fastbb/fastbb.hpp"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <initializer_list>

#include "kernels/fastbb/launch.hpp"

namespace sapiens_seg::kernels {

DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::kF32;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    default:
      break;
  }
  TORCH_CHECK(false, "kernels: element type ", t,
              " is not supported (float32, float16 or bfloat16)");
}

}  // namespace sapiens_seg::kernels

namespace sapiens_seg::kernels::fastbb {

void check_layer_norm_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                           const at::Tensor& out) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(),
              "layer_norm: x must be a contiguous [M, C] "
              "matrix, got sizes ",
              x.sizes(), " strides ", x.strides());
  const int64_t C = x.size(1);
  TORCH_CHECK(C > 0, "layer_norm: x has no columns");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == C && w.is_contiguous(),
              "layer_norm: weight must be contiguous [", C, "], got ", w.sizes());
  TORCH_CHECK(b.dim() == 1 && b.size(0) == C && b.is_contiguous(),
              "layer_norm: bias must be contiguous [", C, "], got ", b.sizes());
  TORCH_CHECK(out.sizes() == x.sizes() && out.is_contiguous(),
              "layer_norm: out must be contiguous ", x.sizes(), ", got ", out.sizes());
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && b.scalar_type() == x.scalar_type() &&
                  out.scalar_type() == x.scalar_type(),
              "layer_norm: x, weight, bias and out must share one dtype (x is ", x.scalar_type(),
              ")");
  (void)to_dtype(x.scalar_type());
  TORCH_CHECK(x.device() == w.device() && x.device() == b.device() && x.device() == out.device(),
              "layer_norm: all operands must be on one device");
}

void layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                const at::Tensor& out) {
  check_layer_norm_args(x, w, b, out);
  TORCH_CHECK(x.is_cuda(), "layer_norm: operands must be CUDA tensors, got ", x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  launch_layer_norm(to_dtype(x.scalar_type()), x.const_data_ptr(), w.const_data_ptr(),
                    b.const_data_ptr(), out.data_ptr(), x.size(0), x.size(1),
                    static_cast<float>(eps), at::cuda::getCurrentCUDAStream());
}

void gelu_erf_(const at::Tensor& x) {
  TORCH_CHECK(x.is_contiguous(), "gelu_erf_: x must be contiguous");
  const DType t = to_dtype(x.scalar_type());
  TORCH_CHECK(x.is_cuda(), "gelu_erf_: x must be a CUDA tensor, got ", x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  launch_gelu_erf(t, x.data_ptr(), x.numel(), at::cuda::getCurrentCUDAStream());
}

namespace {

void same_device_and_type(const char* op, const at::Tensor& x,
                          std::initializer_list<const at::Tensor*> others) {
  (void)to_dtype(x.scalar_type());
  for (const at::Tensor* t : others) {
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), op, ": every operand must be ",
                x.scalar_type(), ", got ", t->scalar_type());
    TORCH_CHECK(t->device() == x.device(), op, ": all operands must be on one device");
  }
}

}  // namespace

void check_rms_norm_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& out) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) > 0,
              "rms_norm: x must be a contiguous [M, C] matrix, got sizes ", x.sizes(), " strides ",
              x.strides());
  const int64_t C = x.size(1);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == C && w.is_contiguous(),
              "rms_norm: weight must be contiguous [", C, "], got ", w.sizes());
  TORCH_CHECK(out.sizes() == x.sizes() && out.is_contiguous(), "rms_norm: out must be contiguous ",
              x.sizes(), ", got ", out.sizes());
  same_device_and_type("rms_norm", x, {&w, &out});
}

void rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& out) {
  check_rms_norm_args(x, w, out);
  TORCH_CHECK(x.is_cuda(), "rms_norm: operands must be CUDA tensors, got ", x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  launch_rms_norm(to_dtype(x.scalar_type()), x.const_data_ptr(), w.const_data_ptr(), out.data_ptr(),
                  x.size(0), x.size(1), static_cast<float>(eps), at::cuda::getCurrentCUDAStream());
}

void check_scale_add_args(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gamma) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(),
              "scale_add_: x must be a contiguous [M, C] matrix, got ", x.sizes());
  TORCH_CHECK(y.sizes() == x.sizes() && y.is_contiguous(), "scale_add_: y must be contiguous ",
              x.sizes(), ", got ", y.sizes());
  TORCH_CHECK(gamma.dim() == 1 && gamma.size(0) == x.size(1) && gamma.is_contiguous(),
              "scale_add_: gamma must be contiguous [", x.size(1), "], got ", gamma.sizes());
  same_device_and_type("scale_add_", x, {&y, &gamma});
}

void scale_add_(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gamma) {
  check_scale_add_args(x, y, gamma);
  TORCH_CHECK(x.is_cuda(), "scale_add_: operands must be CUDA tensors, got ", x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  launch_scale_add(to_dtype(x.scalar_type()), x.data_ptr(), y.const_data_ptr(),
                   gamma.const_data_ptr(), x.size(0), x.size(1), at::cuda::getCurrentCUDAStream());
}

void check_swiglu_args(const at::Tensor& h, const at::Tensor& out) {
  TORCH_CHECK(h.dim() == 2 && h.is_contiguous() && h.size(1) % 2 == 0,
              "swiglu: h must be a contiguous [M, 2F] matrix, got ", h.sizes());
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.size(0) == h.size(0) &&
                  out.size(1) * 2 == h.size(1),
              "swiglu: out must be a contiguous [", h.size(0), ", ", h.size(1) / 2,
              "] matrix, got ", out.sizes());
  same_device_and_type("swiglu", h, {&out});
}

void swiglu(const at::Tensor& h, const at::Tensor& out) {
  check_swiglu_args(h, out);
  TORCH_CHECK(h.is_cuda(), "swiglu: operands must be CUDA tensors, got ", h.device());
  const c10::cuda::CUDAGuard guard(h.device());
  launch_swiglu(to_dtype(h.scalar_type()), h.const_data_ptr(), out.data_ptr(), h.size(0),
                out.size(1), at::cuda::getCurrentCUDAStream());
}

void check_qk_norm_rope_args(const at::Tensor& qkv, const at::Tensor& q_w, const at::Tensor& k_w,
                             const at::Tensor& cos, const at::Tensor& sin, const QkRope& p) {
  TORCH_CHECK(qkv.dim() == 4 && qkv.is_contiguous(),
              "qk_norm_rope: qkv must be a contiguous [B, N, slots, D] tensor, got ", qkv.sizes());
  const int64_t N = qkv.size(1), slots = qkv.size(2), D = qkv.size(3);
  TORCH_CHECK(p.q_heads > 0 && p.k_heads > 0 && slots == p.q_heads + 2 * p.k_heads,
              "qk_norm_rope: ", slots, " head slots for ", p.q_heads, " query and ", p.k_heads,
              " key/value heads (expected q + 2 kv)");
  TORCH_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0 && p.head_dim <= D, "qk_norm_rope: head dim ",
              p.head_dim, " must be even and at most the slot width ", D);
  TORCH_CHECK(p.prefix >= 0 && p.prefix < N, "qk_norm_rope: ", p.prefix, " prefix tokens of ", N);
  for (const at::Tensor* w : {&q_w, &k_w}) {
    TORCH_CHECK(w->dim() == 1 && w->size(0) >= p.head_dim && w->is_contiguous(),
                "qk_norm_rope: the norm weights must be contiguous [>= ", p.head_dim, "], got ",
                w->sizes());
  }
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->dim() == 2 && t->size(0) == N - p.prefix && t->size(1) == p.head_dim &&
                    t->is_contiguous() && t->scalar_type() == at::kBFloat16,
                "qk_norm_rope: the RoPE tables must be contiguous bfloat16 [", N - p.prefix, ", ",
                p.head_dim, "], got ", t->scalar_type(), " ", t->sizes());
    TORCH_CHECK(t->device() == qkv.device(), "qk_norm_rope: all operands must be on one device");
  }
  same_device_and_type("qk_norm_rope", qkv, {&q_w, &k_w});
}

void qk_norm_rope_(const at::Tensor& qkv, const at::Tensor& q_w, const at::Tensor& k_w,
                   const at::Tensor& cos, const at::Tensor& sin, const QkRope& p) {
  check_qk_norm_rope_args(qkv, q_w, k_w, cos, sin, p);
  TORCH_CHECK(qkv.is_cuda(), "qk_norm_rope: operands must be CUDA tensors, got ", qkv.device());
  const c10::cuda::CUDAGuard guard(qkv.device());
  launch_qk_norm_rope(
      to_dtype(qkv.scalar_type()), qkv.data_ptr(), q_w.const_data_ptr(), k_w.const_data_ptr(),
      cos.const_data_ptr(), sin.const_data_ptr(), qkv.size(0) * qkv.size(1),
      static_cast<int>(p.q_heads), static_cast<int>(p.k_heads), static_cast<int>(qkv.size(2)),
      static_cast<int>(qkv.size(3)), static_cast<int>(p.head_dim), static_cast<int>(qkv.size(1)),
      static_cast<int>(p.prefix), static_cast<float>(p.eps), at::cuda::getCurrentCUDAStream());
}

at::Tensor patches(const at::Tensor& image, std::int64_t patch) {
  TORCH_CHECK(image.dim() == 4 && image.size(1) == 3, "patches: image must be [B, 3, H, W], got ",
              image.sizes());
  TORCH_CHECK(patch > 0 && image.size(2) % patch == 0 && image.size(3) % patch == 0,
              "patches: H and W (", image.size(2), "x", image.size(3),
              ") must be multiples of the patch size ", patch);
  const int64_t B = image.size(0), gh = image.size(2) / patch, gw = image.size(3) / patch;
  // [B, 3, gh, p, gw, p] -> [B, gh, gw, 3, p, p]: one row per token, (channel, ky, kx) columns.
  return image.reshape({B, 3, gh, patch, gw, patch})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({B * gh * gw, 3 * patch * patch});
}

}  // namespace sapiens_seg::kernels::fastbb
