// The steps the kernels backend's schedules are written in (v1/kernels_schedule.cpp and
// v2/kernels_schedule.cpp), as an interface: kernels_runner.cpp runs them on the CUDA kernels,
// aten_kernel_ops() on ATen ops with the portable networks' roundings. So a CPU test holds each
// schedule and its repacked weights to the portable network, and a GPU test holds each kernel
// to the ATen step it replaces.
//
// Compiled into kernels builds only (it names the kernels' types).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <ATen/Tensor.h>

#include "checkpoint/tensor_map.hpp"
#include "kernels/fastbb/fastbb.hpp"
#include "kernels/seg_up/head.hpp"

namespace sapiens_seg::core {

class KernelOps {
 public:
  KernelOps() = default;
  virtual ~KernelOps() = default;
  KernelOps(const KernelOps&) = delete;
  KernelOps& operator=(const KernelOps&) = delete;

  // out = LayerNorm(x) / RMSNorm(x) over the last dim of [M, C]; out may be x.
  virtual void layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                          const at::Tensor& out) = 0;
  virtual void rms_norm(const at::Tensor& x, const at::Tensor& w, double eps,
                        const at::Tensor& out) = 0;
  // out = x . w^T + b (+ residual), then `act` (kNone or kGeluErf); out may alias the residual.
  virtual void linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                      const at::Tensor& residual, kernels::fastbb::Activation act,
                      const at::Tensor& out) = 0;
  // out [B, N, H, D] = attention of a packed qkv [B, N, H + 2*Hk, D] (Hk key/value heads).
  virtual void attention(const at::Tensor& qkv, const at::Tensor& out, float scale) = 0;
  // Sapiens2: in place on qkv [B, N, H + 2*kv, hdp], per-head RMSNorm of q and k, then the
  // bfloat16 RoPE on the patch tokens (the first `prefix` tokens are only rounded).
  virtual void qk_norm_rope(const at::Tensor& qkv, const at::Tensor& q_w, const at::Tensor& k_w,
                            const at::Tensor& cos, const at::Tensor& sin,
                            const kernels::fastbb::QkRope& p) = 0;
  // Sapiens2: x += y * gamma (per column), each op rounded to the dtype.
  virtual void scale_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gamma) = 0;
  // Sapiens2: out [M, F] = silu(h[:, :F]) * h[:, F:].
  virtual void swiglu(const at::Tensor& h, const at::Tensor& out) = 0;
  // The decoder head: feat [gh * gw, C] -> logits [u*gh * u*gw, Kp] channels-last.
  virtual at::Tensor head(const kernels::seg_up::HeadWeights& w, const at::Tensor& feat,
                          std::int64_t gh, std::int64_t gw) = 0;
};

// Every step on ATen ops (any device, any float dtype).
std::unique_ptr<KernelOps> aten_kernel_ops();

// Every step on the CUDA kernels of `device`, with a cuBLASLt and cuDNN state of its own (the
// kernels runner's, for a schedule run outside a Runner: the speed check's backbone/head split).
// Defined in kernels_runner.cpp.
std::unique_ptr<KernelOps> cuda_kernel_ops(c10::Device device);

// The decode head's weights by the names both families use (`decode_head.deconv_layers.{3s}`,
// `decode_head.conv_layers.{3s}`, `decode_head.conv_seg`), in seg_up's layout on `device`.
kernels::seg_up::HeadWeights prepare_head_weights(const TensorMap& tensors, std::size_t deconvs,
                                                  std::size_t convs, c10::Device device,
                                                  at::ScalarType dtype);

// Throws Error(kInvalidInput) unless x is [B, 3, input_h, input_w] with B >= 1: the schedules'
// one check of their input.
void check_network_input(const at::Tensor& x, std::int64_t input_h, std::int64_t input_w);

}  // namespace sapiens_seg::core
