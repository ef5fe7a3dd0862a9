// fastbb: the ViT backbone's building blocks on the GPU.
//
//  - layer_norm (v1) and rms_norm (Sapiens2): one warp per token row, fp32 statistics whatever
//    the element type;
//  - Gemm::linear: cuBLASLt GEMMs for every Linear of the block, with the bias and the residual
//    add fused into the GEMM (the bias epilogue, and beta = 1 with the residual as C, which may
//    be the output itself). GELU: cuBLASLt's GELU epilogue is the tanh approximation while
//    Sapiens uses the exact erf form, so fc1 runs the bias epilogue followed by gelu_erf_ (one
//    extra pass over the hidden activation). The tanh epilogue stays selectable
//    (Activation::kGeluTanhEpilogue) so a GPU run can measure whether it still meets the parity
//    bars; the kernels Runner does not use it;
//  - swiglu: Sapiens2's gate between the w12 and w3 GEMMs, silu(gate) * up, one pass;
//  - scale_add_: Sapiens2's layer scale on the attention branch, x += y * gamma;
//  - qk_norm_rope_: Sapiens2's per-head q/k RMSNorm and 2D RoPE in one pass over the packed
//    qkv, in place, so cuDNN then reads Q, K and V from the same buffer;
//  - patches: the 16x16 stride-16 patch embedding's input as a [tokens, 3*16*16] matrix, so the
//    embedding is one GEMM (with the position embedding as its residual).
//
// Tensors are ATen tensors on one CUDA device; work is queued on the device's current stream.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/common.hpp"

namespace sapiens_seg::kernels {

// at::kFloat / kHalf / kBFloat16 -> DType; throws c10::Error for any other type.
DType to_dtype(at::ScalarType t);

}  // namespace sapiens_seg::kernels

namespace sapiens_seg::kernels::fastbb {

enum class Activation : std::uint8_t {
  kNone,
  kGeluErf,           // bias epilogue, then the exact-erf GELU kernel
  kGeluTanhEpilogue,  // cuBLASLt's GELU(_BIAS) epilogue (tanh approximation)
};

// Everything a cuBLASLt plan depends on. Row-major view: out[m, n] = x[m, k] . w[n, k]^T;
// ld* are row strides in elements; align_* the pointers' alignment in bytes (capped at 16),
// since cuBLASLt picks kernels by the alignment it is promised.
struct GemmKey {
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t ldx = 0, ldw = 0, ldc = 0, ldo = 0;
  DType dtype = DType::kF16;
  bool bias = false, residual = false;
  bool tanh_epilogue = false;
  std::uint8_t align_x = 0, align_w = 0, align_c = 0, align_o = 0, align_bias = 0;
  int device = 0;
  bool operator==(const GemmKey&) const = default;
};

struct GemmKeyHash {
  std::size_t operator()(const GemmKey& k) const noexcept;
};

// Checks the operands of Gemm::linear (shapes, dtypes, strides, devices) and returns the plan
// key. Throws c10::Error naming the offending operand. Pure host logic: runs on CPU tensors too
// (device placement is checked separately, by linear()).
GemmKey linear_key(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                   const at::Tensor& residual, Activation act, const at::Tensor& out);

// cuBLASLt handle, workspace and a plan cache for one device. Plan lookup and enqueue happen
// under one lock, but all calls share one workspace: queue them on one stream (the kernels
// Runner serialises its forward passes), never on concurrent streams.
class Gemm {
 public:
  explicit Gemm(c10::Device device, std::size_t workspace_bytes = std::size_t{32} << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out = x . w^T (+ bias) (+ residual), then `act`. x, residual, out: 2-D, unit column stride;
  // w: contiguous [N, K] (the nn.Linear layout); bias: contiguous [N]; undefined bias/residual
  // tensors mean none. `residual` may be `out` itself.
  void linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
              const at::Tensor& residual, Activation act, const at::Tensor& out);

  std::size_t plans_cached() const;

 private:
  struct Plan;
  Plan& plan_for(const GemmKey& key, const void* bias);

  c10::Device device_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  at::Tensor workspace_;
  mutable std::mutex mu_;
  std::unordered_map<GemmKey, std::unique_ptr<Plan>, GemmKeyHash> plans_;
};

// y = LayerNorm(x) over the last dim of a contiguous [M, C] x; w, b: [C]; out: [M, C] (may be x).
void layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                const at::Tensor& out);
// The argument checks of layer_norm (host only, for tests and for layer_norm itself).
void check_layer_norm_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                           const at::Tensor& out);

// x = GELU(x) (exact erf form) in place; x contiguous.
void gelu_erf_(const at::Tensor& x);

// [B, 3, H, W] -> [B * (H/p) * (W/p), 3 * p * p]: row t = token (patch row * (W/p) + patch
// column, image-major), columns in the order of a [C, 3, p, p] conv weight viewed as [C, 3*p*p].
// H and W must be multiples of p. A strided copy (works on any device).
at::Tensor patches(const at::Tensor& image, std::int64_t patch);

// y = RMSNorm(x) over the last dim of a contiguous [M, C] x; w: [C]; out: [M, C] (may be x).
void rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& out);
void check_rms_norm_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& out);

// x += y * gamma (per column) for contiguous [M, C] x and y and gamma [C]: the layer scale,
// applied as the eager module rounds it (a separate pass: folding gamma into the projection
// weight would push small-gamma products below float16's normal range).
void scale_add_(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gamma);
void check_scale_add_args(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gamma);

// out [M, F] = silu(h[:, :F]) * h[:, F:] for a contiguous h [M, 2F]; out contiguous.
void swiglu(const at::Tensor& h, const at::Tensor& out);
void check_swiglu_args(const at::Tensor& h, const at::Tensor& out);

// Sapiens2's q/k preparation, in place on a contiguous packed qkv [B, N, q_heads + 2 * k_heads,
// D] (queries, then keys, then values; D >= head_dim, the rest zero padding): RMSNorm of every
// query head with q_w and every key head with k_w (both [>= head_dim], first head_dim used),
// rounding to bfloat16, and for the tokens n >= prefix the RoPE rotation by the bfloat16 tables
// cos/sin [N - prefix, head_dim]; values and padding are untouched.
struct QkRope {
  std::int64_t q_heads = 0, k_heads = 0, head_dim = 0, prefix = 0;
  double eps = 1e-6;
};
void qk_norm_rope_(const at::Tensor& qkv, const at::Tensor& q_w, const at::Tensor& k_w,
                   const at::Tensor& cos, const at::Tensor& sin, const QkRope& p);
void check_qk_norm_rope_args(const at::Tensor& qkv, const at::Tensor& q_w, const at::Tensor& k_w,
                             const at::Tensor& cos, const at::Tensor& sin, const QkRope& p);

}  // namespace sapiens_seg::kernels::fastbb
