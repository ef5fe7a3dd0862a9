#include "gpu_extras.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/script.h>

#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#ifdef SPEED_CHECK_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "core/backends/backends.hpp"
#include "core/backends/cuda_graphs.hpp"
#include "core/checkpoint/mapped_file.hpp"
#include "core/checkpoint/torchscript.hpp"
#include "core/v1/vit_seg.hpp"
#include "library_core.hpp"
#include "timing.hpp"
#ifdef SAPIENS_SEG_WITH_KERNELS
#include "core/kernel_ops.hpp"
#include "core/v1/kernels_schedule.hpp"
#endif

namespace speed_check::gpu_extras {
namespace core = sapiens_seg::core;
using json = nlohmann::json;

namespace {

#ifdef SPEED_CHECK_CUDA
bool is_cuda(const std::string& device) {
  return device.rfind("cuda", 0) == 0;
}
#endif

// Autocast to `dtype` on `dev` for the scope's life, as torch.autocast does: nested, and the
// previous state restored on the way out (also when what runs inside throws).
class AutocastScope {
 public:
  AutocastScope(at::DeviceType dev, at::ScalarType dtype)
      : dev_(dev),
        was_(at::autocast::is_autocast_enabled(dev)),
        was_dtype_(at::autocast::get_autocast_dtype(dev)) {
    at::autocast::set_autocast_enabled(dev, true);
    at::autocast::set_autocast_dtype(dev, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(dev_, was_);
    at::autocast::set_autocast_dtype(dev_, was_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  at::DeviceType dev_;
  bool was_;
  at::ScalarType was_dtype_;
};

// The authors' graph as their demo would run it in half precision on a GPU: the float32 module
// under autocast (LibTorch's dispatcher casts each op's inputs), not a converted copy.
class AutocastRunner final : public core::Runner {
 public:
  AutocastRunner(std::unique_ptr<core::Runner> inner, at::ScalarType dtype)
      : inner_(std::move(inner)), dtype_(dtype), backend_(inner_->backend()) {
    backend_.dtype = "autocast " + core::dtype_name(dtype);
  }
  at::Tensor forward(const at::Tensor& x) const override {
    return forward_device(x).to(at::kCPU, at::kFloat).contiguous();
  }
  at::Tensor forward_device(const at::Tensor& x) const override {
    const AutocastScope scope(inner_->device().type(), dtype_);
    return inner_->forward_device(x);
  }
  c10::Device device() const override { return inner_->device(); }
  const sapiens_seg::Backend& backend() const override { return backend_; }

 private:
  std::unique_ptr<core::Runner> inner_;
  at::ScalarType dtype_;
  sapiens_seg::Backend backend_;
};

// Median of `reps` timed calls of fn (after two untimed ones), the device synchronised around
// each.
template <typename Fn>
double median_ms_of(const c10::Device& dev, int reps, Fn&& fn) {
  auto sync_dev = [&] {
    if (!dev.is_cpu()) c10::impl::getDeviceGuardImpl(dev.type())->synchronizeDevice(dev.index());
  };
  std::vector<double> ms;
  for (int i = 0; i < reps + 2; ++i) {
    sync_dev();
    const auto t0 = Clock::now();
    fn();
    sync_dev();
    if (i >= 2) ms.push_back(ms_since(t0));
  }
  return median(ms);
}

}  // namespace

std::unique_ptr<LibraryColumn> load_original_autocast(const std::string& path,
                                                      const sapiens_seg::LoadOptions& options) {
  const c10::Device device = core::resolve_device(options.device);
  if (device.is_cpu()) throw std::runtime_error("the original under autocast is a CUDA column");
  const at::ScalarType dtype = core::resolve_dtype(options.dtype, device);
  sapiens_seg::LoadOptions graph = options;
  graph.mode = sapiens_seg::Mode::kOriginal;
  graph.dtype = sapiens_seg::DType::kFloat32;
  return load_core_column(path, graph, [dtype](std::unique_ptr<core::Runner> r) {
    return std::make_unique<AutocastRunner>(std::move(r), dtype);
  });
}

json graph_counts(const LibraryColumn& column) {
  const core::Runner* runner = column.runner();
  if (runner == nullptr) return nullptr;
  const auto st = core::cuda_graph_stats(*runner);
  if (!st) return nullptr;
  return {{"captured", st->captured},       {"eager", st->eager},
          {"evicted", st->evicted},         {"replays", st->replays},
          {"eager_calls", st->eager_calls}, {"failures", st->failures},
          {"summary", st->summary()}};
}

json split(const std::string& path, const std::string& mode,
           const sapiens_seg::LoadOptions& options) {
  const bool original = mode == "original" || mode == "original-autocast";
  if (!original && mode != "kernels") {
    return {{"note", "the " + mode + " network has no backbone/head entry point"}};
  }
  const core::MappedFile bytes = core::map_file(path, "checkpoint");
  if (family_of(bytes, path) != core::Family::kSapiensV1) {
    return {{"note", "Sapiens2: no split measured"}};
  }
  const c10::Device dev = core::resolve_device(options.device);
  const core::TorchScriptCheckpoint ckpt = core::open_torchscript(bytes, path, original);
  core::v1::ConfigHints hints;
  if (ckpt.heads_from_graph) hints.heads = *ckpt.heads_from_graph;
  if (options.input_height > 0) hints.input_h = options.input_height;
  if (options.input_width > 0) hints.input_w = options.input_width;
  const core::v1::Config cfg = core::v1::infer_config(ckpt.tensors, hints);
  c10::InferenceMode inference;
  at::manual_seed(0);
  const at::Tensor x = at::randn({1, 3, cfg.input_h, cfg.input_w}).to(dev);
  if (original) {
    // The traced file keeps the authors' two submodules, each with its own traced forward.
    ckpt.module->to(dev);
    ckpt.module->eval();
    torch::jit::Module backbone = ckpt.module->attr("backbone").toModule();
    torch::jit::Module head = ckpt.module->attr("decode_head").toModule();
    std::optional<at::ScalarType> autocast;
    if (mode == "original-autocast") autocast = core::resolve_dtype(options.dtype, dev);
    auto run = [&](torch::jit::Module& m, const c10::IValue& in) {
      std::optional<AutocastScope> scope;
      if (autocast) scope.emplace(dev.type(), *autocast);
      return m.forward({in});
    };
    const c10::IValue feats = run(backbone, x);
    return {{"backbone_ms", median_ms_of(dev, 5, [&] { run(backbone, x); })},
            {"head_ms", median_ms_of(dev, 5, [&] { run(head, feats); })}};
  }
#ifdef SAPIENS_SEG_WITH_KERNELS
  // The kernels runner's own schedule, on a second copy of the weights.
  namespace schedule = core::v1::kernels_schedule;
  const at::ScalarType dtype = core::resolve_dtype(options.dtype, dev);
  const schedule::Weights w = schedule::prepare(ckpt.tensors, cfg, dev, dtype);
  const auto ops = core::cuda_kernel_ops(dev);
  const at::Tensor feat = schedule::backbone(w, cfg, *ops, x);
  return {{"backbone_ms", median_ms_of(dev, 5, [&] { schedule::backbone(w, cfg, *ops, x); })},
          {"head_ms", median_ms_of(dev, 5, [&] { schedule::head(w, cfg, *ops, feat, 1); })}};
#else
  return {{"note", "the kernels are not compiled into this build"}};
#endif
}

void add_cuda_peaks(const std::string& device, json& out) {
#ifdef SPEED_CHECK_CUDA
  if (!is_cuda(device)) return;
  const auto idx = static_cast<c10::DeviceIndex>(c10::cuda::current_device());
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(idx);
  out["cuda_peak_allocated"] = stats.allocated_bytes[0].peak;
  out["cuda_peak_reserved"] = stats.reserved_bytes[0].peak;
#else
  (void)device;
  (void)out;
#endif
}

void reset_cuda_peaks(const std::string& device) {
#ifdef SPEED_CHECK_CUDA
  if (is_cuda(device)) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(
        static_cast<c10::DeviceIndex>(c10::cuda::current_device()));
  }
#else
  (void)device;
#endif
}

void sync(const std::string& device) {
#ifdef SPEED_CHECK_CUDA
  if (is_cuda(device)) c10::cuda::device_synchronize();
#else
  (void)device;
#endif
}

}  // namespace speed_check::gpu_extras
