// Sapiens2 segmentation network (RMSNorm ViT with 2D RoPE and grouped-query attention, plus the
// four-stage deconvolution head) on ATen ops, weights by name.
// Architecture and numerics: the project's spec of Sapiens2 (sections 2-4 and 8).
#pragma once

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "../attention/rope.hpp"
#include "../checkpoint/tensor_map.hpp"
#include "../cpu/cpuid.hpp"
#include "../head/cpu_head.hpp"

namespace sapiens_seg::core::v2 {

struct Config {
  int64_t embed_dim = 0;                 // C
  int64_t depth = 0;                     // L
  int64_t heads = 0;                     // query heads
  int64_t head_dim = 0;                  // hd = C / heads (from the q/k-norm weight)
  int64_t mlp = 0;                       // F, the SwiGLU hidden width (w12 has 2F rows)
  int64_t patch = 0;                     // 16
  int64_t registers = 0;                 // storage tokens (8); the cls token comes on top
  std::vector<int64_t> kv_heads;         // per block: heads (MHA) or fewer (GQA)
  std::vector<int64_t> deconv_channels;  // (512, 256, 128, 64) in the released models
  std::vector<int64_t> conv_channels;    // (64, 64)
  int64_t num_classes = 0;               // 29
  bool periods_in_file = false;          // false: rebuilt in bf16 as the module initialises it
  int64_t input_h = 0, input_w = 0;      // network input (a multiple of the patch)

  int64_t prefix_tokens() const { return 1 + registers; }
};

struct ConfigHints {
  std::optional<int64_t> input_h, input_w;  // network input size (default 1024 x 768)
};

// Hugging Face transformers stores the same weights under other names (spec section 9), with
// the SwiGLU input projection split in two. Returns the tensors under the authors' names (views,
// plus one concatenation per block); a map already in the authors' naming is returned as is.
TensorMap to_original_names(const TensorMap& tensors);
bool has_hf_names(const TensorMap& tensors);

// Derives the hyper-parameters from tensor shapes (authors' names) and checks every tensor
// against them. Missing, unexpected, mis-shaped or non-float tensors are refused with one
// Error(kFormatError) that lists all of them.
Config infer_config(const TensorMap& tensors, const ConfigHints& hints);

// The RoPE periods as the authors' module holds them: the file's buffer rounded to bf16, or,
// when the file has none, 100^(2j / (hd/2)) evaluated in bf16 as the module's initialiser does.
at::Tensor rope_periods(const TensorMap& tensors, const Config& config);

// cos and sin tables [grid_h * grid_w, hd] in bf16 for a patch grid, with the op sequence (and
// so the bf16 roundings) of the authors' eager module on this device.
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& periods_bf16, int64_t grid_h,
                                              int64_t grid_w);

// RoPE's rotate-half over the last dim (attention/rope.hpp).
using attention::rotate_half;

class Network {
 public:
  // Copies the weights to `device` in `dtype` (one conversion each; the mapped file is only read).
  Network(const TensorMap& tensors, Config config, at::Device device, at::ScalarType dtype);

  // x: [B, 3, input_h, input_w] normalised RGB, any float dtype on any device; returns the logits
  // [B, classes, input_h, input_w] in the network dtype on its device. The stages below, in order:
  // embed, blocks [0, depth), final_norm, head.
  at::Tensor forward(const at::Tensor& x) const;
  at::Device device() const { return device_; }
  const head::CpuHead& cpu_head() const { return cpu_head_; }  // empty off the CPU

  const Config& config() const { return config_; }

  // ---- forward's stages, public so that parity tests can hold each one to the reference --------
  // Tokens are [B, 1 + registers + grid_h * grid_w, C] in the network dtype on its device.

  // Checks x as forward does; the patch embedding behind the cls and storage tokens.
  at::Tensor embed(const at::Tensor& x) const;
  // Transformer blocks [first, end) on the tokens.
  at::Tensor blocks(at::Tensor tokens, size_t first, size_t end) const;
  at::Tensor final_norm(const at::Tensor& tokens) const;
  // The head forward runs: the CPU's fused head where there is one, else the module's ops
  // (featmap, every head_stage, classify).
  at::Tensor head(at::Tensor tokens) const;
  // The head as the authors' module runs it, one op group at a time: the patch tokens as a map
  // [B, C, grid_h, grid_w]; stage s < head_stages() (the deconvolutions, then the 1x1
  // convolutions, each followed by InstanceNorm and SiLU); the classifier (conv_seg).
  at::Tensor featmap(const at::Tensor& tokens) const;
  size_t head_stages() const { return deconv_w_.size() + conv_w_.size(); }
  at::Tensor head_stage(size_t s, const at::Tensor& x) const;
  at::Tensor classify(const at::Tensor& x) const;
  // The bf16 RoPE tables [grid_h * grid_w, hd] of the configured input grid.
  const at::Tensor& rope_cos() const { return rope_cos_; }
  const at::Tensor& rope_sin() const { return rope_sin_; }

 private:
  struct Block {
    at::Tensor ln1_w, wq_w, wq_b, wk_w, wk_b, wv_w, wv_b, q_norm_w, k_norm_w, proj_w, proj_b, gamma,
        ln2_w, w12_w, w12_b, w3_w, w3_b;
    int64_t kv_heads = 0;
  };
  struct Pass;  // what one call's blocks share (sapiens2.cpp)
  at::Tensor block(const Block& b, at::Tensor x, Pass& pass) const;
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const Pass& pass) const;
  void add_mlp_chunked(const Block& b, const at::Tensor& h, const at::Tensor& x, Pass& pass) const;
  // float32 and bfloat16 on the CPU with the memory-bound passes fused (sapiens2.cpp).
  at::Tensor blocks_fused(const at::Tensor& x, size_t first, size_t end, Pass& pass) const;
  at::Tensor block_fused(const Block& b, const at::Tensor& x, const at::Tensor& next_ln1,
                         Pass& pass) const;

  Config config_;
  at::ScalarType dtype_;
  at::Device device_;
  at::Tensor patch_w_, patch_b_, prefix_;  // prefix_: [1, 1 + registers, C] (cls, storage)
  at::Tensor rope_cos_, rope_sin_;         // bf16 tables for the configured input grid
  std::vector<Block> blocks_;
  at::Tensor ln_w_;
  std::vector<at::Tensor> deconv_w_, conv_w_, conv_b_;  // the head as stored (the module's ops)
  at::Tensor seg_w_, seg_b_;
  head::CpuHead cpu_head_;  // the same head on the CPU, fused (empty elsewhere)
};

// The float32 MLP's column chunk width for a CPU (0: w12 whole), SAPIENS_SEG_CPU_MLP_COLUMNS
// unset; the chunks are used only where the BLAS gives them the whole GEMM's bits (below).
int64_t mlp_columns_for(const CpuFeatures& cpu);

// Whether the float32 MLP's w12 GEMM, [M, K] x [K, N] at `threads` threads, gave chunks of
// `width` output columns the whole GEMM's bits when a fused call of this process first ran that
// shape (Network::blocks then computes w12 by chunks); nullopt before any call at the shape.
std::optional<bool> mlp_column_split_exact(int64_t M, int64_t K, int64_t N, int64_t width,
                                           int64_t threads);

}  // namespace sapiens_seg::core::v2
