#include "sapiens2.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numbers>
#include <optional>
#include <regex>
#include <sstream>
#include <tuple>

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "../attention/cpu_attention.hpp"
#include "../checkpoint/layout.hpp"
#include "../checkpoint/mapped_file.hpp"
#include "../cpu/row_chunks.hpp"
#include "../settings.hpp"
#include "cpu_ops.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core::v2 {
namespace {

constexpr double kRmsNormEps = 1e-6;       // every RMSNorm of the backbone, q/k-norm included
constexpr double kInstanceNormEps = 1e-5;  // InstanceNorm2d defaults in the head
constexpr int64_t kRopeBase = 100;         // the module's default base, for files without periods
constexpr int64_t kMlpRows = 1024;  // tokens per chunk of the MLP (bfloat16 and float16 on the CPU;
                                    // cpu/row_chunks.hpp)
constexpr int64_t kMaxFusedHeadDim = 512;  // cpu::aten_arith::kMaxHeadDim
// Columns of w12 per chunk of the float32 MLP where the CPU's rule takes chunks: a pair of
// [M, 1024] chunks is 25 MB at 3077 tokens. benchmarks/mlp_bench.cpp on Zen 3 (2026-12-07,
// benchmarks/results/amd-zen3/cpu-mlp-columns.json, three runs): 0.4b's w12 and gate 1.09-1.11x
// as fast as whole with 1024 or 512 columns, 1.05x with 256; 1b's level with 512 or 1024
// (0.98-1.04x), 0.97x with 256. On an AMX Xeon (Intel AVX-512, 2026-12-07, intel-xeon-amx/
// cpu-mlp-columns-amx.json, three runs): 0.4b 1.02-1.03x with 1024 columns, 1b 1.00-1.02x, 256
// columns 0.95-0.97x.
constexpr int64_t kMlpColumns = 1024;

[[noreturn]] void refuse(const std::string& what) {
  throw Error(ErrorCode::kFormatError, "not a Sapiens2 segmentation checkpoint: " + what);
}

const at::Tensor& need(const TensorMap& t, const std::string& key) {
  auto it = t.find(key);
  if (it == t.end()) refuse("tensor '" + key + "' is missing");
  return it->second;
}

std::string block_key(int64_t i, const char* rest) {
  return "backbone.blocks." + std::to_string(i) + "." + rest;
}

// own_ops (float16 on the CPU): the library's one-pass RMSNorm; else LibTorch's.
at::Tensor rms_norm(const at::Tensor& t, const at::Tensor& w, bool own_ops) {
  return own_ops ? rms_norm_cpu(t, w, kRmsNormEps) : at::rms_norm(t, {t.size(-1)}, w, kRmsNormEps);
}

// RoPE in bf16 on every token's q/k [B, heads, N, hd] (the `pre` prefix tokens are only rounded,
// not rotated), as the authors' module does even in an fp32 model.
at::Tensor apply_rope(const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin,
                      int64_t pre) {
  const at::Tensor b = t.to(at::kBFloat16);
  at::Tensor p = b.narrow(2, pre, b.size(2) - pre);
  p = p.mul(cos).add(rotate_half(p).mul(sin));
  return at::cat({b.narrow(2, 0, pre), p}, 2).to(t.scalar_type());
}

// The backbone's float32 GEMMs stay on MKL, LibTorch's own choice and so the authors' module's,
// on every CPU, whatever cpu/gemm.hpp picks for Sapiens v1 and the heads: the bf16 rounding of
// q and k before RoPE turns oneDNN's different float32 ulps into whole bf16 steps. With
// oneDNN's GEMMs the tiny fixture's logits moved 0.0026-0.0058 from the reference, against
// 4-7e-6 with MKL and the 0.002 bar (ParitySapiens2.Float32BackboneKeepsTheModulesGemms).
at::Tensor backbone_linear(const at::Tensor& t, const at::Tensor& w, const at::Tensor& bias) {
  return at::linear(t, w, bias);
}

// SAPIENS_SEG_CPU_FUSE: the CPU network's fused passes (on, the default) or the module's ops one
// by one (off), read per call.
bool fused_enabled();

// SAPIENS_SEG_CPU_MLP_COLUMNS: the float32 MLP's column chunk width (0: the whole w12 at once).
int64_t mlp_column_width(int64_t F);

// Whether the BLAS gives a chunk of a GEMM's output columns the bits of the whole GEMM's at one
// shape: {M, K, N, chunk width, threads} -> exact. The first fused call at a shape measures it
// (block_fused); it is a fact of this process's BLAS on this CPU, kept for the process.
using SplitKey = std::array<int64_t, 5>;
std::optional<bool> column_split_known(const SplitKey& key);
void record_column_split(const SplitKey& key, bool exact);

at::Tensor norm_silu(at::Tensor y) {
  y = at::instance_norm(y, {}, {}, {}, {}, /*use_input_stats=*/true, /*momentum=*/0.1,
                        kInstanceNormEps, /*cudnn_enabled=*/false);
  return at::silu_(y);
}

}  // namespace

// ---- key names -------------------------------------------------------------------------------

bool has_hf_names(const TensorMap& tensors) {
  const std::string tail = "embeddings.patch_embeddings.weight";
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& kv) {
    const std::string& k = kv.first;
    return k.size() >= tail.size() && k.compare(k.size() - tail.size(), tail.size(), tail) == 0;
  });
}

TensorMap to_original_names(const TensorMap& tensors) {
  if (!has_hf_names(tensors)) return tensors;
  // The backbone's prefix differs between transformers versions ("model.", "sapiens2.", none);
  // the patch embedding tells which one this file uses.
  std::string base;
  for (const auto& [k, v] : tensors) {
    const auto pos = k.find("embeddings.patch_embeddings.weight");
    if (pos != std::string::npos) base = k.substr(0, pos);
  }
  static const std::regex layer_re(R"(^(?:(?:model|encoder)\.)?layers?\.(\d+)\.(.+)$)");
  static const std::regex head_re(
      R"(^decode_head\.(upsample_layers|conv_layers)\.(\d+)\.convolution\.(weight|bias)$)");
  static const std::map<std::string, std::string> in_block = {
      {"norm1.weight", "ln1.weight"},
      {"attention.q_proj.weight", "attn.wq.weight"},
      {"attention.q_proj.bias", "attn.wq.bias"},
      {"attention.k_proj.weight", "attn.wk.weight"},
      {"attention.k_proj.bias", "attn.wk.bias"},
      {"attention.v_proj.weight", "attn.wv.weight"},
      {"attention.v_proj.bias", "attn.wv.bias"},
      {"attention.o_proj.weight", "attn.proj.weight"},
      {"attention.o_proj.bias", "attn.proj.bias"},
      {"attention.q_norm.weight", "attn.q_norm.weight"},
      {"attention.k_norm.weight", "attn.k_norm.weight"},
      {"layer_scale1.lambda1", "attn.gamma.weight"},
      {"norm2.weight", "ln2.weight"},
      {"mlp.down_proj.weight", "ffn.w3.weight"},
      {"mlp.down_proj.bias", "ffn.w3.bias"},
  };
  static const std::map<std::string, std::string> top = {
      {"embeddings.cls_token", "backbone.cls_token"},
      {"embeddings.register_tokens", "backbone.storage_tokens"},
      {"embeddings.patch_embeddings.weight", "backbone.patch_embed.projection.weight"},
      {"embeddings.patch_embeddings.bias", "backbone.patch_embed.projection.bias"},
      {"rope_embeddings.periods", "backbone.rope_embed.periods"},
      {"norm.weight", "backbone.ln1.weight"},
  };

  TensorMap out;
  std::map<std::string, at::Tensor> gate, up;  // block prefix + "weight"/"bias" -> half of w12
  for (const auto& [key, value] : tensors) {
    if (key.rfind("decode_head.", 0) == 0) {
      std::smatch m;
      if (key == "decode_head.predictor.weight") {
        out.emplace("decode_head.conv_seg.weight", value);
      } else if (key == "decode_head.predictor.bias") {
        out.emplace("decode_head.conv_seg.bias", value);
      } else if (std::regex_match(key, m, head_re)) {
        const int64_t idx = 3 * std::stoll(m[2].str());  // (conv, norm, act) per stage
        const std::string seq = m[1] == "upsample_layers" ? "deconv_layers" : "conv_layers";
        out.emplace("decode_head." + seq + "." + std::to_string(idx) + "." + m[3].str(), value);
      } else {
        out.emplace(key, value);  // reported as unexpected by infer_config
      }
      continue;
    }
    if (key.rfind(base, 0) != 0) {
      out.emplace(key, value);
      continue;
    }
    const std::string rest = key.substr(base.size());
    if (rest == "embeddings.mask_token") continue;  // pre-training only
    if (auto it = top.find(rest); it != top.end()) {
      out.emplace(it->second, value);
      continue;
    }
    std::smatch m;
    if (std::regex_match(rest, m, layer_re)) {
      const std::string blk = "backbone.blocks." + m[1].str() + ".";
      const std::string leaf = m[2].str();
      if (auto it = in_block.find(leaf); it != in_block.end()) {
        out.emplace(blk + it->second, value);
        continue;
      }
      if (leaf == "mlp.gate_proj.weight" || leaf == "mlp.gate_proj.bias") {
        gate[blk + leaf.substr(leaf.rfind('.') + 1)] = value;
        continue;
      }
      if (leaf == "mlp.up_proj.weight" || leaf == "mlp.up_proj.bias") {
        up[blk + leaf.substr(leaf.rfind('.') + 1)] = value;
        continue;
      }
    }
    out.emplace(key, value);
  }
  for (const auto& [k, g] : gate) {
    auto u = up.find(k);
    const std::string what = k.substr(k.rfind('.') + 1);  // weight or bias
    const std::string blk = k.substr(0, k.rfind('.') + 1);
    if (u == up.end() || g.sizes() != u->second.sizes() ||
        g.scalar_type() != u->second.scalar_type()) {
      refuse("the gate and up projections of " + blk + " do not pair up (" + what + ")");
    }
    out.emplace(blk + "ffn.w12." + what, at::cat({g, u->second}, 0));
    up.erase(u);
  }
  for (const auto& [k, u] : up) {
    refuse("up projection without a gate projection: " + k);
  }
  return out;
}

// ---- configuration ---------------------------------------------------------------------------

Config infer_config(const TensorMap& tensors, const ConfigHints& hints) {
  Config c;
  const auto& cls = need(tensors, "backbone.cls_token");
  const auto& reg = need(tensors, "backbone.storage_tokens");
  const auto& pw = need(tensors, "backbone.patch_embed.projection.weight");
  if (cls.dim() != 3 || reg.dim() != 3 || pw.dim() != 4) {
    refuse("unexpected rank of cls_token, storage_tokens or the patch projection");
  }
  c.embed_dim = cls.size(2);
  c.registers = reg.size(1);
  c.patch = pw.size(2);
  const std::string prefix = "backbone.blocks.";
  for (const auto& [key, value] : tensors) {
    if (key.rfind(prefix, 0) != 0) continue;
    const auto dot = key.find('.', prefix.size());
    const std::string num = key.substr(prefix.size(), dot - prefix.size());
    if (num.empty() || num.size() > 4 || !std::all_of(num.begin(), num.end(), ::isdigit)) {
      refuse("unexpected tensor name '" + key + "'");
    }
    c.depth = std::max<int64_t>(c.depth, std::stoll(num) + 1);
  }
  if (c.depth == 0) refuse("no transformer blocks (backbone.blocks.*)");
  const auto& qn = need(tensors, block_key(0, "attn.q_norm.weight"));
  const auto& w12 = need(tensors, block_key(0, "ffn.w12.weight"));
  if (qn.dim() != 1 || w12.dim() != 2) refuse("unexpected rank of q_norm or w12 in block 0");
  c.head_dim = qn.size(0);
  if (c.head_dim <= 0 || c.head_dim % 4 != 0 || c.embed_dim % c.head_dim != 0) {
    refuse("head dim " + std::to_string(c.head_dim) + " (from q_norm) must divide the embed dim " +
           std::to_string(c.embed_dim) + " and be a multiple of 4 (2D RoPE)");
  }
  c.heads = c.embed_dim / c.head_dim;
  c.mlp = w12.size(0) / 2;
  for (int64_t i = 0; i < c.depth; ++i) {
    auto it = tensors.find(block_key(i, "attn.wk.weight"));
    int64_t kv = c.heads;
    if (it != tensors.end() && it->second.dim() == 2 && it->second.size(0) % c.head_dim == 0) {
      kv = it->second.size(0) / c.head_dim;
    }
    if (kv <= 0 || c.heads % kv != 0) {
      refuse("block " + std::to_string(i) + " has " + std::to_string(kv) +
             " key/value heads, which does not divide " + std::to_string(c.heads) + " query heads");
    }
    c.kv_heads.push_back(kv);
  }
  for (int s = 0;; ++s) {
    auto it = tensors.find("decode_head.deconv_layers." + std::to_string(3 * s) + ".weight");
    if (it == tensors.end()) break;
    if (it->second.dim() != 4) refuse("deconvolution weights must be 4-D");
    c.deconv_channels.push_back(it->second.size(1));
  }
  for (int s = 0;; ++s) {
    auto it = tensors.find("decode_head.conv_layers." + std::to_string(3 * s) + ".weight");
    if (it == tensors.end()) break;
    if (it->second.dim() != 4) refuse("conv weights must be 4-D");
    c.conv_channels.push_back(it->second.size(0));
  }
  if (c.deconv_channels.empty()) refuse("the head has no deconvolution stages");
  c.num_classes = need(tensors, "decode_head.conv_seg.weight").size(0);
  c.periods_in_file = tensors.count("backbone.rope_embed.periods") != 0;

  c.input_h = hints.input_h.value_or(1024);
  c.input_w = hints.input_w.value_or(768);
  if (c.input_h % c.patch != 0 || c.input_w % c.patch != 0 || c.input_h < c.patch ||
      c.input_w < c.patch) {
    throw Error(ErrorCode::kInvalidInput, "network input size " + std::to_string(c.input_h) + "x" +
                                              std::to_string(c.input_w) +
                                              " must be a positive multiple of the patch size " +
                                              std::to_string(c.patch));
  }

  // The complete expected layout, then one report of everything that differs.
  const int64_t C = c.embed_dim, F = c.mlp, hd = c.head_dim;
  Layout want = {
      {"backbone.cls_token", {1, 1, C}},
      {"backbone.storage_tokens", {1, c.registers, C}},
      {"backbone.patch_embed.projection.weight", {C, 3, c.patch, c.patch}},
      {"backbone.patch_embed.projection.bias", {C}},
      {"backbone.ln1.weight", {C}},
  };
  if (c.periods_in_file) want["backbone.rope_embed.periods"] = {hd / 4};
  int64_t in = C;
  for (size_t s = 0; s < c.deconv_channels.size(); ++s) {
    want["decode_head.deconv_layers." + std::to_string(3 * s) + ".weight"] = {
        in, c.deconv_channels[s], 4, 4};
    in = c.deconv_channels[s];
  }
  for (size_t s = 0; s < c.conv_channels.size(); ++s) {
    const std::string p = "decode_head.conv_layers." + std::to_string(3 * s);
    want[p + ".weight"] = {c.conv_channels[s], in, 1, 1};
    want[p + ".bias"] = {c.conv_channels[s]};
    in = c.conv_channels[s];
  }
  want["decode_head.conv_seg.weight"] = {c.num_classes, in, 1, 1};
  want["decode_head.conv_seg.bias"] = {c.num_classes};
  for (int64_t i = 0; i < c.depth; ++i) {
    const int64_t kvd = c.kv_heads[static_cast<size_t>(i)] * hd;
    want[block_key(i, "ln1.weight")] = {C};
    want[block_key(i, "attn.wq.weight")] = {C, C};
    want[block_key(i, "attn.wq.bias")] = {C};
    want[block_key(i, "attn.wk.weight")] = {kvd, C};
    want[block_key(i, "attn.wk.bias")] = {kvd};
    want[block_key(i, "attn.wv.weight")] = {kvd, C};
    want[block_key(i, "attn.wv.bias")] = {kvd};
    want[block_key(i, "attn.q_norm.weight")] = {hd};
    want[block_key(i, "attn.k_norm.weight")] = {hd};
    want[block_key(i, "attn.proj.weight")] = {C, C};
    want[block_key(i, "attn.proj.bias")] = {C};
    want[block_key(i, "attn.gamma.weight")] = {C};
    want[block_key(i, "ln2.weight")] = {C};
    want[block_key(i, "ffn.w12.weight")] = {2 * F, C};
    want[block_key(i, "ffn.w12.bias")] = {2 * F};
    want[block_key(i, "ffn.w3.weight")] = {C, F};
    want[block_key(i, "ffn.w3.bias")] = {C};
  }
  const std::string report = layout_mismatches(tensors, want);
  if (!report.empty()) {
    std::ostringstream os;
    os << "the tensors do not match the layout derived from the checkpoint (embed " << C
       << ", depth " << c.depth << ", heads " << c.heads << ", head dim " << hd << ", mlp " << F
       << ", classes " << c.num_classes << ")" << report;
    refuse(os.str());
  }
  return c;
}

// ---- RoPE ------------------------------------------------------------------------------------

at::Tensor rope_periods(const TensorMap& tensors, const Config& c) {
  c10::InferenceMode guard;
  if (auto it = tensors.find("backbone.rope_embed.periods"); it != tensors.end()) {
    // The module's buffer is bf16: loading an F32 copy into it rounds exactly like this.
    return it->second.to(at::kBFloat16).contiguous();
  }
  const auto bf = at::TensorOptions().dtype(at::kBFloat16);
  at::Tensor e = at::arange(c.head_dim / 4, bf).mul(2).div(c.head_dim / 2);
  return at::pow(c10::Scalar(kRopeBase), e);
}

std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& periods, int64_t grid_h,
                                              int64_t grid_w) {
  c10::InferenceMode guard;
  // Every step rounds to bf16, in this order, as the module computes it in eager mode.
  const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(periods.device());
  at::Tensor ch = at::arange(0.5, static_cast<double>(grid_h), bf).div(grid_h);
  at::Tensor cw = at::arange(0.5, static_cast<double>(grid_w), bf).div(grid_w);
  auto mesh = at::meshgrid({ch, cw}, "ij");
  at::Tensor coords = at::stack({mesh[0], mesh[1]}, -1).flatten(0, 1);  // [P, 2] as (y, x)
  coords = coords.mul(2.0).sub(1.0);
  at::Tensor angles = coords.unsqueeze(-1)
                          .mul(2.0 * std::numbers::pi)
                          .div(periods.to(at::kBFloat16).view({1, 1, -1}));
  angles = angles.flatten(1, 2).tile({2});  // [y_0.., x_0.., y_0.., x_0..]
  return {angles.cos(), angles.sin()};
}

// ---- network ---------------------------------------------------------------------------------

Network::Network(const TensorMap& t, Config config, at::Device device, at::ScalarType dtype)
    : config_(std::move(config)), dtype_(dtype), device_(device) {
  c10::InferenceMode guard;
  auto get = [&](const std::string& key) {
    const at::Tensor& src = t.at(key);
    at::Tensor out = src.to(device, dtype, /*non_blocking=*/false, /*copy=*/false).contiguous();
    // A converted copy no longer needs the file's pages (a 5B bfloat16 load would otherwise
    // keep the 20 GB of float32 pages resident beside its 10 GB of weights).
    if (out.data_ptr() != src.data_ptr() && src.is_contiguous()) {
      release_mapped_pages(src.data_ptr(), src.nbytes());
    }
    return out;
  };
  const auto& c = config_;
  patch_w_ = get("backbone.patch_embed.projection.weight");
  patch_b_ = get("backbone.patch_embed.projection.bias");
  prefix_ = at::cat({get("backbone.cls_token"), get("backbone.storage_tokens")}, 1);

  const at::Tensor periods = rope_periods(t, c).to(device);
  std::tie(rope_cos_, rope_sin_) = rope_tables(periods, c.input_h / c.patch, c.input_w / c.patch);

  blocks_.reserve(static_cast<size_t>(c.depth));
  for (int64_t i = 0; i < c.depth; ++i) {
    auto b = [&](const char* rest) { return get(block_key(i, rest)); };
    Block blk{b("ln1.weight"),       b("attn.wq.weight"),     b("attn.wq.bias"),
              b("attn.wk.weight"),   b("attn.wk.bias"),       b("attn.wv.weight"),
              b("attn.wv.bias"),     b("attn.q_norm.weight"), b("attn.k_norm.weight"),
              b("attn.proj.weight"), b("attn.proj.bias"),     b("attn.gamma.weight"),
              b("ln2.weight"),       b("ffn.w12.weight"),     b("ffn.w12.bias"),
              b("ffn.w3.weight"),    b("ffn.w3.bias"),        c.kv_heads[static_cast<size_t>(i)]};
    blocks_.push_back(std::move(blk));
  }
  ln_w_ = get("backbone.ln1.weight");
  for (size_t s = 0; s < c.deconv_channels.size(); ++s) {
    deconv_w_.push_back(get("decode_head.deconv_layers." + std::to_string(3 * s) + ".weight"));
  }
  for (size_t s = 0; s < c.conv_channels.size(); ++s) {
    const std::string p = "decode_head.conv_layers." + std::to_string(3 * s);
    conv_w_.push_back(get(p + ".weight"));
    conv_b_.push_back(get(p + ".bias"));
  }
  seg_w_ = get("decode_head.conv_seg.weight");
  seg_b_ = get("decode_head.conv_seg.bias");
  if (device.is_cpu()) {
    cpu_head_ =
        head::CpuHead({deconv_w_, conv_w_, conv_b_, seg_w_, seg_b_},
                      head::cpu_head_path(dtype, seg_w_.size(1)), head::cpu_head_winograd(dtype));
  }
}

at::Tensor Network::forward(const at::Tensor& input) const {
  c10::InferenceMode guard;
  at::Tensor x = embed(input);
  x = blocks(std::move(x), 0, blocks_.size());
  x = final_norm(x);
  return head(std::move(x));
}

at::Tensor Network::embed(const at::Tensor& input) const {
  c10::InferenceMode guard;
  const auto& c = config_;
  if (input.dim() != 4 || input.size(1) != 3 || input.size(2) != c.input_h ||
      input.size(3) != c.input_w) {
    throw Error(ErrorCode::kInvalidInput,
                "network input must be [B,3," + std::to_string(c.input_h) + "," +
                    std::to_string(c.input_w) + "], got " + shape_str(input.sizes()));
  }
  const int64_t B = input.size(0);
  const at::Tensor x =
      at::conv2d(input.to(device_, dtype_), patch_w_, patch_b_, {c.patch, c.patch});
  return at::cat(
      {prefix_.expand({B, c.prefix_tokens(), c.embed_dim}), x.flatten(2).transpose(1, 2)}, 1);
}

// One call's blocks share the CPU attention path, chosen per call (SAPIENS_SEG_CPU_ATTENTION set
// after the load still counts), and the MLP's row buffers, allocated once rather than per block.
struct Network::Pass {
  int64_t batch = 0, tokens = 0;
  attention::CpuAttentionPath attn_path = attention::CpuAttentionPath::kLibTorch;
  bool own_ops = false;
  at::Tensor mlp_g, mlp_a;
  // float32 and bfloat16 on the CPU, fused (block_fused): the maps every block writes, allocated
  // once per call. Fresh maps of these sizes come from the kernel page by page (glibc hands blocks
  // over 32 MiB straight back), and the module's ops made a dozen per block.
  bool fused = false;
  at::Tensor h;        // the norm of the residual stream [B, N, C], the next GEMMs' input
  at::Tensor x[2];     // the residual stream, alternately (the caller's tokens are only read)
  at::Tensor q, k, v;  // the projections [M, C] (k and v use their leading M x kv*hd)
  at::Tensor qr, kr;   // q and k normalised and rotated, [B, heads, N, hd] (q a view of [B, N,
                       // heads, hd]; kr: its leading part)
  at::Tensor g, a, r;  // the MLP's maps: float32 [M, 2F] and [M, F]; bfloat16 row chunks
  // float32: w12 by column chunks of mlp_width where the BLAS gives them the whole GEMM's bits
  // (mlp_cols, once known); mlp_probe: the first block checks it. gu: a chunk pair [2, M, width].
  int64_t mlp_width = 0, mlp_cols = 0;
  bool mlp_probe = false;
  at::Tensor gu;
};

at::Tensor Network::blocks(at::Tensor x, size_t first, size_t end) const {
  c10::InferenceMode guard;
  if (first > end || end > blocks_.size()) {
    throw Error(ErrorCode::kInternal, "blocks [" + std::to_string(first) + ", " +
                                          std::to_string(end) + ") of a network of " +
                                          std::to_string(blocks_.size()));
  }
  Pass pass;
  pass.batch = x.size(0);
  pass.tokens = x.size(1);
  // float32 keeps LibTorch's attention, the authors' module's own: the bf16 rounding of q and k
  // before RoPE turns the kernel's float32-ulp differences into whole bf16 steps in later blocks,
  // which added up to 0.003-0.012 in the tiny fixture's logits, over the 0.002 bar of float32
  // (the kernel itself is as close to exact attention as LibTorch's). bfloat16 has no such bar
  // and gains 2.4-2.6x in attention (benchmarks/attention_bench.cpp).
  if (device_.is_cpu() && x.scalar_type() != at::kFloat) {
    pass.attn_path = attention::cpu_attention_path(x.scalar_type(), config_.head_dim);
  }
  // float32 and bfloat16 on the CPU: the module's op sequence with its memory-bound passes fused,
  // bit for bit (v2/cpu_ops.hpp); SAPIENS_SEG_CPU_FUSE=off runs the module's ops one by one (A/B,
  // tests). float16: the library's one-pass RMSNorm and SwiGLU gate (close to LibTorch's, not to
  // the bit).
  pass.fused = device_.is_cpu() && (dtype_ == at::kFloat || dtype_ == at::kBFloat16) &&
               fused_enabled() && first < end && x.is_contiguous() &&
               config_.head_dim <= kMaxFusedHeadDim;
  if (pass.fused) return blocks_fused(x, first, end, pass);
  pass.own_ops = device_.is_cpu() && dtype_ == at::kHalf;
  for (size_t i = first; i < end; ++i) x = block(blocks_[i], std::move(x), pass);
  return x;
}

namespace {
struct ColumnSplits {
  std::mutex m;
  std::map<SplitKey, bool> exact;
};
ColumnSplits& column_splits() {
  static ColumnSplits splits;
  return splits;
}

std::optional<bool> column_split_known(const SplitKey& key) {
  ColumnSplits& cs = column_splits();
  const std::lock_guard<std::mutex> lock(cs.m);
  const auto it = cs.exact.find(key);
  if (it == cs.exact.end()) return std::nullopt;
  return it->second;
}

void record_column_split(const SplitKey& key, bool exact) {
  ColumnSplits& cs = column_splits();
  const std::lock_guard<std::mutex> lock(cs.m);
  cs.exact[key] = exact;
}

int64_t mlp_column_width(int64_t F) {
  const std::string v = read_settings().cpu_mlp_columns;
  int64_t width = mlp_columns_for(host_cpu_features());
  if (v == "off") {
    width = 0;
  } else if (!v.empty() && v != "auto") {
    const char* last = v.data() + v.size();
    const auto [end, ec] = std::from_chars(v.data(), last, width);
    if (ec != std::errc() || end != last || width <= 0) {
      throw Error(ErrorCode::kInvalidInput,
                  "SAPIENS_SEG_CPU_MLP_COLUMNS must be 'auto', 'off' or a positive column count, "
                  "got '" +
                      v + "'");
    }
  }
  return width < F ? width : 0;
}

bool fused_enabled() {
  const std::string v = read_settings().cpu_fuse;
  if (v.empty() || v == "on") return true;
  if (v == "off") return false;
  throw Error(ErrorCode::kInvalidInput,
              "SAPIENS_SEG_CPU_FUSE must be 'on' or 'off', got '" + v + "'");
}
}  // namespace

at::Tensor Network::blocks_fused(const at::Tensor& x0, size_t first, size_t end, Pass& pass) const {
  const auto& c = config_;
  const int64_t B = pass.batch, N = pass.tokens, C = c.embed_dim, M = B * N;
  int64_t F = 0;
  bool one_width = true;
  for (size_t i = first; i < end; ++i) {
    one_width = one_width && (F == 0 || F == blocks_[i].w3_w.size(1));
    F = std::max(F, blocks_[i].w3_w.size(1));
  }
  const auto opt = x0.options();
  // float32: w12 a pair of column chunks at a time (gate columns and their multipliers), each
  // pair's SwiGLU while the pair is in cache, where this CPU's BLAS gives a chunk the whole GEMM's
  // bits. MKL on Zen 3 does; the whole [M, 2F] map (100 MB at 0.4b) went to memory and back, and
  // its bias copy and GEMM ran 10 % slower than on chunks of 512 columns (docs/cpu.md).
  if (dtype_ == at::kFloat && one_width) pass.mlp_width = mlp_column_width(F);
  if (pass.mlp_width > 0) {
    const auto known = column_split_known({M, C, 2 * F, pass.mlp_width, at::get_num_threads()});
    if (known.value_or(false)) pass.mlp_cols = pass.mlp_width;
    pass.mlp_probe = !known.has_value();
    if (pass.mlp_cols > 0 || pass.mlp_probe) pass.gu = at::empty({2 * M * pass.mlp_width}, opt);
  }
  pass.h = at::empty({B, N, C}, opt);
  for (at::Tensor& t : pass.x) t = at::empty({B, N, C}, opt);
  pass.q = at::empty({M, C}, opt);
  pass.k = at::empty({M * C}, opt);
  pass.v = at::empty({M * C}, opt);
  // q token-major: LibTorch's attention lays its output out like q, so the heads come back merged
  // in the rows the output projection reads (a view, not a copy of the map per block).
  pass.qr = at::empty({B, N, c.heads, c.head_dim}, opt).transpose(1, 2);
  pass.kr = at::empty({B * c.heads * N * c.head_dim}, opt);
  // float32: the MLP over all rows at once, the module's GEMM shapes (their roundings depend on
  // them); bfloat16: kMlpRows rows at a time, so that each chunk's [rows, 2F] map stays in cache
  // between its GEMMs and the gate.
  const int64_t mlp_rows = dtype_ == at::kFloat ? M : cpu::largest_chunk_rows(M, kMlpRows);
  pass.g = at::empty({pass.mlp_cols > 0 ? 0 : mlp_rows * 2 * F}, opt);
  pass.a = at::empty({mlp_rows * F}, opt);
  if (dtype_ != at::kFloat) pass.r = at::empty({mlp_rows, C}, opt);
  fused_rms_norm(pass.h, x0, blocks_[first].ln1_w, kRmsNormEps);
  at::Tensor x = x0;
  for (size_t i = first; i < end; ++i) {
    const at::Tensor next_ln1 = i + 1 < end ? blocks_[i + 1].ln1_w : at::Tensor();
    x = block_fused(blocks_[i], x, next_ln1, pass);
  }
  return x;
}

// The block of `block` with its elementwise work fused: on entry pass.h holds rms_norm(x, ln1);
// on return it holds rms_norm(x', next_ln1) for the returned stream x' (when next_ln1 is defined).
// Every GEMM and the attention are the calls `block` makes, on maps of the same shapes, strides
// and alignment, so they round alike; the passes between them are v2/cpu_ops.hpp's, bit for bit
// the module's ops.
at::Tensor Network::block_fused(const Block& b, const at::Tensor& x, const at::Tensor& next_ln1,
                                Pass& pass) const {
  const auto& c = config_;
  const int64_t B = pass.batch, N = pass.tokens, C = c.embed_dim, M = B * N, hd = c.head_dim;
  const int64_t H = c.heads, kv = b.kv_heads, pre = c.prefix_tokens();
  const int64_t F = b.w3_w.size(1);
  const bool f32 = dtype_ == at::kFloat;
  const at::Tensor h = pass.h.view({M, C});
  // at::linear on [B, N, C] runs at::addmm(bias, input.view(M, C), weight.t()); addmm_out runs the
  // same kernel into a buffer of the same shape and strides.
  auto linear_into = [&](const at::Tensor& out, const at::Tensor& in, const at::Tensor& w,
                         const at::Tensor& bias) {
    at::Tensor o = out;
    at::addmm_out(o, bias, in, w.t());
    return o;
  };
  linear_into(pass.q, h, b.wq_w, b.wq_b);
  fused_qk_norm_rope(pass.qr, pass.q.view({B, N, C}), H, b.q_norm_w, kRmsNormEps, rope_cos_,
                     rope_sin_, pre, 1);
  // float32 expands k to the query heads here (repeat_interleave, as the LibTorch attention path
  // does); bfloat16 leaves the grouping to cpu_attention, whose kernel takes it as it is.
  const int64_t rep = f32 ? H / kv : 1;
  const at::Tensor k = pass.kr.narrow(0, 0, B * kv * rep * N * hd).view({B, kv * rep, N, hd});
  const at::Tensor kl =
      linear_into(pass.k.narrow(0, 0, M * kv * hd).view({M, kv * hd}), h, b.wk_w, b.wk_b);
  fused_qk_norm_rope(k, kl.view({B, N, kv * hd}), kv, b.k_norm_w, kRmsNormEps, rope_cos_, rope_sin_,
                     pre, rep);
  const at::Tensor vl =
      linear_into(pass.v.narrow(0, 0, M * kv * hd).view({M, kv * hd}), h, b.wv_w, b.wv_b);
  at::Tensor v = vl.view({B, N, kv, hd}).transpose(1, 2);
  at::Tensor o;
  if (f32) {
    if (kv != H) v = v.repeat_interleave(H / kv, 1);  // as cpu_attention's LibTorch path does
    o = at::scaled_dot_product_attention(pass.qr, k, v).transpose(1, 2).reshape({M, C});
  } else {
    o = attention::cpu_attention(pass.qr, k, v, pass.attn_path).view({M, C});
  }
  // The residual stream alternates between two buffers; the caller's tokens are only read.
  at::Tensor* xs = pass.x;
  at::Tensor& x1 = x.data_ptr() == xs[0].data_ptr() ? xs[1] : xs[0];
  linear_into(x1.view({M, C}), o, b.proj_w, b.proj_b);
  fused_add_rms_norm(x1, x, x1, b.gamma, b.ln2_w, kRmsNormEps, pass.h);
  // SwiGLU: w12 (rows [0, F) the gate, [F, 2F) its multiplier), the gate in one pass, w3, and
  // the residual add with the next block's first norm in one more.
  if (f32) {
    const at::Tensor a = pass.a.narrow(0, 0, M * F).view({M, F});
    // Columns [j, j + w) of the gate half and of the multiplier half into pass.gu.
    auto w12_columns = [&](int64_t j, int64_t w) {
      const at::Tensor gc = linear_into(pass.gu.narrow(0, 0, M * w).view({M, w}), h,
                                        b.w12_w.narrow(0, j, w), b.w12_b.narrow(0, j, w));
      const at::Tensor uc = linear_into(pass.gu.narrow(0, M * w, M * w).view({M, w}), h,
                                        b.w12_w.narrow(0, F + j, w), b.w12_b.narrow(0, F + j, w));
      return std::pair{gc, uc};
    };
    if (pass.mlp_cols > 0) {
      for (int64_t j = 0; j < F; j += pass.mlp_cols) {
        const auto [gc, uc] = w12_columns(j, std::min(pass.mlp_cols, F - j));
        fused_swiglu_columns(a, gc, uc, j);
      }
    } else {
      const at::Tensor g =
          linear_into(pass.g.narrow(0, 0, M * 2 * F).view({M, 2 * F}), h, b.w12_w, b.w12_b);
      if (pass.mlp_probe) {
        // The first chunk pair and the last (narrower where the width does not divide F) against
        // the whole GEMM's columns, bit for bit; the chunks between are the first's shape.
        pass.mlp_probe = false;
        const int64_t width = pass.mlp_width;
        bool exact = true;
        for (const int64_t j : {int64_t{0}, (F - 1) / width * width}) {
          const int64_t w = std::min(width, F - j);
          const auto [gc, uc] = w12_columns(j, w);
          exact = exact && gc.view(at::kInt).equal(g.narrow(1, j, w).view(at::kInt)) &&
                  uc.view(at::kInt).equal(g.narrow(1, F + j, w).view(at::kInt));
        }
        record_column_split({M, C, 2 * F, width, at::get_num_threads()}, exact);
        if (exact) pass.mlp_cols = width;
      }
      fused_swiglu(a, g);
    }
    at::Tensor& x2 = x1.data_ptr() == xs[0].data_ptr() ? xs[1] : xs[0];
    linear_into(x2.view({M, C}), a, b.w3_w, b.w3_b);
    fused_add_rms_norm(x2, x1, x2, at::Tensor(), next_ln1, kRmsNormEps, pass.h);
    return x2;
  }
  // bfloat16, row chunks: each chunk's residual is added in place, with its rows of the next norm
  // (rows are independent, and the chunk's rows of h are no longer needed).
  const at::Tensor xm = x1.view({M, C});
  const at::Tensor& hm = h;
  for (int64_t r = 0, n = 0; r < M; r += n) {
    n = cpu::chunk_rows_at(r, M, kMlpRows);
    const at::Tensor g = linear_into(pass.g.narrow(0, 0, n * 2 * F).view({n, 2 * F}),
                                     hm.narrow(0, r, n), b.w12_w, b.w12_b);
    const at::Tensor a = pass.a.narrow(0, 0, n * F).view({n, F});
    fused_swiglu(a, g);
    const at::Tensor out = linear_into(pass.r.narrow(0, 0, n), a, b.w3_w, b.w3_b);
    const at::Tensor xr = xm.narrow(0, r, n);
    fused_add_rms_norm(xr, xr, out, at::Tensor(), next_ln1, kRmsNormEps,
                       next_ln1.defined() ? hm.narrow(0, r, n) : at::Tensor());
  }
  return x1;
}

at::Tensor Network::block(const Block& b, at::Tensor x, Pass& pass) const {
  const auto& c = config_;
  const int64_t B = pass.batch, N = pass.tokens, hd = c.head_dim, pre = c.prefix_tokens();
  // q and k: normalised per head over rows of hd, then viewed as [B, heads, N, hd]. The library's
  // norm takes the projection's contiguous rows before the transpose (no copy); the module's
  // takes the transposed view, as the authors' code does.
  auto heads = [&](const at::Tensor& proj, int64_t n_heads, const at::Tensor& w) {
    const at::Tensor t = proj.view({B, N, n_heads, hd});
    return pass.own_ops ? rms_norm(t, w, true).transpose(1, 2)
                        : rms_norm(t.transpose(1, 2), w, false);
  };
  auto rope = [&](const at::Tensor& t) { return apply_rope(t, rope_cos_, rope_sin_, pre); };
  at::Tensor h = rms_norm(x, b.ln1_w, pass.own_ops);
  const at::Tensor q = rope(heads(backbone_linear(h, b.wq_w, b.wq_b), c.heads, b.q_norm_w));
  const at::Tensor k = rope(heads(backbone_linear(h, b.wk_w, b.wk_b), b.kv_heads, b.k_norm_w));
  const at::Tensor v =
      backbone_linear(h, b.wv_w, b.wv_b).view({B, N, b.kv_heads, hd}).transpose(1, 2);
  x = x + backbone_linear(attend(q, k, v, pass), b.proj_w, b.proj_b).mul(b.gamma);
  h = rms_norm(x, b.ln2_w, pass.own_ops);
  if (device_.is_cpu() && dtype_ != at::kFloat) {
    add_mlp_chunked(b, h, x, pass);
    return x;
  }
  // w12's rows [0, F) go through the SiLU (the gate), rows [F, 2F) are multiplied by it.
  const auto halves = backbone_linear(h, b.w12_w, b.w12_b).chunk(2, -1);
  return x + backbone_linear(at::silu(halves[0]).mul(halves[1]), b.w3_w, b.w3_b);
}

// q [B, heads, N, hd]; k and v [B, kv_heads, N, hd] -> [B, N, C].
at::Tensor Network::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const Pass& pass) const {
  const int64_t B = pass.batch, N = pass.tokens, C = config_.embed_dim, H = config_.heads;
  if (device_.is_cpu()) {  // takes the grouped kv heads as they are
    return attention::cpu_attention(q, k, v, pass.attn_path).view({B, N, C});
  }
  const int64_t kv = k.size(1);
  if (kv == H) return at::scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape({B, N, C});
  // kv head j serves query heads j*f .. j*f+f-1
  return at::scaled_dot_product_attention(q, k.repeat_interleave(H / kv, 1),
                                          v.repeat_interleave(H / kv, 1))
      .transpose(1, 2)
      .reshape({B, N, C});
}

// x += w3(silu(g) * u) + b3 with [g | u] = w12(h) + b12, kMlpRows tokens at a time into two
// buffers reused block after block; the gate in one pass (swiglu_cpu) for float16, the module's
// at::silu and at::mul otherwise (bfloat16 with SAPIENS_SEG_CPU_FUSE=off: the reference of the
// fused path). The module's ops made a fresh [N, 2F] map per block and three passes over it: at
// 0.4b in bfloat16 on an AMX Xeon the bias copy into it took 213 ms a call, the SiLU of its
// strided half 193 ms, the product 202 ms (benchmarks/results/intel-xeon-amx/
// cpu-profile-s2_full_0.4b-amx.json has the totals).
void Network::add_mlp_chunked(const Block& b, const at::Tensor& h, const at::Tensor& x,
                              Pass& pass) const {
  const int64_t M = pass.batch * pass.tokens, C = config_.embed_dim, F = b.w12_w.size(0) / 2;
  if (!pass.mlp_g.defined() || pass.mlp_g.size(1) != 2 * F) {
    const int64_t rows = cpu::largest_chunk_rows(M, kMlpRows);
    pass.mlp_g = at::empty({rows, 2 * F}, h.options());
    pass.mlp_a = at::empty({rows, F}, h.options());
  }
  const at::Tensor xm = x.view({M, C}), hm = h.view({M, C}), w12t = b.w12_w.t();
  for (int64_t r = 0, n = 0; r < M; r += n) {
    n = cpu::chunk_rows_at(r, M, kMlpRows);
    at::Tensor g = pass.mlp_g.narrow(0, 0, n);
    at::addmm_out(g, b.w12_b, hm.narrow(0, r, n), w12t);
    const at::Tensor a = pass.mlp_a.narrow(0, 0, n);
    if (pass.own_ops) {
      swiglu_cpu(a, g);
    } else {
      a.copy_(at::silu(g.narrow(1, 0, F)).mul(g.narrow(1, F, F)));
    }
    xm.narrow(0, r, n).add_(at::linear(a, b.w3_w, b.w3_b));
  }
}

at::Tensor Network::final_norm(const at::Tensor& x) const {
  c10::InferenceMode guard;
  if (device_.is_cpu() && (dtype_ == at::kFloat || dtype_ == at::kBFloat16) && x.is_contiguous() &&
      fused_enabled()) {
    at::Tensor y = at::empty_like(x);
    fused_rms_norm(y, x, ln_w_, kRmsNormEps);
    return y;
  }
  return rms_norm(x, ln_w_, device_.is_cpu() && dtype_ == at::kHalf);
}

at::Tensor Network::head(at::Tensor x) const {
  c10::InferenceMode guard;
  const auto& c = config_;
  const int64_t pre = c.prefix_tokens(), gh = c.input_h / c.patch, gw = c.input_w / c.patch;
  if (!cpu_head_.empty()) return cpu_head_.forward(x.narrow(1, pre, gh * gw).contiguous(), gh, gw);
  // The featmap is a copy: the tokens can go before the head's large maps are made.
  x = featmap(x);
  for (size_t s = 0; s < head_stages(); ++s) x = head_stage(s, x);
  return classify(x);
}

at::Tensor Network::featmap(const at::Tensor& x) const {
  c10::InferenceMode guard;
  const auto& c = config_;
  const int64_t pre = c.prefix_tokens(), gh = c.input_h / c.patch, gw = c.input_w / c.patch;
  return x.narrow(1, pre, gh * gw)
      .reshape({x.size(0), gh, gw, c.embed_dim})
      .permute({0, 3, 1, 2})
      .contiguous();
}

at::Tensor Network::head_stage(size_t s, const at::Tensor& x) const {
  c10::InferenceMode guard;
  if (s < deconv_w_.size()) {
    return norm_silu(at::conv_transpose2d(x, deconv_w_[s], {}, /*stride=*/2, /*padding=*/1));
  }
  const size_t k = s - deconv_w_.size();
  if (k >= conv_w_.size()) {
    throw Error(ErrorCode::kInternal,
                "head stage " + std::to_string(s) + " of " + std::to_string(head_stages()));
  }
  return norm_silu(at::conv2d(x, conv_w_[k], conv_b_[k]));
}

at::Tensor Network::classify(const at::Tensor& x) const {
  c10::InferenceMode guard;
  return at::conv2d(x, seg_w_, seg_b_);
}

std::optional<bool> mlp_column_split_exact(int64_t M, int64_t K, int64_t N, int64_t width,
                                           int64_t threads) {
  return column_split_known({M, K, N, width, threads});
}

int64_t mlp_columns_for(const CpuFeatures& cpu) {
  // Measured on Zen 3 (AVX2) and on Intel's AVX-512 cores (kMlpColumns). AMD's AVX-512 cores
  // (Zen 4, Zen 5) run MKL's other kernels beside caches of other sizes: whole until measured
  // there (SAPIENS_SEG_CPU_MLP_COLUMNS=1024 tries it, benchmarks/mlp_bench.cpp measures it).
  return cpu.amd && cpu.avx512_core() ? 0 : kMlpColumns;
}

}  // namespace sapiens_seg::core::v2
