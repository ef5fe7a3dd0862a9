// cudnn_hacc: multi-head attention through cuDNN's fused scaled-dot-product attention (the
// cudnn-frontend graph API), reading Q, K and V in place from the packed output of the qkv GEMM.
//
// Layout: the qkv GEMM writes [B, S, H + 2*Hk, D] (its weight rows are the H query heads, then
// the Hk key heads, then the Hk value heads; Hk = H for v1's [B, S, 3, H, D], fewer for Sapiens2's
// grouped-query blocks), so Q is [B, H, S, D] and K, V are [B, Hk, S, D] with strides
// {S*W, D, W, 1} (W = (H + 2*Hk)*D) at offsets 0, H*D and (H + Hk)*D; cuDNN maps query head h to
// key/value head h / (H / Hk), the grouping of repeat_interleave. The output is written as
// [B, S, H, D], which is the projection GEMM's input as is. No transpose kernel runs on either
// side.
//
// Head dims: cuDNN wants D to be a multiple of 8. Sapiens uses 64 (v1 0.3b/1b, Sapiens2
// 0.4b/1b), 80 (v1 0.6b, Sapiens2 0.8b), 60 (v1 2b) and 76 (Sapiens2 5b). The last two are
// padded to 64 and 80 at load time, in the weights: zero rows in the qkv weight and bias make
// every head's Q, K and V end in zeros (so Q.K^T and the softmax are unchanged, and the output's
// padding columns are zero), and zero columns in the projection weight skip them. The
// attention scale stays 1/sqrt(true head dim).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kernels/common.hpp"

namespace sapiens_seg::kernels::cudnn_hacc {

constexpr std::int64_t kMaxHeadDim = 256;

// The head dim cuDNN runs for `head_dim`: the next multiple of 8. Throws c10::Error for head
// dims outside 1..256.
std::int64_t padded_head_dim(std::int64_t head_dim);

// qkv weight [3*H*hd, C] -> [3*H*hdp, C] and bias [3*H*hd] -> [3*H*hdp], zeros in the padding;
// projection weight [C, H*hd] -> [C, H*hdp], zero columns in the padding. The tensors come back
// unchanged when hdp == hd. Any device and dtype. pad_head_rows is the general form: `slots`
// heads of hd rows each (a weight [slots*hd, C] or a bias/norm weight [slots*hd]).
at::Tensor pad_head_rows(const at::Tensor& t, std::int64_t slots, std::int64_t hd,
                         std::int64_t hdp);
at::Tensor pad_qkv_weight(const at::Tensor& w, std::int64_t heads, std::int64_t hd,
                          std::int64_t hdp);
at::Tensor pad_qkv_bias(const at::Tensor& b, std::int64_t heads, std::int64_t hd, std::int64_t hdp);
at::Tensor pad_proj_weight(const at::Tensor& w, std::int64_t heads, std::int64_t hd,
                           std::int64_t hdp);

// What a built cuDNN graph depends on; graphs are cached per key.
struct SdpaKey {
  std::int64_t b = 0, h = 0, hk = 0, s = 0, d = 0;  // hk: key/value heads
  DType dtype = DType::kF16;
  std::array<std::int64_t, 4> qkv_stride{}, o_stride{};  // [B, H, S, D] strides, elements
  std::int64_t k_offset = 0, v_offset = 0;               // elements from the start of qkv
  float scale = 0.f;
  int device = 0;
  bool operator==(const SdpaKey&) const = default;
};

struct SdpaKeyHash {
  std::size_t operator()(const SdpaKey& k) const noexcept;
};

// The key of a packed [B, S, H + 2*Hk, D] qkv and its [B, S, H, D] output (the layout
// packed_qkv_key describes), from the sizes alone. Host logic.
SdpaKey packed_key(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t s, std::int64_t d,
                   DType dtype, float scale, int device);

// What decides whether cuDNN runs a fused-attention configuration: the versions, the GPU, and
// what cudnn-frontend's own checks (validate, support, plan build) said about the graph.
struct SdpaSupport {
  std::int64_t cudnn_runtime = 0;   // cudnnGetVersion() of the library loaded
  std::int64_t cudnn_compiled = 0;  // CUDNN_VERSION of the headers built against
  int sm_major = 0, sm_minor = 0;
  SdpaKey key;
  std::string frontend_error;  // empty: the frontend built a plan
};

// "" when the configuration can run, else why not, naming the cuDNN version, the shape and the
// GPU: the message of the kernels mode's BackendUnavailable error at load. Host logic.
std::string sdpa_unsupported_reason(const SdpaSupport& s);

// "9.19.0" from cudnnGetVersion()'s 91900 (cuDNN 9: major*10000 + minor*100 + patch; cuDNN 8:
// major*1000 + minor*100 + patch).
std::string cudnn_version_string(std::int64_t v);

// Checks a packed qkv [B, S, 3, H, D] or [B, S, H + 2*Hk, D] (H from out; Hk must divide H) and
// an output [B, S, H, D] (contiguous, one dtype among float16/bfloat16, D a multiple of 8 up to
// 256, same device) and returns the graph key. Host logic only: runs on CPU tensors too.
SdpaKey packed_qkv_key(const at::Tensor& qkv, const at::Tensor& out, float scale);

// A cuDNN handle and the graphs built on it, for one device. packed_qkv() may be called from
// several threads (a lock covers the handle), its work goes to the current stream.
class Attention {
 public:
  explicit Attention(c10::Device device);
  ~Attention();
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  // out[b, s, h, :] = softmax(scale * Q_h K_g^T) V_g for every batch entry and query head h,
  // g = h / (H / Hk) its key/value head.
  void packed_qkv(const at::Tensor& qkv, const at::Tensor& out, float scale);

  // Builds (and caches) the graph of `key` now, so that a configuration cuDNN cannot run is
  // refused when the model loads rather than in the middle of a forward pass. Throws
  // std::runtime_error with sdpa_unsupported_reason's message.
  void check_support(const SdpaKey& key);

  std::size_t graphs_cached() const;

 private:
  struct Plan;
  // The cached plan of `key`, built on first use (under mu_). Throws std::runtime_error with
  // sdpa_unsupported_reason's message when cuDNN cannot run it.
  std::shared_ptr<Plan> plan_for(const SdpaKey& key);
  c10::Device device_;
  void* handle_ = nullptr;  // cudnnHandle_t
  mutable std::mutex mu_;
  std::unordered_map<SdpaKey, std::shared_ptr<Plan>, SdpaKeyHash> plans_;
};

}  // namespace sapiens_seg::kernels::cudnn_hacc
