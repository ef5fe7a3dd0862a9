// Sapiens v1 as the kernels backend runs it: the weights repacked once (head dims padded for
// cuDNN in the qkv and projection weights, the position embedding at the input grid, the head in
// seg_up's layout) and one schedule of steps over them. Each step goes through KernelOps
// (../kernel_ops.hpp), so the same schedule runs on the CUDA kernels and on ATen reference ops,
// which is how a CPU test holds the repacking and the schedule to the portable network.
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
#include "vit_seg.hpp"

namespace sapiens_seg::core::v1::kernels_schedule {

struct Block {
  at::Tensor ln1_w, ln1_b;
  at::Tensor qkv_w, qkv_b;    // [3 * H * hdp, C], each head padded
  at::Tensor proj_w, proj_b;  // columns padded: [C, H * hdp]
  at::Tensor ln2_w, ln2_b;
  at::Tensor fc1_w, fc1_b, fc2_w, fc2_b;
};

struct Weights {
  std::int64_t head_dim = 0, padded_head_dim = 0;
  at::Tensor patch_w, patch_b;  // [C, 3 * p * p] (fastbb::patches' column order), [C]
  at::Tensor pos;               // [grid_h * grid_w, C] at the input grid
  std::vector<Block> blocks;
  at::Tensor ln_w, ln_b;
  kernels::seg_up::HeadWeights head;
};

// Converts each tensor on the host and uploads it once in `dtype`.
Weights prepare(const TensorMap& tensors, const Config& config, c10::Device device,
                at::ScalarType dtype);

// x [B, 3, input_h, input_w] (any float dtype, any device) -> logits [B, K, input_h / 2,
// input_w / 2] as a view of a channels-last tensor, in the weights' dtype on their device.
at::Tensor forward(const Weights& w, const Config& config, KernelOps& ops, const at::Tensor& x);

// forward() in its two halves, which the speed check times apart: the backbone up to its final
// LayerNorm (features [B * gh * gw, C]), and the decoder head over those features.
at::Tensor backbone(const Weights& w, const Config& config, KernelOps& ops, const at::Tensor& x);
at::Tensor head(const Weights& w, const Config& config, KernelOps& ops, const at::Tensor& feat,
                std::int64_t batch);

// The fused-attention configuration of one image's pass (batch 1) in `dtype` on CUDA device
// `device`: the kernels runner has cuDNN check it when the model loads.
std::vector<kernels::cudnn_hacc::SdpaKey> attention_keys(const Weights& w, const Config& config,
                                                         at::ScalarType dtype, int device);

}  // namespace sapiens_seg::core::v1::kernels_schedule
