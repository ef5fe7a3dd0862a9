// Sapiens2 as the kernels backend runs it: the weights repacked once (q, k and v projections in
// one GEMM weight, head dims padded for cuDNN, the head in seg_up's layout) and one schedule of
// steps over them. Each step goes through KernelOps (../kernel_ops.hpp), so the same schedule
// runs on the CUDA kernels and on ATen reference ops (any device), which is how a CPU test holds
// the repacking and the schedule to the portable network without a GPU.
//
// Compiled into kernels builds only (it uses the kernels' host-side helpers).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "../checkpoint/torchscript.hpp"
#include "../kernel_ops.hpp"
#include "kernels/cudnn_hacc/attention.hpp"
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

// x [B, 3, input_h, input_w] (any float dtype, any device) -> logits [B, K, input_h, input_w] as
// a view of a channels-last tensor, in the weights' dtype on their device.
at::Tensor forward(const Weights& w, const Config& config, KernelOps& ops, const at::Tensor& x);

// The fused-attention configurations of one image's pass (batch 1; one per distinct key/value
// head count) in `dtype` on CUDA device `device`: the kernels runner has cuDNN check them when
// the model loads.
std::vector<kernels::cudnn_hacc::SdpaKey> attention_keys(const Weights& w, const Config& config,
                                                         at::ScalarType dtype, int device);

}  // namespace sapiens_seg::core::v2::kernels_schedule
