#include "vit_seg.hpp"

#include <cmath>
#include <functional>
#include <numeric>
#include <sstream>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "../attention/cpu_attention.hpp"
#include "../checkpoint/layout.hpp"
#include "../cpu/gemm.hpp"
#include "../cpu/row_chunks.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core::v1 {
namespace {

constexpr double kLayerNormEps = 1e-6;     // every LayerNorm of the backbone
constexpr double kInstanceNormEps = 1e-5;  // InstanceNorm2d defaults in the head

[[noreturn]] void refuse(const std::string& what) {
  throw Error(ErrorCode::kFormatError, "not a Sapiens v1 segmentation checkpoint: " + what);
}

const at::Tensor& need(const TensorMap& t, const std::string& key) {
  auto it = t.find(key);
  if (it == t.end()) refuse("tensor '" + key + "' is missing");
  return it->second;
}

bool is_ignored(const std::string& key) {
  // Buffers of the authors' SegDataPreProcessor: kept by TorchScript, never used by forward.
  return key == "data_preprocessor.mean" || key == "data_preprocessor.std";
}

}  // namespace

Config infer_config(const TensorMap& tensors, const ConfigHints& hints) {
  Config c;
  const auto& pos = need(tensors, "backbone.pos_embed");
  const auto& pw = need(tensors, "backbone.patch_embed.projection.weight");
  if (pos.dim() != 3 || pw.dim() != 4) refuse("unexpected rank of pos_embed or patch projection");
  c.embed_dim = pos.size(2);
  c.tokens = pos.size(1);
  c.patch = pw.size(2);
  for (const auto& [key, value] : tensors) {
    const std::string prefix = "backbone.layers.";
    if (key.rfind(prefix, 0) != 0) continue;
    const auto dot = key.find('.', prefix.size());
    try {
      c.depth = std::max<int64_t>(c.depth, std::stoll(key.substr(prefix.size(), dot)) + 1);
    } catch (const std::exception&) {
      refuse("unexpected tensor name '" + key + "'");
    }
  }
  if (c.depth == 0) refuse("no transformer blocks (backbone.layers.*)");
  if (auto it = tensors.find("backbone.layers.0.ffn.layers.0.0.weight"); it != tensors.end()) {
    c.mlp = it->second.size(0);
  } else {
    c.mlp = 4 * c.embed_dim;
  }
  c.head_channels = need(tensors, "decode_head.deconv_layers.0.weight").size(1);
  c.num_classes = need(tensors, "decode_head.conv_seg.weight").size(0);

  if (!hints.heads) {
    refuse(
        "the attention head count is not in the tensor shapes and neither the traced graph nor "
        "a model card gives it");
  }
  c.heads = *hints.heads;
  if (c.heads <= 0 || c.embed_dim % c.heads != 0) {
    refuse("embed dim " + std::to_string(c.embed_dim) + " is not divisible by " +
           std::to_string(c.heads) + " heads");
  }

  // The training grid: the card's input size when known, else the 4:3 (H:W) portrait grid of
  // the released models (64x48 = 3072 tokens).
  if (hints.grid_h && hints.grid_w) {
    c.grid_h = *hints.grid_h;
    c.grid_w = *hints.grid_w;
  } else {
    c.grid_h = std::llround(std::sqrt(static_cast<double>(c.tokens) * 4.0 / 3.0));
    c.grid_w = c.grid_h > 0 ? c.tokens / c.grid_h : 0;
  }
  if (c.grid_h * c.grid_w != c.tokens) {
    refuse("position embedding has " + std::to_string(c.tokens) + " tokens, which is not a " +
           std::to_string(c.grid_h) + "x" + std::to_string(c.grid_w) +
           " grid; give the input size (card or input_height/input_width)");
  }
  c.input_h = hints.input_h.value_or(c.grid_h * c.patch);
  c.input_w = hints.input_w.value_or(c.grid_w * c.patch);
  if (c.input_h % c.patch != 0 || c.input_w % c.patch != 0 || c.input_h < c.patch ||
      c.input_w < c.patch) {
    throw Error(ErrorCode::kInvalidInput, "network input size " + std::to_string(c.input_h) + "x" +
                                              std::to_string(c.input_w) +
                                              " must be a positive multiple of the patch size " +
                                              std::to_string(c.patch));
  }

  // The complete expected layout, then one report of everything that differs.
  const int64_t C = c.embed_dim, F = c.mlp, HC = c.head_channels, K = c.num_classes;
  Layout want = {
      {"backbone.pos_embed", {1, c.tokens, C}},
      {"backbone.patch_embed.projection.weight", {C, 3, c.patch, c.patch}},
      {"backbone.patch_embed.projection.bias", {C}},
      {"backbone.ln1.weight", {C}},
      {"backbone.ln1.bias", {C}},
      {"decode_head.conv_seg.weight", {K, HC, 1, 1}},
      {"decode_head.conv_seg.bias", {K}},
      {"decode_head.deconv_layers.0.weight", {C, HC, 4, 4}},
      {"decode_head.deconv_layers.3.weight", {HC, HC, 4, 4}},
      {"decode_head.deconv_layers.6.weight", {HC, HC, 4, 4}},
  };
  for (int i : {0, 3, 6}) {
    const std::string p = "decode_head.conv_layers." + std::to_string(i);
    want[p + ".weight"] = {HC, HC, 1, 1};
    want[p + ".bias"] = {HC};
  }
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    want[p + "ln1.weight"] = {C};
    want[p + "ln1.bias"] = {C};
    want[p + "attn.qkv.weight"] = {3 * C, C};
    want[p + "attn.qkv.bias"] = {3 * C};
    want[p + "attn.proj.weight"] = {C, C};
    want[p + "attn.proj.bias"] = {C};
    want[p + "ln2.weight"] = {C};
    want[p + "ln2.bias"] = {C};
    want[p + "ffn.layers.0.0.weight"] = {F, C};
    want[p + "ffn.layers.0.0.bias"] = {F};
    want[p + "ffn.layers.1.weight"] = {C, F};
    want[p + "ffn.layers.1.bias"] = {C};
  }
  const std::string report = layout_mismatches(tensors, want, is_ignored);
  if (!report.empty()) {
    std::ostringstream os;
    os << "the tensors do not match the layout derived from the checkpoint (embed " << C
       << ", depth " << c.depth << ", mlp " << F << ", head " << HC << ", classes " << K << ")"
       << report;
    refuse(os.str());
  }
  return c;
}

Network::Network(const TensorMap& t, Config config, at::Device device, at::ScalarType dtype)
    : config_(config), dtype_(dtype), device_(device) {
  c10::InferenceMode guard;
  // One conversion from the stored tensor (a view of the mapped file) straight to the target
  // dtype and device; float32 on the CPU keeps the view itself, so no copy is made at all.
  auto get = [&](const std::string& key) {
    return t.at(key).to(device, dtype, /*non_blocking=*/false, /*copy=*/false).contiguous();
  };
  patch_w_ = get("backbone.patch_embed.projection.weight");
  patch_b_ = get("backbone.patch_embed.projection.bias");

  // The position embedding is stored for the training grid. Another input grid gets a bicubic
  // resize (align_corners=False, in fp32), as the authors' eager model does; done once here.
  at::Tensor pos = t.at("backbone.pos_embed").to(at::kFloat);
  const int64_t gh = config_.input_h / config_.patch, gw = config_.input_w / config_.patch;
  if (gh != config_.grid_h || gw != config_.grid_w) {
    pos = pos.reshape({1, config_.grid_h, config_.grid_w, config_.embed_dim}).permute({0, 3, 1, 2});
    pos = at::upsample_bicubic2d(pos, {gh, gw}, /*align_corners=*/false);
    pos = pos.flatten(2).transpose(1, 2);
  }
  pos_embed_ = pos.to(device, dtype).contiguous();

  blocks_.reserve(static_cast<size_t>(config_.depth));
  for (int64_t i = 0; i < config_.depth; ++i) {
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    blocks_.push_back(Block{get(p + "ln1.weight"), get(p + "ln1.bias"), get(p + "attn.qkv.weight"),
                            get(p + "attn.qkv.bias"), get(p + "attn.proj.weight"),
                            get(p + "attn.proj.bias"), get(p + "ln2.weight"), get(p + "ln2.bias"),
                            get(p + "ffn.layers.0.0.weight"), get(p + "ffn.layers.0.0.bias"),
                            get(p + "ffn.layers.1.weight"), get(p + "ffn.layers.1.bias")});
  }
  ln_w_ = get("backbone.ln1.weight");
  ln_b_ = get("backbone.ln1.bias");
  head::HeadWeights hw;
  for (const int s : {0, 3, 6}) {
    hw.deconv_w.push_back(get("decode_head.deconv_layers." + std::to_string(s) + ".weight"));
    hw.conv_w.push_back(get("decode_head.conv_layers." + std::to_string(s) + ".weight"));
    hw.conv_b.push_back(get("decode_head.conv_layers." + std::to_string(s) + ".bias"));
  }
  hw.seg_w = get("decode_head.conv_seg.weight");
  hw.seg_b = get("decode_head.conv_seg.bias");
  if (device_.is_cpu()) {
    cpu_head_ = head::CpuHead(hw, head::cpu_head_path(dtype, hw.seg_w.size(1)),
                              head::cpu_head_winograd(dtype));
  } else {
    generic_head_ = std::move(hw);
  }
}

namespace {

// Tokens per chunk of the backbone's MLP on the CPU (cpu/row_chunks.hpp).
constexpr int64_t kMlpRows = 1024;

}  // namespace

at::Tensor Network::head_generic(const at::Tensor& feat, int64_t gh, int64_t gw) const {
  const int64_t B = feat.size(0), C = feat.size(2);
  at::Tensor x = feat.view({B, gh, gw, C}).permute({0, 3, 1, 2}).contiguous();
  auto norm_silu = [](at::Tensor y) {
    y = at::instance_norm(y, {}, {}, {}, {}, /*use_input_stats=*/true, /*momentum=*/0.1,
                          kInstanceNormEps, /*cudnn_enabled=*/false);
    return at::silu_(y);
  };
  for (int s = 0; s < 3; ++s) {
    x = norm_silu(at::conv_transpose2d(x, generic_head_.deconv_w[s], {}, /*stride=*/2,
                                       /*padding=*/1));
  }
  for (int s = 0; s < 3; ++s) {
    x = norm_silu(at::conv2d(x, generic_head_.conv_w[s], generic_head_.conv_b[s]));
  }
  return at::conv2d(x, generic_head_.seg_w, generic_head_.seg_b);
}

at::Tensor Network::forward(const at::Tensor& input) const {
  c10::InferenceMode guard;
  const auto& c = config_;
  if (input.dim() != 4 || input.size(1) != 3 || input.size(2) != c.input_h ||
      input.size(3) != c.input_w) {
    throw Error(ErrorCode::kInvalidInput,
                "network input must be [B,3," + std::to_string(c.input_h) + "," +
                    std::to_string(c.input_w) + "], got " + shape_str(input.sizes()));
  }
  const int64_t B = input.size(0), C = c.embed_dim, hd = c.head_dim();
  const int64_t gh = c.input_h / c.patch, gw = c.input_w / c.patch, N = gh * gw, M = B * N;
  at::Tensor x = input.to(device_, dtype_);

  // Patch embedding: token n = row * gw + col, as flatten(2).transpose(1,2) orders them.
  x = at::conv2d(x, patch_w_, patch_b_, {c.patch, c.patch});
  x = x.flatten(2).transpose(1, 2).contiguous();
  x.add_(pos_embed_);
  x = x.view({M, C});

  // The functional LayerNorm, not its out= form: LibTorch generates that one as the functional op
  // plus a copy into `out` (48 copies of the [M, C] map a call at 24 blocks: 51 ms in float32 on a
  // 2-core AMX Xeon), so it saved no allocation either.
  auto layer_norm = [&](const at::Tensor& w, const at::Tensor& b) {
    return std::get<0>(at::native_layer_norm(x, {C}, w, b, kLayerNormEps));
  };
  at::Tensor h =
      blocks_.empty() ? layer_norm(ln_w_, ln_b_) : layer_norm(blocks_[0].ln1_w, blocks_[0].ln1_b);
  // Intermediates that outgrow the allocator's reuse (glibc hands blocks over 32 MiB straight back
  // to the kernel) get one buffer per call, or are produced in row chunks: fresh pages cost a
  // fault per 4 KiB, which over a forward pass adds up to seconds on a small CPU.
  const bool on_cpu = device_.is_cpu();
  const attention::CpuAttentionPath attn_path =
      on_cpu ? attention::cpu_attention_path(dtype_, hd) : attention::CpuAttentionPath::kLibTorch;
  at::Tensor qkv = on_cpu ? at::empty({M, 3 * C}, x.options()) : at::Tensor();
  // Which library runs the GEMMs, and whether oneDNN fuses their GELU and residual adds
  // (cpu/gemm.hpp: a table of CPUs for float32).
  const cpu::GemmPolicy gemm =
      cpu::policy_for(dtype_, on_cpu && dtype_ == at::kFloat ? cpu::float32_gemm().policy
                                                             : cpu::GemmPolicy::kSplit);
  bool first = true;
  for (const Block& b : blocks_) {
    if (!first) h = layer_norm(b.ln1_w, b.ln1_b);
    first = false;
    if (on_cpu && gemm == cpu::GemmPolicy::kOnednn) {
      // oneDNN's op has no out= form: row chunks small enough for the allocator to reuse, copied
      // into the per-call buffer (a fresh 3C-wide map per block would cost a page fault per 4 KiB).
      for (int64_t r = 0, n = 0; r < M; r += n) {
        n = cpu::chunk_rows_at(r, M, kMlpRows);
        qkv.narrow(0, r, n).copy_(cpu::linear(h.narrow(0, r, n), b.qkv_w, b.qkv_b, gemm));
      }
    } else if (on_cpu) {
      at::addmm_out(qkv, b.qkv_b, h, b.qkv_w.t());
    } else {
      qkv = at::linear(h, b.qkv_w, b.qkv_b);
    }
    // [B, N, 3, heads, hd] -> q, k, v as [B, heads, N, hd] views; rows of qkv.weight are Q, K, V.
    const at::Tensor q5 = qkv.view({B, N, 3, c.heads, hd}).permute({2, 0, 3, 1, 4});
    at::Tensor o;
    if (on_cpu) {
      o = attention::cpu_attention(q5[0], q5[1], q5[2], attn_path).view({M, C});
    } else {
      o = at::scaled_dot_product_attention(q5[0], q5[1], q5[2]).transpose(1, 2).reshape({M, C});
    }
    if (on_cpu) {
      x = cpu::linear_add(o, x, b.proj_w, b.proj_b, gemm);
    } else {
      x.add_(at::linear(o, b.proj_w, b.proj_b));
    }
    h = layer_norm(b.ln2_w, b.ln2_b);
    if (on_cpu) {
      // The MLP in row chunks: each chunk's hidden activation (4C wide) stays in the last-level
      // cache between the two GEMMs.
      for (int64_t r = 0, n = 0; r < M; r += n) {
        n = cpu::chunk_rows_at(r, M, kMlpRows);
        at::Tensor xr = x.narrow(0, r, n);
        xr.copy_(cpu::linear_add(cpu::linear_gelu(h.narrow(0, r, n), b.fc1_w, b.fc1_b, gemm), xr,
                                 b.fc2_w, b.fc2_b, gemm));
      }
    } else {
      at::Tensor hidden = at::linear(h, b.fc1_w, b.fc1_b);
      at::gelu_(hidden);  // exact erf GELU, as nn.GELU()
      x.add_(at::linear(hidden, b.fc2_w, b.fc2_b));
    }
  }
  h = layer_norm(ln_w_, ln_b_);
  const at::Tensor feat = h.view({B, N, C});
  return device_.is_cpu() ? cpu_head_.forward(feat, gh, gw) : head_generic(feat, gh, gw);
}

}  // namespace sapiens_seg::core::v1
