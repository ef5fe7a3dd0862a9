// The execution modes behind Model: each Runner maps a normalised batch to logits.
#pragma once

#include <memory>
#include <string>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "checkpoint.hpp"
#include "sapiens_seg/model.hpp"
#include "sapiens_seg/options.hpp"
#include "v1/vit_seg.hpp"
#include "v2/sapiens2.hpp"

namespace sapiens_seg::core {

class Runner {
 public:
  virtual ~Runner() = default;
  // x: [B, 3, H, W] fp32 normalised RGB on the CPU; returns logits [B, K, h, w] fp32 on the CPU
  // (h, w = H/2, W/2 for Sapiens v1 and H, W for Sapiens2). Must be safe to call concurrently.
  virtual at::Tensor forward(const at::Tensor& x) const = 0;
  virtual const Backend& backend() const = 0;
};

// "" -> cuda:0 when CUDA is usable, else cpu. Throws Error(kBackendUnavailable) for a device
// that does not exist here and Error(kInvalidInput) for an unparsable one.
c10::Device resolve_device(const std::string& device);
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

// Why the kernels backend cannot run here, or "" when it can.
std::string kernels_unavailable_reason(const c10::Device& device);
bool kernels_compiled();

}  // namespace sapiens_seg::core
