#include "kernel_ops.hpp"

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "attention/rope.hpp"
#include "checkpoint/layout.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core {
namespace {

class AtenOps final : public KernelOps {
 public:
  void layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                  const at::Tensor& out) override {
    out.copy_(at::layer_norm(x, {x.size(-1)}, w, b, eps));
  }

  void rms_norm(const at::Tensor& x, const at::Tensor& w, double eps,
                const at::Tensor& out) override {
    out.copy_(at::rms_norm(x, {x.size(-1)}, w, eps));
  }

  void linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
              const at::Tensor& residual, kernels::fastbb::Activation act,
              const at::Tensor& out) override {
    at::Tensor y = at::linear(x, w, b);
    if (residual.defined()) y = residual + y;
    if (act != kernels::fastbb::Activation::kNone) {
      y = at::gelu(y, act == kernels::fastbb::Activation::kGeluErf ? "none" : "tanh");
    }
    out.copy_(y);
  }

  void attention(const at::Tensor& qkv, const at::Tensor& out, float scale) override {
    const std::int64_t H = out.size(2), kv = (qkv.size(2) - H) / 2;
    const at::Tensor q = qkv.narrow(2, 0, H).transpose(1, 2);
    at::Tensor k = qkv.narrow(2, H, kv).transpose(1, 2);
    at::Tensor v = qkv.narrow(2, H + kv, kv).transpose(1, 2);
    if (kv != H) {  // key/value head g serves query heads g*f .. g*f+f-1
      k = k.repeat_interleave(H / kv, 1);
      v = v.repeat_interleave(H / kv, 1);
    }
    const at::Tensor o = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{},
                                                          /*dropout_p=*/0.0, /*is_causal=*/false,
                                                          static_cast<double>(scale));
    out.copy_(o.transpose(1, 2));
  }

  void qk_norm_rope(const at::Tensor& qkv, const at::Tensor& q_w, const at::Tensor& k_w,
                    const at::Tensor& cos, const at::Tensor& sin,
                    const kernels::fastbb::QkRope& p) override {
    const std::int64_t hd = p.head_dim, P = qkv.size(1) - p.prefix;
    const at::Tensor c = cos.view({1, P, 1, hd}), s = sin.view({1, P, 1, hd});
    for (const bool keys : {false, true}) {
      const at::Tensor v =
          qkv.narrow(2, keys ? p.q_heads : 0, keys ? p.k_heads : p.q_heads).narrow(3, 0, hd);
      const at::Tensor& w = keys ? k_w : q_w;
      // The portable network's order: the norm in the model dtype, then bf16 for the rotation.
      at::Tensor n = at::rms_norm(v, {hd}, w.narrow(0, 0, hd), p.eps).to(at::kBFloat16);
      at::Tensor r = n.narrow(1, p.prefix, P);
      r = r.mul(c).add(attention::rotate_half(r).mul(s));
      v.copy_(at::cat({n.narrow(1, 0, p.prefix), r}, 1));
    }
  }

  void scale_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gamma) override {
    x.copy_(x + y.mul(gamma));
  }

  void swiglu(const at::Tensor& h, const at::Tensor& out) override {
    const auto halves = h.chunk(2, -1);
    out.copy_(at::silu(halves[0]).mul(halves[1]));
  }

  at::Tensor head(const kernels::seg_up::HeadWeights& w, const at::Tensor& feat, std::int64_t gh,
                  std::int64_t gw) override {
    return kernels::seg_up::head_forward_reference(w, feat, gh, gw);
  }
};

}  // namespace

std::unique_ptr<KernelOps> aten_kernel_ops() {
  return std::make_unique<AtenOps>();
}

kernels::seg_up::HeadWeights prepare_head_weights(const TensorMap& t, std::size_t deconvs,
                                                  std::size_t convs, c10::Device device,
                                                  at::ScalarType dtype) {
  std::vector<at::Tensor> deconv, conv_w, conv_b;
  for (std::size_t s = 0; s < deconvs; ++s) {
    deconv.push_back(t.at("decode_head.deconv_layers." + std::to_string(3 * s) + ".weight"));
  }
  for (std::size_t s = 0; s < convs; ++s) {
    const std::string p = "decode_head.conv_layers." + std::to_string(3 * s);
    conv_w.push_back(t.at(p + ".weight"));
    conv_b.push_back(t.at(p + ".bias"));
  }
  return kernels::seg_up::prepare_head(deconv, conv_w, conv_b, t.at("decode_head.conv_seg.weight"),
                                       t.at("decode_head.conv_seg.bias"), device, dtype);
}

void check_network_input(const at::Tensor& x, std::int64_t input_h, std::int64_t input_w) {
  if (x.dim() != 4 || x.size(0) < 1 || x.size(1) != 3 || x.size(2) != input_h ||
      x.size(3) != input_w) {
    throw Error(ErrorCode::kInvalidInput, "network input must be [B,3," + std::to_string(input_h) +
                                              "," + std::to_string(input_w) + "], got " +
                                              shape_str(x.sizes()));
  }
}

}  // namespace sapiens_seg::core
