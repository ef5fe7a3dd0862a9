// Sapiens2 as the kernels backend runs it: the weights repacked once (q, k and v projections in
// one GEMM weight, head dims padded for cuDNN, the head in seg_up's layout) and one schedule of
// steps over them. Each step goes through Ops, so the same schedule runs on the CUDA kernels
// (kernels_runner.cpp) and on ATen reference ops (any device), which is how a CPU test holds the
// repacking and the schedule to the portable network without a GPU.
//
// Compiled into kernels builds only (it uses the kernels' host-side helpers).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "../checkpoint.hpp"
#include "kernels/seg_up/head.hpp"
#include "sapiens2.hpp"

namespace sapiens_seg::core::v2::kernels_schedule {

struct Block {
  at::Tensor ln1_w;
  at::Tensor qkv_w, qkv_b;        // [(H + 2*kv) * hdp, C]: wq, wk, wv rows, each head padded
  at::Tensor q_norm_w, k_norm_w;  // [hd]
  at::Tensor proj_w, proj_b;      // columns padded: [C, H * hdp]
  at::Tensor gamma;               // [C], the layer scale of the attention branch
  at::Tensor ln2_w;
  at::Tensor w12_w, w12_b, w3_w, w3_b;
  std::int64_t kv_heads = 0;
};

struct Weights {
  std::int64_t head_dim = 0, padded_head_dim = 0;
  at::Tensor patch_w, patch_b;    // [C, 3 * p * p] (fastbb::patches' column order), [C]
  at::Tensor prefix;              // [1 + registers, C]: cls, then the storage tokens
  at::Tensor rope_cos, rope_sin;  // bfloat16 [grid_h * grid_w, hd]
  std::vector<Block> blocks;
  at::Tensor ln_w;
  kernels::seg_up::HeadWeights head;
};

// Converts each tensor on the host and uploads it once in `dtype`.
Weights prepare(const TensorMap& tensors, const Config& config, c10::Device device,
                at::ScalarType dtype);

// The steps of the schedule. Shapes as in the kernels they stand for (fastbb, cudnn_hacc,
// seg_up); `out` may alias the residual.
class Ops {
 public:
  virtual ~Ops() = default;
  virtual void rms_norm(const at::Tensor& x, const at::Tensor& w, double eps,
                        const at::Tensor& out) = 0;
  // out = x . w^T + b (+ residual)
  virtual void linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                      const at::Tensor& residual, const at::Tensor& out) = 0;
  // In place on qkv [B, N, H + 2*kv, hdp]: per-head RMSNorm of q and k, bf16 RoPE on patch tokens.
  virtual void qk_norm_rope(const at::Tensor& qkv, std::int64_t q_heads, std::int64_t kv_heads,
                            std::int64_t head_dim, const at::Tensor& q_w, const at::Tensor& k_w,
                            const at::Tensor& cos, const at::Tensor& sin, std::int64_t prefix,
                            double eps) = 0;
  // out [B, N, H, hdp] = attention of the packed qkv (grouped key/value heads), scale given.
  virtual void attention(const at::Tensor& qkv, const at::Tensor& out, float scale) = 0;
  // x += y * gamma (per column), each op rounded to the dtype
  virtual void scale_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gamma) = 0;
  // out [M, F] = silu(h[:, :F]) * h[:, F:]
  virtual void swiglu(const at::Tensor& h, const at::Tensor& out) = 0;
  // feat [gh * gw, C] -> logits [u*gh * u*gw, Kp] channels-last
  virtual at::Tensor head(const kernels::seg_up::HeadWeights& w, const at::Tensor& feat,
                          std::int64_t gh, std::int64_t gw) = 0;
};

// Every step on ATen ops, rounding as the portable network does (any device, any float dtype).
std::unique_ptr<Ops> aten_ops();

// x [B, 3, input_h, input_w] (any float dtype, any device) -> logits [B, K, input_h, input_w] as
// a view of a channels-last tensor, in the weights' dtype on their device.
at::Tensor forward(const Weights& w, const Config& config, Ops& ops, const at::Tensor& x);

}  // namespace sapiens_seg::core::v2::kernels_schedule
