// The `kernels` Runners: the schedules of v1/kernels_schedule.cpp and v2/kernels_schedule.cpp
// run on the CUDA kernel families in kernels/ (fastbb, cudnn_hacc, seg_up). Compiled only into CUDA
// builds (SAPIENS_SEG_WITH_KERNELS); backends.cpp has the stand-ins otherwise.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <mutex>
#include <string>
#include <vector>

#include "../kernel_ops.hpp"
#include "../v1/kernels_schedule.hpp"
#include "../v2/kernels_schedule.hpp"
#include "backends.hpp"
#include "kernels/cudnn_hacc/attention.hpp"
#include "kernels/fastbb/fastbb.hpp"
#include "kernels/seg_up/head.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core {
namespace {

namespace fastbb = kernels::fastbb;
namespace cudnn_hacc = kernels::cudnn_hacc;
namespace seg_up = kernels::seg_up;

// What both families' runners share: the cuBLASLt and cuDNN state, and the ordering of forward
// passes. One pass at a time: the GEMM workspace and the cuDNN handle are shared. Calls come on
// different streams, so a pass's stream also waits until the previous pass's kernels are done
// with the workspaces (not while a CUDA graph is being captured: the graph runner orders its
// replays itself, and a capture may not wait on work recorded outside it).
class KernelsRunner : public Runner {
 public:
  KernelsRunner(c10::Device device, at::ScalarType dtype)
      : device_(device), backend_{"kernels", device_name(device), dtype_name(dtype)} {
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
  std::unique_ptr<fastbb::Gemm> gemm_;
  std::unique_ptr<cudnn_hacc::Attention> attn_;

 private:
  mutable std::mutex mu_;
  mutable at::cuda::CUDAEvent done_;  // the last pass's use of the shared workspaces
  Backend backend_;
};

// The schedules' steps on the kernels.
class CudaOps : public KernelOps {
 public:
  CudaOps(fastbb::Gemm& gemm, cudnn_hacc::Attention& attn) : gemm_(gemm), attn_(attn) {}

  void layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                  const at::Tensor& out) override {
    fastbb::layer_norm(x, w, b, eps, out);
  }
  void rms_norm(const at::Tensor& x, const at::Tensor& w, double eps,
                const at::Tensor& out) override {
    fastbb::rms_norm(x, w, eps, out);
  }
  void linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
              const at::Tensor& residual, fastbb::Activation act, const at::Tensor& out) override {
    gemm_.linear(x, w, b, residual, act, out);
  }
  void attention(const at::Tensor& qkv, const at::Tensor& out, float scale) override {
    attn_.packed_qkv(qkv, out, scale);
  }
  void qk_norm_rope(const at::Tensor& qkv, const at::Tensor& q_w, const at::Tensor& k_w,
                    const at::Tensor& cos, const at::Tensor& sin,
                    const fastbb::QkRope& p) override {
    fastbb::qk_norm_rope_(qkv, q_w, k_w, cos, sin, p);
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

// The cuBLASLt and cuDNN state of a CudaOps that owns it, constructed before the CudaOps base
// that refers to it (a base listed first is initialised first).
struct CudaOpsState {
  explicit CudaOpsState(c10::Device device) : gemm(device), attn(device) {}
  fastbb::Gemm gemm;
  cudnn_hacc::Attention attn;
};

// CudaOps with its own cuBLASLt and cuDNN state (cuda_kernel_ops).
class OwningCudaOps final : private CudaOpsState, public CudaOps {
 public:
  explicit OwningCudaOps(c10::Device device) : CudaOpsState(device), CudaOps(gemm, attn) {}
};

// A family's schedule (v1 or v2 kernels_schedule) on the kernels: its weights, prepared once,
// and one pass of its forward() per call. The model's attention configurations go through
// cuDNN's support checks at construction, so a GPU or cuDNN that cannot run them refuses the
// mode at load (BackendUnavailable, make_kernels) instead of failing in a forward pass.
template <typename Config, typename Weights,
          Weights (*Prepare)(const TensorMap&, const Config&, c10::Device, at::ScalarType),
          at::Tensor (*Forward)(const Weights&, const Config&, KernelOps&, const at::Tensor&),
          std::vector<cudnn_hacc::SdpaKey> (*Keys)(const Weights&, const Config&, at::ScalarType,
                                                   int)>
class ScheduleRunner final : public KernelsRunner {
 public:
  ScheduleRunner(const TensorMap& tensors, const Config& cfg, c10::Device device,
                 at::ScalarType dtype)
      : KernelsRunner(device, dtype), cfg_(cfg) {
    const c10::cuda::CUDAGuard guard(device);
    weights_ = Prepare(tensors, cfg, device, dtype);
    for (const cudnn_hacc::SdpaKey& key : Keys(weights_, cfg, dtype, device.index())) {
      attn_->check_support(key);
    }
  }

  // Logits [B, K, h, w] as a view of a channels-last [B, h, w, K] tensor on the GPU, in the
  // compute dtype: seg_up's upsample + argmax reads that layout directly.
  at::Tensor run(const at::Tensor& x) const override {
    CudaOps ops(*gemm_, *attn_);
    return Forward(weights_, cfg_, ops, x);
  }

 private:
  Config cfg_;
  Weights weights_;
};

using KernelsV1 =
    ScheduleRunner<v1::Config, v1::kernels_schedule::Weights, &v1::kernels_schedule::prepare,
                   &v1::kernels_schedule::forward, &v1::kernels_schedule::attention_keys>;
using KernelsV2 =
    ScheduleRunner<v2::Config, v2::kernels_schedule::Weights, &v2::kernels_schedule::prepare,
                   &v2::kernels_schedule::forward, &v2::kernels_schedule::attention_keys>;

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

std::unique_ptr<KernelOps> cuda_kernel_ops(c10::Device device) {
  const c10::cuda::CUDAGuard guard(device);
  return std::make_unique<OwningCudaOps>(device);
}

std::pair<int, int> cuda_capability(int index) {
  if (!at::hasCUDA() || index < 0 || index >= static_cast<int>(at::cuda::device_count())) {
    return {0, 0};
  }
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(index);
  return {p->major, p->minor};
}

std::unique_ptr<Runner> make_kernels_v1(const TorchScriptCheckpoint& ckpt, const v1::Config& cfg,
                                        c10::Device device, at::ScalarType dtype) {
  return make_kernels(
      device, dtype, [&] { return std::make_unique<KernelsV1>(ckpt.tensors, cfg, device, dtype); });
}

std::unique_ptr<Runner> make_kernels_v2(const TensorMap& tensors, const v2::Config& cfg,
                                        c10::Device device, at::ScalarType dtype) {
  return make_kernels(device, dtype,
                      [&] { return std::make_unique<KernelsV2>(tensors, cfg, device, dtype); });
}

}  // namespace sapiens_seg::core
