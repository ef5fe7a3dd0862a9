#include "backends.hpp"

#include <ATen/Context.h>
#include <c10/core/InferenceMode.h>
#include <torch/script.h>

#include <tuple>

#include "../cpu/cpuinfo.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core {

c10::Device resolve_device(const std::string& device) {
  const bool cuda = at::hasCUDA();
  if (device.empty()) return cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  c10::Device d(c10::kCPU);
  try {
    d = c10::Device(device);
  } catch (const c10::Error&) {
    throw Error(ErrorCode::kInvalidInput,
                "invalid device '" + device + "' (expected cpu, cuda or cuda:N)");
  }
  if (d.is_cpu()) return d;
  if (!d.is_cuda()) {
    throw Error(ErrorCode::kBackendUnavailable, "device '" + device + "' is not supported");
  }
  if (!cuda) {
    throw Error(ErrorCode::kBackendUnavailable,
                "device '" + device + "' requested but no CUDA device is available here");
  }
  if (!d.has_index()) d.set_index(0);
  return d;
}

at::ScalarType resolve_dtype(DType dtype, const c10::Device& device) {
  switch (dtype) {
    case DType::kDefault:
      return device.is_cuda() ? at::kHalf : at::kFloat;
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat16:
    case DType::kBFloat16: {
      const at::ScalarType t = dtype == DType::kFloat16 ? at::kHalf : at::kBFloat16;
      // Refused before any work where the CPU has no fast GEMM for it (cpu/cpuinfo.hpp): LibTorch
      // would otherwise run a scalar fallback tens of times slower than float32, silently.
      if (device.is_cpu()) {
        const std::string why = cpu_dtype_unavailable_reason(cpu_caps(), t);
        if (!why.empty()) throw Error(ErrorCode::kBackendUnavailable, why);
      }
      return t;
    }
  }
  return at::kFloat;
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    default:
      return c10::toString(t);
  }
}

std::string device_name(const c10::Device& d) {
  return d.is_cpu() ? "cpu" : "cuda:" + std::to_string(d.has_index() ? d.index() : 0);
}

namespace {

// The portable network of either family (v1::Network, v2::Network): the same runner around it.
template <class Network>
class Portable final : public Runner {
 public:
  template <class Weights, class Config>
  Portable(const Weights& weights, const Config& cfg, c10::Device device, at::ScalarType dtype)
      : net_(weights, cfg, device, dtype),
        backend_{"portable", device_name(device), dtype_name(dtype)} {}

  at::Tensor forward(const at::Tensor& x) const override {
    return net_.forward(x).to(at::kCPU, at::kFloat).contiguous();
  }
  at::Tensor forward_device(const at::Tensor& x) const override { return net_.forward(x); }
  c10::Device device() const override { return net_.device(); }
  const Backend& backend() const override { return backend_; }

 private:
  Network net_;
  Backend backend_;
};

class OriginalV1 final : public Runner {
 public:
  OriginalV1(const TorchScriptCheckpoint& ckpt, const v1::Config& cfg, c10::Device device,
             at::ScalarType dtype)
      : module_(ckpt.module),
        cfg_(cfg),
        device_(device),
        backend_{"original", device_name(device), dtype_name(dtype)} {
    if (dtype != at::kFloat) {
      throw Error(ErrorCode::kBackendUnavailable,
                  "the original mode runs the authors' graph in float32 only (asked for " +
                      dtype_name(dtype) + ")");
    }
    if (!device.is_cpu()) module_->to(device);
    module_->eval();
  }

  at::Tensor forward(const at::Tensor& x) const override {
    return forward_device(x).to(at::kCPU, at::kFloat).contiguous();
  }
  at::Tensor forward_device(const at::Tensor& x) const override {
    check_size(x);
    c10::InferenceMode guard;
    // The traced graph is re-entrant: concurrent calls each get their own interpreter frame.
    return module_->forward({x.to(device_)}).toTensor();
  }
  c10::Device device() const override { return device_; }
  const Backend& backend() const override { return backend_; }

 private:
  void check_size(const at::Tensor& x) const {
    if (x.size(2) != cfg_.grid_h * cfg_.patch || x.size(3) != cfg_.grid_w * cfg_.patch) {
      throw Error(ErrorCode::kBackendUnavailable,
                  "the original graph was traced at " + std::to_string(cfg_.grid_h * cfg_.patch) +
                      "x" + std::to_string(cfg_.grid_w * cfg_.patch) +
                      " and cannot run another input size; use the portable mode");
    }
  }

  std::shared_ptr<torch::jit::Module> module_;  // shares the weights read at load time
  v1::Config cfg_;
  c10::Device device_;
  Backend backend_;
};

}  // namespace

std::unique_ptr<Runner> make_portable_v1(const TorchScriptCheckpoint& ckpt, const v1::Config& cfg,
                                         c10::Device device, at::ScalarType dtype) {
  return std::make_unique<Portable<v1::Network>>(ckpt.tensors, cfg, device, dtype);
}

std::unique_ptr<Runner> make_original_v1(const TorchScriptCheckpoint& ckpt, const v1::Config& cfg,
                                         c10::Device device, at::ScalarType dtype) {
  return std::make_unique<OriginalV1>(ckpt, cfg, device, dtype);
}

std::unique_ptr<Runner> make_portable_v2(const TensorMap& tensors, const v2::Config& cfg,
                                         c10::Device device, at::ScalarType dtype) {
  return std::make_unique<Portable<v2::Network>>(tensors, cfg, device, dtype);
}

bool kernels_compiled() {
#ifdef SAPIENS_SEG_WITH_KERNELS
  return true;
#else
  return false;
#endif
}

#ifndef SAPIENS_SEG_WITH_KERNELS
// Stand-ins of src/core/backends/kernels_runner.cpp for builds without the kernels.
std::pair<int, int> cuda_capability(int) {
  return {0, 0};
}

std::unique_ptr<Runner> make_kernels_v1(const TorchScriptCheckpoint&, const v1::Config&,
                                        c10::Device device, at::ScalarType) {
  throw Error(ErrorCode::kBackendUnavailable,
              "kernels mode unavailable: " + kernels_unavailable_reason(device));
}

std::unique_ptr<Runner> make_kernels_v2(const TensorMap&, const v2::Config&, c10::Device device,
                                        at::ScalarType) {
  throw Error(ErrorCode::kBackendUnavailable,
              "kernels mode unavailable: " + kernels_unavailable_reason(device));
}

std::unique_ptr<Runner> with_cuda_graphs(std::unique_ptr<Runner> runner, std::size_t) {
  return runner;
}
#endif

std::string kernels_unavailable_reason_for(const KernelsProbe& p) {
  if (!p.compiled) {
    return "the kernels backend (fastbb, cudnn_hacc, seg_up) is not compiled into this build "
           "(it needs nvcc, cuDNN and cudnn-frontend when CMake configures)";
  }
  if (!p.cuda_available) return "no CUDA device is available";
  if (!p.device.is_cuda()) {
    return "the kernels backend runs on CUDA devices only (device is " + device_name(p.device) +
           ")";
  }
  if (p.major < kKernelsMinMajor) {
    return device_name(p.device) + " has compute capability " + std::to_string(p.major) + "." +
           std::to_string(p.minor) + "; the kernels backend needs " +
           std::to_string(kKernelsMinMajor) + ".0 or newer";
  }
  return "";
}

std::string kernels_unavailable_reason(const c10::Device& device) {
  KernelsProbe p;
  p.compiled = kernels_compiled();
  p.cuda_available = p.compiled && at::hasCUDA();
  p.device = device;
  if (p.cuda_available && device.is_cuda()) {
    std::tie(p.major, p.minor) = cuda_capability(device.has_index() ? device.index() : 0);
  }
  return kernels_unavailable_reason_for(p);
}

}  // namespace sapiens_seg::core
