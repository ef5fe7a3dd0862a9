#include "vit_seg.hpp"

#include <cmath>
#include <sstream>
#include <vector>

#include <c10/core/InferenceMode.h>

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core::v1 {
namespace {

constexpr double kLayerNormEps = 1e-6;     // every LayerNorm of the backbone
constexpr double kInstanceNormEps = 1e-5;  // InstanceNorm2d defaults in the head

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
  return os.str();
}

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
  std::map<std::string, std::vector<int64_t>> want = {
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
  std::vector<std::string> missing, unexpected, bad_shape, bad_dtype;
  for (const auto& [key, shape] : want) {
    auto it = tensors.find(key);
    if (it == tensors.end()) {
      missing.push_back(key);
    } else if (it->second.sizes() != at::IntArrayRef(shape)) {
      bad_shape.push_back(key + " " + shape_str(it->second.sizes()) + " (expected " +
                          shape_str(shape) + ")");
    } else if (!(it->second.scalar_type() == at::kFloat || it->second.scalar_type() == at::kHalf ||
                 it->second.scalar_type() == at::kBFloat16)) {
      bad_dtype.push_back(key + " " + std::string(c10::toString(it->second.scalar_type())) +
                          " (expected float32, float16 or bfloat16)");
    }
  }
  for (const auto& [key, value] : tensors) {
    if (!want.count(key) && !is_ignored(key)) unexpected.push_back(key);
  }
  if (!missing.empty() || !unexpected.empty() || !bad_shape.empty() || !bad_dtype.empty()) {
    std::ostringstream os;
    os << "the tensors do not match the layout derived from the checkpoint (embed " << C
       << ", depth " << c.depth << ", mlp " << F << ", head " << HC << ", classes " << K << ")";
    auto list = [&os](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      os << "\n  " << what << " (" << v.size() << "):";
      for (const auto& s : v) os << "\n    " << s;
    };
    list("missing tensors", missing);
    list("unexpected tensors", unexpected);
    list("wrong shape", bad_shape);
    list("wrong dtype", bad_dtype);
    refuse(os.str());
  }
  return c;
}

Network::Network(const TensorMap& t, Config config, at::Device device, at::ScalarType dtype)
    : config_(config), dtype_(dtype), device_(device) {
  c10::InferenceMode guard;
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
  const int idx[3] = {0, 3, 6};
  for (int s = 0; s < 3; ++s) {
    deconv_w_[s] = get("decode_head.deconv_layers." + std::to_string(idx[s]) + ".weight");
    conv_w_[s] = get("decode_head.conv_layers." + std::to_string(idx[s]) + ".weight");
    conv_b_[s] = get("decode_head.conv_layers." + std::to_string(idx[s]) + ".bias");
  }
  seg_w_ = get("decode_head.conv_seg.weight");
  seg_b_ = get("decode_head.conv_seg.bias");
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
  const int64_t gh = c.input_h / c.patch, gw = c.input_w / c.patch, N = gh * gw;
  at::Tensor x = input.to(device_, dtype_);

  // Patch embedding: token n = row * gw + col, as flatten(2).transpose(1,2) orders them.
  x = at::conv2d(x, patch_w_, patch_b_, {c.patch, c.patch});
  x = x.flatten(2).transpose(1, 2).contiguous();
  x.add_(pos_embed_);

  for (const Block& b : blocks_) {
    at::Tensor h = at::layer_norm(x, {C}, b.ln1_w, b.ln1_b, kLayerNormEps);
    at::Tensor qkv = at::linear(h, b.qkv_w, b.qkv_b).view({B, N, 3, c.heads, hd});
    qkv = qkv.permute({2, 0, 3, 1, 4});  // [3, B, heads, N, hd]; rows of qkv.weight are Q, K, V
    at::Tensor o = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2]);
    o = o.transpose(1, 2).reshape({B, N, C});
    x.add_(at::linear(o, b.proj_w, b.proj_b));
    h = at::layer_norm(x, {C}, b.ln2_w, b.ln2_b, kLayerNormEps);
    h = at::gelu(at::linear(h, b.fc1_w, b.fc1_b));  // exact erf GELU, as nn.GELU()
    x.add_(at::linear(h, b.fc2_w, b.fc2_b));
  }
  x = at::layer_norm(x, {C}, ln_w_, ln_b_, kLayerNormEps);
  x = x.view({B, gh, gw, C}).permute({0, 3, 1, 2}).contiguous();

  auto norm_silu = [](at::Tensor y) {
    y = at::instance_norm(y, {}, {}, {}, {}, /*use_input_stats=*/true, /*momentum=*/0.1,
                          kInstanceNormEps, /*cudnn_enabled=*/false);
    return at::silu_(y);
  };
  for (int s = 0; s < 3; ++s) {
    x = norm_silu(at::conv_transpose2d(x, deconv_w_[s], {}, /*stride=*/2, /*padding=*/1));
  }
  for (int s = 0; s < 3; ++s) {
    x = norm_silu(at::conv2d(x, conv_w_[s], conv_b_[s]));
  }
  return at::conv2d(x, seg_w_, seg_b_);
}

}  // namespace sapiens_seg::core::v1
