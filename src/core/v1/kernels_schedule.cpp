#include "kernels_schedule.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <string>

#include "kernels/cudnn_hacc/attention.hpp"
#include "kernels/fastbb/fastbb.hpp"

namespace sapiens_seg::core::v1::kernels_schedule {
namespace {

namespace cudnn_hacc = kernels::cudnn_hacc;
using kernels::fastbb::Activation;

constexpr double kLayerNormEps = 1e-6;  // every LayerNorm of the v1 backbone

}  // namespace

Weights prepare(const TensorMap& t, const Config& c, c10::Device device, at::ScalarType dtype) {
  c10::InferenceMode guard;
  Weights w;
  const std::int64_t C = c.embed_dim, H = c.heads, hd = c.head_dim();
  const std::int64_t hdp = cudnn_hacc::padded_head_dim(hd);
  w.head_dim = hd;
  w.padded_head_dim = hdp;
  // Each weight is converted on the host and uploaded once in the target dtype: the device
  // never holds a float32 copy of the model.
  auto put = [&](const at::Tensor& v) { return v.to(dtype).contiguous().to(device); };
  auto get = [&](const std::string& key) { return put(t.at(key)); };
  w.patch_w = put(t.at("backbone.patch_embed.projection.weight").reshape({C, -1}));
  w.patch_b = get("backbone.patch_embed.projection.bias");

  // The position embedding at the input grid (bicubic, align_corners=False, fp32, as the
  // authors' eager model and the portable backend do for another input size).
  at::Tensor pos = t.at("backbone.pos_embed").to(at::kFloat);
  const std::int64_t gh = c.input_h / c.patch, gw = c.input_w / c.patch;
  if (gh != c.grid_h || gw != c.grid_w) {
    pos = pos.reshape({1, c.grid_h, c.grid_w, C}).permute({0, 3, 1, 2});
    pos = at::upsample_bicubic2d(pos, {gh, gw}, /*align_corners=*/false);
    pos = pos.flatten(2).transpose(1, 2);
  }
  w.pos = put(pos.reshape({gh * gw, C}));

  for (std::int64_t i = 0; i < c.depth; ++i) {
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    Block b;
    b.ln1_w = get(p + "ln1.weight");
    b.ln1_b = get(p + "ln1.bias");
    b.qkv_w = put(cudnn_hacc::pad_qkv_weight(t.at(p + "attn.qkv.weight"), H, hd, hdp));
    b.qkv_b = put(cudnn_hacc::pad_qkv_bias(t.at(p + "attn.qkv.bias"), H, hd, hdp));
    b.proj_w = put(cudnn_hacc::pad_proj_weight(t.at(p + "attn.proj.weight"), H, hd, hdp));
    b.proj_b = get(p + "attn.proj.bias");
    b.ln2_w = get(p + "ln2.weight");
    b.ln2_b = get(p + "ln2.bias");
    b.fc1_w = get(p + "ffn.layers.0.0.weight");
    b.fc1_b = get(p + "ffn.layers.0.0.bias");
    b.fc2_w = get(p + "ffn.layers.1.weight");
    b.fc2_b = get(p + "ffn.layers.1.bias");
    w.blocks.push_back(std::move(b));
  }
  w.ln_w = get("backbone.ln1.weight");
  w.ln_b = get("backbone.ln1.bias");

  w.head = prepare_head_weights(t, /*deconvs=*/3, /*convs=*/3, device, dtype);
  return w;
}

at::Tensor forward(const Weights& w, const Config& c, KernelOps& ops, const at::Tensor& x) {
  return head(w, c, ops, backbone(w, c, ops, x), x.size(0));
}

at::Tensor backbone(const Weights& w, const Config& c, KernelOps& ops, const at::Tensor& x) {
  check_network_input(x, c.input_h, c.input_w);
  c10::InferenceMode guard;
  const auto opts = w.patch_w.options();
  const std::int64_t B = x.size(0), C = c.embed_dim, H = c.heads, hdp = w.padded_head_dim;
  const std::int64_t gh = c.input_h / c.patch, gw = c.input_w / c.patch, N = gh * gw, M = B * N;

  // Patch embedding: one GEMM per image, with the position embedding as the residual.
  const at::Tensor pm =
      kernels::fastbb::patches(x.to(opts.device(), opts.dtype()).contiguous(), c.patch);
  at::Tensor tok = at::empty({M, C}, opts);
  for (std::int64_t b = 0; b < B; ++b) {
    ops.linear(pm.narrow(0, b * N, N), w.patch_w, w.patch_b, w.pos, Activation::kNone,
               tok.narrow(0, b * N, N));
  }

  at::Tensor h = at::empty({M, C}, opts);
  {
    at::Tensor qkv = at::empty({M, 3 * H * hdp}, opts);
    at::Tensor o = at::empty({M, H * hdp}, opts);
    at::Tensor hidden = at::empty({M, c.mlp}, opts);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(w.head_dim)));
    for (const Block& b : w.blocks) {
      ops.layer_norm(tok, b.ln1_w, b.ln1_b, kLayerNormEps, h);
      ops.linear(h, b.qkv_w, b.qkv_b, at::Tensor(), Activation::kNone, qkv);
      ops.attention(qkv.view({B, N, 3 * H, hdp}), o.view({B, N, H, hdp}), scale);
      ops.linear(o, b.proj_w, b.proj_b, tok, Activation::kNone, tok);
      ops.layer_norm(tok, b.ln2_w, b.ln2_b, kLayerNormEps, h);
      ops.linear(h, b.fc1_w, b.fc1_b, at::Tensor(), Activation::kGeluErf, hidden);
      ops.linear(hidden, b.fc2_w, b.fc2_b, tok, Activation::kNone, tok);
    }
  }
  ops.layer_norm(tok, w.ln_w, w.ln_b, kLayerNormEps, h);
  return h;
}

at::Tensor head(const Weights& w, const Config& c, KernelOps& ops, const at::Tensor& feat,
                std::int64_t batch) {
  c10::InferenceMode guard;
  const std::int64_t gh = c.input_h / c.patch, gw = c.input_w / c.patch, N = gh * gw;
  TORCH_CHECK(feat.dim() == 2 && feat.size(0) == batch * N, "head: features must be [", batch * N,
              ", C], got ", feat.sizes());
  const std::int64_t K = w.head.classes, u = w.head.upscale(), oh = u * gh, ow = u * gw;
  at::Tensor logits = at::empty({batch, oh, ow, K}, feat.options());
  for (std::int64_t b = 0; b < batch; ++b) {
    const at::Tensor lg = ops.head(w.head, feat.narrow(0, b * N, N), gh, gw);
    logits[b].copy_(lg.narrow(1, 0, K).view({oh, ow, K}));
  }
  return logits.permute({0, 3, 1, 2});
}

std::vector<cudnn_hacc::SdpaKey> attention_keys(const Weights& w, const Config& c,
                                                at::ScalarType dtype, int device) {
  const std::int64_t N = (c.input_h / c.patch) * (c.input_w / c.patch);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(w.head_dim)));
  return {cudnn_hacc::packed_key(1, c.heads, c.heads, N, w.padded_head_dim,
                                 dtype == at::kHalf ? kernels::DType::kF16 : kernels::DType::kBF16,
                                 scale, device)};
}

}  // namespace sapiens_seg::core::v1::kernels_schedule
