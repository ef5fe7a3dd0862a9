// The `kernels` Runners: Sapiens v1 (the network of v1/vit_seg.cpp) and Sapiens2 (the schedule
// of v2/kernels_schedule.cpp) composed from the CUDA kernel families in kernels/ (fastbb,
// cudnn_hacc, seg_up). Compiled only into CUDA builds (SAPIENS_SEG_WITH_KERNELS); backends.cpp
// has the stand-ins otherwise.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <cmath>
#include <mutex>
#include <vector>

#include "backends.hpp"
#include "kernels/cudnn_hacc/attention.hpp"
#include "kernels/fastbb/fastbb.hpp"
#include "kernels/seg_up/head.hpp"
#include "sapiens_seg/error.hpp"
#include "v2/kernels_schedule.hpp"

namespace sapiens_seg::core {
namespace {

namespace fastbb = kernels::fastbb;
namespace cudnn_hacc = kernels::cudnn_hacc;
namespace seg_up = kernels::seg_up;

constexpr double kLayerNormEps = 1e-6;  // every LayerNorm of the v1 backbone

// What both families' runners share: the cuBLASLt and cuDNN state, and the ordering of forward
// passes. One pass at a time: the GEMM workspace and the cuDNN handle are shared. Calls come on
// different streams, so a pass's stream also waits until the previous pass's kernels are done
// with the workspaces (not while a CUDA graph is being captured: the graph runner orders its
// replays itself, and a capture may not wait on work recorded outside it).
class KernelsRunner : public Runner {
 public:
  KernelsRunner(c10::Device device, at::ScalarType dtype)
      : device_(device),
        dtype_(dtype),
        backend_{"kernels", device_name(device), dtype_name(dtype)} {
    const c10::cuda::CUDAGuard guard(device);
    gemm_ = std::make_unique<fastbb::Gemm>(device);
    attn_ = std::make_unique<cudnn_hacc::Attention>(device);
  }

  at::Tensor forward(const at::Tensor& x) const final {
    return forward_device(x).to(at::kCPU, at::kFloat).contiguous();
  }

  at::Tensor forward_device(const at::Tensor& x) const final {
    std::lock_guard<std::mutex> lock(mu_);
    c10::InferenceMode inference;
    const c10::cuda::CUDAGuard guard(device_);
    const auto stream = at::cuda::getCurrentCUDAStream(device_.index());
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    const bool order = capturing == cudaStreamCaptureStatusNone;
    if (order) done_.block(stream);
    struct Release {
      at::cuda::CUDAEvent& e;
      at::cuda::CUDAStream s;
      bool on;
      ~Release() {
        try {
          if (on) e.record(s);
        } catch (...) {  // a failing device reports itself on the next call
        }
      }
    } release{done_, stream, order};
    return run(x);
  }

  c10::Device device() const final { return device_; }

  const Backend& backend() const final { return backend_; }

 protected:
  // The pass itself, under the lock, on the current stream. Returns the logits as
  // forward_device documents them.
  virtual at::Tensor run(const at::Tensor& x) const = 0;

  c10::Device device_;
  at::ScalarType dtype_;
  std::unique_ptr<fastbb::Gemm> gemm_;
  std::unique_ptr<cudnn_hacc::Attention> attn_;

 private:
  mutable std::mutex mu_;
  mutable at::cuda::CUDAEvent done_;  // the last pass's use of the shared workspaces
  Backend backend_;
};

class KernelsV1 final : public KernelsRunner {
 public:
  KernelsV1(const TorchScriptCheckpoint& ckpt, const v1::Config& cfg, c10::Device device,
            at::ScalarType dtype)
      : KernelsRunner(device, dtype), cfg_(cfg) {
    const c10::cuda::CUDAGuard guard(device);
    c10::InferenceMode inference;
    hd_ = cfg.head_dim();
    hdp_ = cudnn_hacc::padded_head_dim(hd_);

    const TensorMap& t = ckpt.tensors;
    // Each weight is converted on the host and uploaded once in the target dtype: the device
    // never holds a float32 copy of the model.
    auto put = [&](const at::Tensor& v) { return v.to(dtype).contiguous().to(device); };
    auto get = [&](const std::string& key) { return put(t.at(key)); };
    const int64_t C = cfg.embed_dim;
    patch_w_ = put(t.at("backbone.patch_embed.projection.weight").reshape({C, -1}));
    patch_b_ = get("backbone.patch_embed.projection.bias");

    // The position embedding at the input grid (bicubic, align_corners=False, fp32, as the
    // authors' eager model and the portable backend do for another input size).
    at::Tensor pos = t.at("backbone.pos_embed").to(at::kFloat);
    const int64_t gh = cfg.input_h / cfg.patch, gw = cfg.input_w / cfg.patch;
    if (gh != cfg.grid_h || gw != cfg.grid_w) {
      pos = pos.reshape({1, cfg.grid_h, cfg.grid_w, C}).permute({0, 3, 1, 2});
      pos = at::upsample_bicubic2d(pos, {gh, gw}, /*align_corners=*/false);
      pos = pos.flatten(2).transpose(1, 2);
    }
    pos_ = put(pos.reshape({gh * gw, C}));

    for (int64_t i = 0; i < cfg.depth; ++i) {
      const std::string p = "backbone.layers." + std::to_string(i) + ".";
      Block b;
      b.ln1_w = get(p + "ln1.weight");
      b.ln1_b = get(p + "ln1.bias");
      b.qkv_w = put(cudnn_hacc::pad_qkv_weight(t.at(p + "attn.qkv.weight"), cfg.heads, hd_, hdp_));
      b.qkv_b = put(cudnn_hacc::pad_qkv_bias(t.at(p + "attn.qkv.bias"), cfg.heads, hd_, hdp_));
      b.proj_w =
          put(cudnn_hacc::pad_proj_weight(t.at(p + "attn.proj.weight"), cfg.heads, hd_, hdp_));
      b.proj_b = get(p + "attn.proj.bias");
      b.ln2_w = get(p + "ln2.weight");
      b.ln2_b = get(p + "ln2.bias");
      b.fc1_w = get(p + "ffn.layers.0.0.weight");
      b.fc1_b = get(p + "ffn.layers.0.0.bias");
      b.fc2_w = get(p + "ffn.layers.1.weight");
      b.fc2_b = get(p + "ffn.layers.1.bias");
      blocks_.push_back(std::move(b));
    }
    ln_w_ = get("backbone.ln1.weight");
    ln_b_ = get("backbone.ln1.bias");
    std::vector<at::Tensor> deconv, conv_w, conv_b;
    for (int s = 0; s < 3; ++s) {
      const std::string i = std::to_string(3 * s);
      deconv.push_back(t.at("decode_head.deconv_layers." + i + ".weight"));
      conv_w.push_back(t.at("decode_head.conv_layers." + i + ".weight"));
      conv_b.push_back(t.at("decode_head.conv_layers." + i + ".bias"));
    }
    head_ = seg_up::prepare_head(deconv, conv_w, conv_b, t.at("decode_head.conv_seg.weight"),
                                 t.at("decode_head.conv_seg.bias"), device, dtype);
  }

  // Logits [B, K, 8gh, 8gw] as a view of a channels-last [B, 8gh, 8gw, K] tensor on the GPU, in
  // the compute dtype: seg_up's upsample + argmax reads that layout directly.
  at::Tensor run(const at::Tensor& x) const override {
    const auto& c = cfg_;
    if (x.dim() != 4 || x.size(1) != 3 || x.size(2) != c.input_h || x.size(3) != c.input_w) {
      throw Error(ErrorCode::kInvalidInput, "network input must be [B,3," +
                                                std::to_string(c.input_h) + "," +
                                                std::to_string(c.input_w) + "]");
    }
    const int64_t B = x.size(0), C = c.embed_dim, H = c.heads;
    const int64_t gh = c.input_h / c.patch, gw = c.input_w / c.patch, N = gh * gw, M = B * N;
    const auto opts = at::TensorOptions().dtype(dtype_).device(device_);

    // Patch embedding: one GEMM per image, with the position embedding as the residual.
    const at::Tensor pm = fastbb::patches(x.to(device_, dtype_), c.patch);
    at::Tensor tok = at::empty({M, C}, opts);
    for (int64_t b = 0; b < B; ++b) {
      gemm_->linear(pm.narrow(0, b * N, N), patch_w_, patch_b_, pos_, fastbb::Activation::kNone,
                    tok.narrow(0, b * N, N));
    }

    at::Tensor h = at::empty({M, C}, opts);
    {
      at::Tensor qkv = at::empty({M, 3 * H * hdp_}, opts);
      at::Tensor o = at::empty({M, H * hdp_}, opts);
      at::Tensor hidden = at::empty({M, c.mlp}, opts);
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd_)));
      for (const Block& b : blocks_) {
        fastbb::layer_norm(tok, b.ln1_w, b.ln1_b, kLayerNormEps, h);
        gemm_->linear(h, b.qkv_w, b.qkv_b, at::Tensor(), fastbb::Activation::kNone, qkv);
        attn_->packed_qkv(qkv.view({B, N, 3, H, hdp_}), o.view({B, N, H, hdp_}), scale);
        gemm_->linear(o, b.proj_w, b.proj_b, tok, fastbb::Activation::kNone, tok);
        fastbb::layer_norm(tok, b.ln2_w, b.ln2_b, kLayerNormEps, h);
        gemm_->linear(h, b.fc1_w, b.fc1_b, at::Tensor(), fastbb::Activation::kGeluErf, hidden);
        gemm_->linear(hidden, b.fc2_w, b.fc2_b, tok, fastbb::Activation::kNone, tok);
      }
    }
    fastbb::layer_norm(tok, ln_w_, ln_b_, kLayerNormEps, h);
    tok = at::Tensor();

    const int64_t K = head_.classes, oh = 8 * gh, ow = 8 * gw;
    at::Tensor logits = at::empty({B, oh, ow, K}, opts);
    for (int64_t b = 0; b < B; ++b) {
      const at::Tensor lg = seg_up::head_forward(*gemm_, head_, h.narrow(0, b * N, N), gh, gw);
      logits[b].copy_(lg.narrow(1, 0, K).view({oh, ow, K}));
    }
    return logits.permute({0, 3, 1, 2});
  }

 private:
  struct Block {
    at::Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  v1::Config cfg_;
  int64_t hd_ = 0, hdp_ = 0;
  at::Tensor patch_w_, patch_b_, pos_;
  std::vector<Block> blocks_;
  at::Tensor ln_w_, ln_b_;
  seg_up::HeadWeights head_;
};

namespace schedule = v2::kernels_schedule;

// The Sapiens2 schedule's steps on the kernels.
class CudaOps final : public schedule::Ops {
 public:
  CudaOps(fastbb::Gemm& gemm, cudnn_hacc::Attention& attn) : gemm_(gemm), attn_(attn) {}

  void rms_norm(const at::Tensor& x, const at::Tensor& w, double eps,
                const at::Tensor& out) override {
    fastbb::rms_norm(x, w, eps, out);
  }
  void linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
              const at::Tensor& residual, const at::Tensor& out) override {
    gemm_.linear(x, w, b, residual, fastbb::Activation::kNone, out);
  }
  void qk_norm_rope(const at::Tensor& qkv, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                    const at::Tensor& q_w, const at::Tensor& k_w, const at::Tensor& cos,
                    const at::Tensor& sin, int64_t prefix, double eps) override {
    fastbb::qk_norm_rope_(qkv, q_w, k_w, cos, sin, {q_heads, kv_heads, head_dim, prefix, eps});
  }
  void attention(const at::Tensor& qkv, const at::Tensor& out, float scale) override {
    attn_.packed_qkv(qkv, out, scale);
  }
  void scale_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gamma) override {
    fastbb::scale_add_(x, y, gamma);
  }
  void swiglu(const at::Tensor& h, const at::Tensor& out) override { fastbb::swiglu(h, out); }
  at::Tensor head(const seg_up::HeadWeights& w, const at::Tensor& feat, int64_t gh,
                  int64_t gw) override {
    return seg_up::head_forward(gemm_, w, feat, gh, gw);
  }

 private:
  fastbb::Gemm& gemm_;
  cudnn_hacc::Attention& attn_;
};

class KernelsV2 final : public KernelsRunner {
 public:
  KernelsV2(const TensorMap& tensors, const v2::Config& cfg, c10::Device device,
            at::ScalarType dtype)
      : KernelsRunner(device, dtype), cfg_(cfg) {
    const c10::cuda::CUDAGuard guard(device);
    weights_ = schedule::prepare(tensors, cfg, device, dtype);
  }

  // Logits [B, K, H, W] as a view of a channels-last tensor on the GPU, in the compute dtype.
  at::Tensor run(const at::Tensor& x) const override {
    CudaOps ops(*gemm_, *attn_);
    return schedule::forward(weights_, cfg_, ops, x);
  }

 private:
  v2::Config cfg_;
  schedule::Weights weights_;
};

// Set-up failures (cuBLASLt or cuDNN refusing this GPU, a head dim cuDNN cannot run) say why
// the mode cannot run here, as the availability checks do.
template <typename Make>
std::unique_ptr<Runner> make_kernels(c10::Device device, at::ScalarType dtype, Make&& make) {
  const std::string why = kernels_unavailable_reason(device);
  if (!why.empty()) throw Error(ErrorCode::kBackendUnavailable, "kernels mode unavailable: " + why);
  if (dtype != at::kHalf && dtype != at::kBFloat16) {
    throw Error(ErrorCode::kBackendUnavailable,
                "the kernels mode runs float16 or bfloat16 (cuDNN's fused attention has no " +
                    dtype_name(dtype) + " path); use the portable mode for " + dtype_name(dtype));
  }
  try {
    return make();
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw Error(ErrorCode::kBackendUnavailable,
                "kernels mode unavailable: " + what.substr(0, what.find('\n')));
  } catch (const std::runtime_error& e) {
    throw Error(ErrorCode::kBackendUnavailable,
                std::string("kernels mode unavailable: ") + e.what());
  }
}

}  // namespace

std::pair<int, int> cuda_capability(int index) {
  if (!at::hasCUDA() || index < 0 || index >= static_cast<int>(at::cuda::device_count())) {
    return {0, 0};
  }
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(index);
  return {p->major, p->minor};
}

std::unique_ptr<Runner> make_kernels_v1(const TorchScriptCheckpoint& ckpt, const v1::Config& cfg,
                                        c10::Device device, at::ScalarType dtype) {
  return make_kernels(device, dtype,
                      [&] { return std::make_unique<KernelsV1>(ckpt, cfg, device, dtype); });
}

std::unique_ptr<Runner> make_kernels_v2(const TensorMap& tensors, const v2::Config& cfg,
                                        c10::Device device, at::ScalarType dtype) {
  return make_kernels(device, dtype,
                      [&] { return std::make_unique<KernelsV2>(tensors, cfg, device, dtype); });
}

}  // namespace sapiens_seg::core
