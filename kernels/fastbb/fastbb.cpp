// fastbb host side: argument checks and launches of the LayerNorm and GELU kernels, and the
// patch matrix of the embedding.
#include "kernels/fastbb/fastbb.hpp"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

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
