// Sapiens v1 segmentation network (ViT backbone + VitHead) on ATen ops, weights by name.
// Architecture facts: the project's spec of Sapiens v1 (sections 1-3, 8, 9).
#pragma once

#include <optional>
#include <string>

#include <ATen/ATen.h>

#include "../checkpoint/torchscript.hpp"
#include "../head/cpu_head.hpp"

namespace sapiens_seg::core::v1 {

struct Config {
  int64_t embed_dim = 0;  // C
  int64_t depth = 0;      // L
  int64_t heads = 0;
  int64_t mlp = 0;                   // F (4C in the released models)
  int64_t patch = 0;                 // 16
  int64_t head_channels = 0;         // 768 in the released models
  int64_t num_classes = 0;           // 28
  int64_t tokens = 0;                // N of the stored position embedding
  int64_t grid_h = 0, grid_w = 0;    // training grid of the position embedding
  int64_t input_h = 0, input_w = 0;  // network input (a multiple of the patch)

  int64_t head_dim() const { return embed_dim / heads; }
};

struct ConfigHints {
  std::optional<int64_t> heads;             // from the card or the traced graph
  std::optional<int64_t> grid_h, grid_w;    // from the card's input size
  std::optional<int64_t> input_h, input_w;  // requested network input size
};

// Derives the hyper-parameters from tensor shapes and checks every tensor against them. A
// checkpoint with missing, unexpected, mis-shaped or non-float tensors is refused with one
// Error(kFormatError) that lists all of them.
Config infer_config(const TensorMap& tensors, const ConfigHints& hints);

class Network {
 public:
  // Copies the weights to `device` in `dtype` (one conversion, no fp32 copy kept there).
  Network(const TensorMap& tensors, Config config, at::Device device, at::ScalarType dtype);

  // x: [B, 3, input_h, input_w] normalised RGB, any float dtype on any device; returns the logits
  // [B, classes, input_h / 2, input_w / 2] in the network dtype on its device.
  at::Tensor forward(const at::Tensor& x) const;
  at::Device device() const { return device_; }
  const head::CpuHead& cpu_head() const { return cpu_head_; }  // empty off the CPU

  const Config& config() const { return config_; }

 private:
  // feat: [B, gh * gw, C] after the final LayerNorm; returns the logits [B, classes, 8gh, 8gw].
  // The CPU runs cpu_head_ instead (head/cpu_head.hpp).
  at::Tensor head_generic(const at::Tensor& feat, int64_t gh, int64_t gw) const;

  struct Block {
    at::Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  Config config_;
  at::ScalarType dtype_;
  at::Device device_;
  at::Tensor patch_w_, patch_b_, pos_embed_;  // pos_embed_ already at the input grid
  std::vector<Block> blocks_;
  at::Tensor ln_w_, ln_b_;
  head::CpuHead cpu_head_;          // on the CPU
  head::HeadWeights generic_head_;  // elsewhere, as stored
};

}  // namespace sapiens_seg::core::v1
