// The execution modes behind Model: each Runner maps a normalised batch to logits.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "../checkpoint/torchscript.hpp"
#include "../v1/vit_seg.hpp"
#include "../v2/sapiens2.hpp"
#include "sapiens_seg/model.hpp"
#include "sapiens_seg/options.hpp"

namespace sapiens_seg::core {

class Runner {
 public:
  virtual ~Runner() = default;
  // x: [B, 3, H, W] fp32 normalised RGB on the CPU; returns logits [B, K, h, w] fp32 on the CPU
  // (h, w = H/2, W/2 for Sapiens v1 and H, W for Sapiens2). Must be safe to call concurrently.
  virtual at::Tensor forward(const at::Tensor& x) const = 0;
  // The same logits left where the network computed them: device(), the compute dtype, any
  // layout (the kernels backend returns a channels-last view). x may already be on device().
  // The device pipeline of Model::segment upsamples them there; the default is forward().
  virtual at::Tensor forward_device(const at::Tensor& x) const { return forward(x); }
  virtual c10::Device device() const { return c10::Device(c10::kCPU); }
  virtual const Backend& backend() const = 0;
};

// "" -> cuda:0 when CUDA is usable, else cpu. Throws Error(kBackendUnavailable) for a device
// that does not exist here and Error(kInvalidInput) for an unparsable one.
c10::Device resolve_device(const std::string& device);
// kDefault -> float16 on CUDA, float32 on the CPU. On the CPU an explicit bfloat16 or float16
// throws Error(kBackendUnavailable) naming the missing instructions where this CPU has no fast
// GEMM for it (cpu_dtype_unavailable_reason(cpu_caps(), ...)).
at::ScalarType resolve_dtype(DType dtype, const c10::Device& device);
std::string dtype_name(at::ScalarType t);
std::string device_name(const c10::Device& d);

std::unique_ptr<Runner> make_portable_v1(const TorchScriptCheckpoint& ckpt, const v1::Config& cfg,
                                         c10::Device device, at::ScalarType dtype);
std::unique_ptr<Runner> make_original_v1(const TorchScriptCheckpoint& ckpt, const v1::Config& cfg,
                                         c10::Device device, at::ScalarType dtype);

// Sapiens2 has no `original` mode: the authors ship plain weights, not a graph.
std::unique_ptr<Runner> make_portable_v2(const TensorMap& tensors, const v2::Config& cfg,
                                         c10::Device device, at::ScalarType dtype);

// The CUDA kernels backend (kernels/: fastbb, cudnn_hacc, seg_up), float16 or bfloat16 only.
// Throws Error(kBackendUnavailable) with the reason where it cannot run (see
// kernels_unavailable_reason, plus the dtype) or was not compiled in.
std::unique_ptr<Runner> make_kernels_v1(const TorchScriptCheckpoint& ckpt, const v1::Config& cfg,
                                        c10::Device device, at::ScalarType dtype);
std::unique_ptr<Runner> make_kernels_v2(const TensorMap& tensors, const v2::Config& cfg,
                                        c10::Device device, at::ScalarType dtype);

// `runner` replaying a captured CUDA graph for each input shape it has seen (the `max_graphs`
// most recent; each keeps its activations' memory). A shape whose capture fails runs eagerly.
// Returns `runner` itself on the CPU, for max_graphs == 0, and in builds without CUDA kernels.
std::unique_ptr<Runner> with_cuda_graphs(std::unique_ptr<Runner> runner, std::size_t max_graphs);

// Why the kernels backend cannot run here, or "" when it can.
std::string kernels_unavailable_reason(const c10::Device& device);
bool kernels_compiled();

// What kernels_unavailable_reason decides from, so the decision is testable without a GPU.
struct KernelsProbe {
  bool compiled = false;        // SAPIENS_SEG_WITH_KERNELS
  bool cuda_available = false;  // at least one CUDA device
  c10::Device device{c10::kCPU};
  int major = 0, minor = 0;  // compute capability of `device`
};
std::string kernels_unavailable_reason_for(const KernelsProbe& probe);
inline constexpr int kKernelsMinMajor = 8;  // cuDNN's fused attention and bf16 need sm_80+

// Compute capability {major, minor} of CUDA device `index`; {0, 0} when there is none or the
// kernels are not compiled in.
std::pair<int, int> cuda_capability(int index);

}  // namespace sapiens_seg::core
