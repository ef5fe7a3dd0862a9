#include "kernels_schedule.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "kernels/cudnn_hacc/attention.hpp"
#include "kernels/fastbb/fastbb.hpp"

namespace sapiens_seg::core::v2::kernels_schedule {
namespace {

namespace cudnn_hacc = kernels::cudnn_hacc;

constexpr double kRmsNormEps = 1e-6;  // every RMSNorm of the Sapiens2 backbone
constexpr auto kNone = kernels::fastbb::Activation::kNone;

std::string block_key(std::size_t i, const char* rest) {
  return "backbone.blocks." + std::to_string(i) + "." + rest;
}

}  // namespace

Weights prepare(const TensorMap& t, const Config& c, c10::Device device, at::ScalarType dtype) {
  c10::InferenceMode guard;
  Weights w;
  const std::int64_t C = c.embed_dim, H = c.heads, hd = c.head_dim;
  const std::int64_t hdp = cudnn_hacc::padded_head_dim(hd);
  w.head_dim = hd;
  w.padded_head_dim = hdp;
  // Every transformation runs in float32 on the host; each result is converted and uploaded
  // once, so the device never holds a float32 copy of a 16-bit model.
  auto f32 = [&](const std::string& key) { return t.at(key).to(at::kFloat); };
  auto put = [&](const at::Tensor& v) { return v.to(dtype).contiguous().to(device); };
  w.patch_w = put(f32("backbone.patch_embed.projection.weight").reshape({C, -1}));
  w.patch_b = put(f32("backbone.patch_embed.projection.bias"));
  w.prefix = put(at::cat({f32("backbone.cls_token"), f32("backbone.storage_tokens")}, 1)
                     .reshape({c.prefix_tokens(), C}));
  std::tie(w.rope_cos, w.rope_sin) =
      rope_tables(rope_periods(t, c).to(device), c.input_h / c.patch, c.input_w / c.patch);

  for (std::size_t i = 0; i < static_cast<std::size_t>(c.depth); ++i) {
    auto get = [&](const char* rest) { return f32(block_key(i, rest)); };
    Block b;
    b.kv_heads = c.kv_heads[i];
    const std::int64_t slots = H + 2 * b.kv_heads;
    b.ln1_w = put(get("ln1.weight"));
    b.qkv_w = put(cudnn_hacc::pad_head_rows(
        at::cat({get("attn.wq.weight"), get("attn.wk.weight"), get("attn.wv.weight")}), slots, hd,
        hdp));
    b.qkv_b = put(cudnn_hacc::pad_head_rows(
        at::cat({get("attn.wq.bias"), get("attn.wk.bias"), get("attn.wv.bias")}), slots, hd, hdp));
    b.q_norm_w = put(get("attn.q_norm.weight"));
    b.k_norm_w = put(get("attn.k_norm.weight"));
    // The layer scale stays a separate step: folded into the projection (gamma W) it would
    // push the products of a small gamma (the module initialises it to 1e-4) below float16's
    // normal range.
    b.proj_w = put(cudnn_hacc::pad_proj_weight(get("attn.proj.weight"), H, hd, hdp));
    b.proj_b = put(get("attn.proj.bias"));
    b.gamma = put(get("attn.gamma.weight"));
    b.ln2_w = put(get("ln2.weight"));
    b.w12_w = put(get("ffn.w12.weight"));
    b.w12_b = put(get("ffn.w12.bias"));
    b.w3_w = put(get("ffn.w3.weight"));
    b.w3_b = put(get("ffn.w3.bias"));
    w.blocks.push_back(std::move(b));
  }
  w.ln_w = put(f32("backbone.ln1.weight"));

  w.head = prepare_head_weights(t, c.deconv_channels.size(), c.conv_channels.size(), device, dtype);
  return w;
}

at::Tensor forward(const Weights& w, const Config& c, KernelOps& ops, const at::Tensor& x) {
  check_network_input(x, c.input_h, c.input_w);
  c10::InferenceMode guard;
  const auto opts = w.patch_w.options();
  const std::int64_t B = x.size(0), C = c.embed_dim, H = c.heads, F = c.mlp;
  const std::int64_t hd = w.head_dim, hdp = w.padded_head_dim;
  const std::int64_t gh = c.input_h / c.patch, gw = c.input_w / c.patch, P = gh * gw;
  const std::int64_t pre = c.prefix_tokens(), N = pre + P, M = B * N;

  // Tokens: per image the prefix (cls, storage), then the patch embedding as one GEMM.
  const at::Tensor pm =
      kernels::fastbb::patches(x.to(opts.device(), opts.dtype()).contiguous(), c.patch);
  at::Tensor tok = at::empty({M, C}, opts);
  for (std::int64_t b = 0; b < B; ++b) {
    const at::Tensor rows = tok.narrow(0, b * N, N);
    rows.narrow(0, 0, pre).copy_(w.prefix);
    ops.linear(pm.narrow(0, b * P, P), w.patch_w, w.patch_b, at::Tensor(), kNone,
               rows.narrow(0, pre, P));
  }

  at::Tensor h = at::empty({M, C}, opts);
  {
    std::int64_t widest = 0;
    for (const Block& b : w.blocks) widest = std::max(widest, (H + 2 * b.kv_heads) * hdp);
    at::Tensor qkv_store = at::empty({M * widest}, opts);
    at::Tensor o = at::empty({M, H * hdp}, opts);
    at::Tensor h12 = at::empty({M, 2 * F}, opts), gated = at::empty({M, F}, opts);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    for (const Block& b : w.blocks) {
      const std::int64_t slots = H + 2 * b.kv_heads;
      const at::Tensor qkv = qkv_store.narrow(0, 0, M * slots * hdp).view({M, slots * hdp});
      const at::Tensor qkv4 = qkv.view({B, N, slots, hdp});
      ops.rms_norm(tok, b.ln1_w, kRmsNormEps, h);
      ops.linear(h, b.qkv_w, b.qkv_b, at::Tensor(), kNone, qkv);
      ops.qk_norm_rope(qkv4, b.q_norm_w, b.k_norm_w, w.rope_cos, w.rope_sin,
                       {H, b.kv_heads, hd, pre, kRmsNormEps});
      ops.attention(qkv4, o.view({B, N, H, hdp}), scale);
      ops.linear(o, b.proj_w, b.proj_b, at::Tensor(), kNone, h);  // h is free after the qkv GEMM
      ops.scale_add(tok, h, b.gamma);
      ops.rms_norm(tok, b.ln2_w, kRmsNormEps, h);
      ops.linear(h, b.w12_w, b.w12_b, at::Tensor(), kNone, h12);
      ops.swiglu(h12, gated);
      ops.linear(gated, b.w3_w, b.w3_b, tok, kNone, tok);
    }
  }
  ops.rms_norm(tok, w.ln_w, kRmsNormEps, h);
  tok = at::Tensor();

  const std::int64_t K = w.head.classes, u = w.head.upscale(), oh = u * gh, ow = u * gw;
  at::Tensor logits = at::empty({B, oh, ow, K}, opts);
  for (std::int64_t b = 0; b < B; ++b) {
    const at::Tensor lg = ops.head(w.head, h.narrow(0, b * N + pre, P), gh, gw);
    logits[b].copy_(lg.narrow(1, 0, K).view({oh, ow, K}));
  }
  return logits.permute({0, 3, 1, 2});
}

std::vector<cudnn_hacc::SdpaKey> attention_keys(const Weights& w, const Config& c,
                                                at::ScalarType dtype, int device) {
  const std::int64_t N = c.prefix_tokens() + (c.input_h / c.patch) * (c.input_w / c.patch);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(w.head_dim)));
  std::vector<cudnn_hacc::SdpaKey> keys;
  for (const Block& b : w.blocks) {
    const cudnn_hacc::SdpaKey k = cudnn_hacc::packed_key(
        1, c.heads, b.kv_heads, N, w.padded_head_dim,
        dtype == at::kHalf ? kernels::DType::kF16 : kernels::DType::kBF16, scale, device);
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  }
  return keys;
}

}  // namespace sapiens_seg::core::v2::kernels_schedule
