// cudnn_hacc host code: head-dim padding, graph keys, and building and running the cuDNN SDPA
// graphs (one per shape, built on first use).
#include "kernels/cudnn_hacc/attention.hpp"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cstring>
#include <string>
#include <vector>

namespace sapiens_seg::kernels::cudnn_hacc {
namespace fe = cudnn_frontend;

namespace {

// Tensor uids of the graph's variant pack.
constexpr std::int64_t kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4;

void check_fe(fe::error_t e, const char* step) {
  if (!e.is_good()) {
    throw std::runtime_error(std::string("cuDNN attention: ") + step +
                             " failed: " + e.get_message());
  }
}

void check_cudnn(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + " failed: " + cudnnGetErrorString(s));
  }
}

std::vector<std::int64_t> vec(const std::array<std::int64_t, 4>& a) {
  return {a.begin(), a.end()};
}

}  // namespace

std::int64_t padded_head_dim(std::int64_t head_dim) {
  TORCH_CHECK(head_dim >= 1 && head_dim <= kMaxHeadDim, "attention: head dim ", head_dim,
              " is outside the 1..", kMaxHeadDim, " that cuDNN's fused attention runs");
  return (head_dim + 7) / 8 * 8;
}

at::Tensor pad_head_rows(const at::Tensor& t, std::int64_t slots, std::int64_t hd,
                         std::int64_t hdp) {
  TORCH_CHECK((t.dim() == 1 || t.dim() == 2) && t.size(0) == slots * hd,
              "pad_head_rows: expected [", slots * hd, "] or [", slots * hd, ", C], got ",
              t.sizes());
  TORCH_CHECK(hdp >= hd, "pad_head_rows: padded head dim ", hdp, " < ", hd);
  if (hdp == hd) return t;
  if (t.dim() == 1) {
    return at::constant_pad_nd(t.reshape({slots, hd}), {0, hdp - hd}).reshape({slots * hdp});
  }
  const std::int64_t C = t.size(1);
  return at::constant_pad_nd(t.reshape({slots, hd, C}), {0, 0, 0, hdp - hd})
      .reshape({slots * hdp, C});
}

at::Tensor pad_qkv_weight(const at::Tensor& w, std::int64_t heads, std::int64_t hd,
                          std::int64_t hdp) {
  TORCH_CHECK(w.dim() == 2 && w.size(0) == 3 * heads * hd, "pad_qkv_weight: expected [",
              3 * heads * hd, ", C], got ", w.sizes());
  return pad_head_rows(w, 3 * heads, hd, hdp);
}

at::Tensor pad_qkv_bias(const at::Tensor& b, std::int64_t heads, std::int64_t hd,
                        std::int64_t hdp) {
  TORCH_CHECK(b.dim() == 1 && b.size(0) == 3 * heads * hd, "pad_qkv_bias: expected [",
              3 * heads * hd, "], got ", b.sizes());
  return pad_head_rows(b, 3 * heads, hd, hdp);
}

at::Tensor pad_proj_weight(const at::Tensor& w, std::int64_t heads, std::int64_t hd,
                           std::int64_t hdp) {
  TORCH_CHECK(w.dim() == 2 && w.size(1) == heads * hd, "pad_proj_weight: expected [C, ", heads * hd,
              "], got ", w.sizes());
  TORCH_CHECK(hdp >= hd, "pad_proj_weight: padded head dim ", hdp, " < ", hd);
  if (hdp == hd) return w;
  const std::int64_t C = w.size(0);
  return at::constant_pad_nd(w.reshape({C, heads, hd}), {0, hdp - hd}).reshape({C, heads * hdp});
}

std::size_t SdpaKeyHash::operator()(const SdpaKey& k) const noexcept {
  std::size_t h = 1469598103934665603ull;
  auto mix = [&h](std::uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (std::int64_t v : {k.b, k.h, k.hk, k.s, k.d, k.k_offset, k.v_offset}) {
    mix(static_cast<std::uint64_t>(v));
  }
  for (std::int64_t v : k.qkv_stride) mix(static_cast<std::uint64_t>(v));
  for (std::int64_t v : k.o_stride) mix(static_cast<std::uint64_t>(v));
  std::uint32_t bits = 0;
  static_assert(sizeof bits == sizeof k.scale);
  std::memcpy(&bits, &k.scale, sizeof bits);
  mix(bits);
  mix(static_cast<std::uint64_t>(k.dtype));
  mix(static_cast<std::uint64_t>(static_cast<std::int64_t>(k.device)));
  return h;
}

SdpaKey packed_qkv_key(const at::Tensor& qkv_in, const at::Tensor& out, float scale) {
  TORCH_CHECK((qkv_in.dim() == 5 && qkv_in.size(2) == 3) || qkv_in.dim() == 4,
              "attention: qkv must be a contiguous [B, S, 3, H, D] or [B, S, H + 2*Hk, D] tensor, "
              "got sizes ",
              qkv_in.sizes());
  TORCH_CHECK(qkv_in.is_contiguous(), "attention: qkv must be contiguous, got strides ",
              qkv_in.strides());
  const at::Tensor qkv = qkv_in.dim() == 5 ? qkv_in.flatten(2, 3) : qkv_in;
  TORCH_CHECK(qkv_in.dim() == 4 || (out.dim() == 4 && out.size(2) == qkv_in.size(3)),
              "attention: a [B, S, 3, H, D] qkv needs an output of H = ", qkv_in.size(3),
              " heads, got ", out.sizes());
  TORCH_CHECK(out.dim() == 4 && out.is_contiguous(),
              "attention: out must be a contiguous [B, S, H, D] tensor, got ", out.sizes());
  const std::int64_t B = qkv.size(0), S = qkv.size(1), slots = qkv.size(2), D = qkv.size(3);
  const std::int64_t H = out.size(2), Hk = (slots - H) / 2;
  TORCH_CHECK(out.size(0) == B && out.size(1) == S && out.size(3) == D, "attention: out must be [",
              B, ", ", S, ", H, ", D, "], got ", out.sizes());
  TORCH_CHECK(H > 0 && Hk > 0 && slots == H + 2 * Hk && H % Hk == 0, "attention: ", slots,
              " packed heads do not split into ", H,
              " query heads plus key and value heads whose count divides it");
  TORCH_CHECK(qkv.scalar_type() == at::kHalf || qkv.scalar_type() == at::kBFloat16,
              "attention: cuDNN's fused attention runs float16 or bfloat16, got ",
              qkv.scalar_type());
  TORCH_CHECK(out.scalar_type() == qkv.scalar_type(), "attention: out must be ", qkv.scalar_type());
  TORCH_CHECK(D % 8 == 0 && D <= kMaxHeadDim, "attention: head dim ", D,
              " must be a multiple of 8 up to ", kMaxHeadDim,
              " (pad the weights: padded_head_dim, pad_head_rows)");
  TORCH_CHECK(S > 0 && B > 0, "attention: empty input ", qkv.sizes());
  TORCH_CHECK(qkv.device() == out.device(), "attention: qkv and out are on different devices");
  TORCH_CHECK(scale > 0.f, "attention: scale must be positive");
  return packed_key(B, H, Hk, S, D, qkv.scalar_type() == at::kHalf ? DType::kF16 : DType::kBF16,
                    scale, qkv.device().is_cuda() ? qkv.device().index() : -1);
}

SdpaKey packed_key(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t s, std::int64_t d,
                   DType dtype, float scale, int device) {
  const std::int64_t slots = h + 2 * hk;
  SdpaKey k;
  k.b = b;
  k.h = h;
  k.hk = hk;
  k.s = s;
  k.d = d;
  k.dtype = dtype;
  k.qkv_stride = {s * slots * d, d, slots * d, 1};
  k.o_stride = {s * h * d, d, h * d, 1};
  k.k_offset = h * d;
  k.v_offset = (h + hk) * d;
  k.scale = scale;
  k.device = device;
  return k;
}

std::string cudnn_version_string(std::int64_t v) {
  const std::int64_t major = v >= 90000 ? v / 10000 : v / 1000;
  const std::int64_t minor = v >= 90000 ? v / 100 % 100 : v / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

std::string sdpa_unsupported_reason(const SdpaSupport& s) {
  const std::string runtime = "cuDNN " + cudnn_version_string(s.cudnn_runtime);
  const auto major = [](std::int64_t v) { return v >= 90000 ? v / 10000 : v / 1000; };
  if (major(s.cudnn_runtime) != major(s.cudnn_compiled)) {
    return "the loaded " + runtime + " is not the major version this build was compiled " +
           "against (cuDNN " + cudnn_version_string(s.cudnn_compiled) +
           "): install the nvidia-cudnn package that the torch wheel requires";
  }
  if (s.sm_major < 8) {
    return runtime + "'s fused attention needs compute capability 8.0 or newer, this GPU has " +
           std::to_string(s.sm_major) + "." + std::to_string(s.sm_minor);
  }
  if (s.frontend_error.empty()) return "";
  const SdpaKey& k = s.key;
  return runtime + " cannot run this model's fused attention (batch " + std::to_string(k.b) + ", " +
         std::to_string(k.h) + " query heads, " + std::to_string(k.hk) + " key/value heads, " +
         std::to_string(k.s) + " tokens, head dim " + std::to_string(k.d) + ", " +
         (k.dtype == DType::kF16 ? "float16" : "bfloat16") + ") on compute capability " +
         std::to_string(s.sm_major) + "." + std::to_string(s.sm_minor) + ": " + s.frontend_error;
}

struct Attention::Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace = 0;
};

Attention::Attention(c10::Device device) : device_(device) {
  TORCH_CHECK(device.is_cuda() && device.has_index(),
              "Attention: needs a CUDA device with an index");
  const c10::cuda::CUDAGuard guard(device);
  cudnnHandle_t h = nullptr;
  check_cudnn(cudnnCreate(&h), "cudnnCreate");
  handle_ = h;
}

Attention::~Attention() {
  plans_.clear();
  if (handle_) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

std::size_t Attention::graphs_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

std::shared_ptr<Attention::Plan> Attention::plan_for(const SdpaKey& key) {
  auto handle = static_cast<cudnnHandle_t>(handle_);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  auto p = std::make_shared<Plan>();
  auto g = std::make_shared<fe::graph::Graph>();
  std::string error;
  try {
    g->set_io_data_type(key.dtype == DType::kF16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const std::vector<std::int64_t> dim = {key.b, key.h, key.s, key.d};
    const std::vector<std::int64_t> kv_dim = {key.b, key.hk, key.s, key.d};
    auto tensor = [&](const char* name, std::int64_t uid, const std::vector<std::int64_t>& d) {
      return g->tensor(
          fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(d).set_stride(
              vec(key.qkv_stride)));
    };
    auto q = tensor("Q", kUidQ, dim), k = tensor("K", kUidK, kv_dim),
         v = tensor("V", kUidV, kv_dim);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("sapiens_attention")
                       .set_generate_stats(false)
                       .set_attn_scale(key.scale);
    auto [o, stats] = g->sdpa(q, k, v, options);
    (void)stats;
    o->set_output(true).set_dim(dim).set_stride(vec(key.o_stride)).set_uid(kUidO);
    check_fe(g->validate(), "validate");
    check_fe(g->build_operation_graph(handle), "build_operation_graph");
    check_fe(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    check_fe(g->check_support(handle), "check_support");
    check_fe(g->build_plans(handle), "build_plans");
    check_fe(g->get_workspace_size(p->workspace), "get_workspace_size");
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!error.empty()) {  // nothing is cached for a shape that failed to build
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device_.index());
    SdpaSupport s;
    s.cudnn_runtime = static_cast<std::int64_t>(cudnnGetVersion());
    s.cudnn_compiled = CUDNN_VERSION;
    s.sm_major = prop->major;
    s.sm_minor = prop->minor;
    s.key = key;
    s.frontend_error = error;
    throw std::runtime_error(sdpa_unsupported_reason(s));
  }
  p->graph = std::move(g);
  plans_.emplace(key, p);
  return p;
}

void Attention::check_support(const SdpaKey& key) {
  TORCH_CHECK(key.device == device_.index(), "attention: a key for device ", key.device,
              " checked on ", device_);
  const c10::cuda::CUDAGuard guard(device_);
  std::lock_guard<std::mutex> lock(mu_);
  plan_for(key);
}

void Attention::packed_qkv(const at::Tensor& qkv, const at::Tensor& out, float scale) {
  const SdpaKey key = packed_qkv_key(qkv, out, scale);
  TORCH_CHECK(qkv.device() == device_, "attention: operands are on ", qkv.device(),
              " but this Attention serves ", device_);
  const c10::cuda::CUDAGuard guard(device_);
  auto handle = static_cast<cudnnHandle_t>(handle_);
  std::lock_guard<std::mutex> lock(mu_);
  const std::shared_ptr<Plan> plan = plan_for(key);

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device_.index());
  check_cudnn(cudnnSetStream(handle, stream), "cudnnSetStream");
  at::Tensor workspace;
  if (plan->workspace > 0) {
    workspace = at::empty({plan->workspace}, qkv.options().dtype(at::kByte));
  }
  auto* base = static_cast<char*>(qkv.data_ptr());
  const auto bytes = static_cast<std::int64_t>(qkv.element_size());
  std::unordered_map<std::int64_t, void*> pack = {{kUidQ, base},
                                                  {kUidK, base + key.k_offset * bytes},
                                                  {kUidV, base + key.v_offset * bytes},
                                                  {kUidO, out.data_ptr()}};
  check_fe(plan->graph->execute(handle, pack, workspace.defined() ? workspace.data_ptr() : nullptr),
           "execute");
}

}  // namespace sapiens_seg::kernels::cudnn_hacc
