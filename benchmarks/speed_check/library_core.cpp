#include "library_core.hpp"

#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/backends/backends.hpp"
#include "core/checkpoint/mapped_file.hpp"
#include "core/cpu/gemm.hpp"
#include "core/pipeline/build.hpp"
#include "core/pipeline/pipeline.hpp"

namespace speed_check {
namespace core = sapiens_seg::core;

core::Family family_of(const core::MappedFile& bytes, const std::string& path) {
  if (bytes.size >= 4 && std::memcmp(bytes.data, "PK\x03\x04", 4) == 0) {
    return core::Family::kSapiensV1;
  }
  const std::string ext = std::filesystem::path(path).extension().string();
  return ext == ".pt2" || ext == ".pt" ? core::Family::kSapiensV1 : core::Family::kSapiens2;
}

namespace {

// How images become the network's input: api/model.cpp's recipe for a checkpoint no card
// describes (the family's demo or training mean/std and demo resize; the options' cubic and
// pipeline).
core::InputRecipe input_recipe(const core::FamilyTraits& family, const core::Built& net,
                               const sapiens_seg::LoadOptions& opt) {
  core::InputRecipe r;
  r.input_height = static_cast<int>(net.input_height);
  r.input_width = static_cast<int>(net.input_width);
  const core::MeanStd& ms =
      opt.normalization == sapiens_seg::Normalization::kDemo ? family.demo : family.training;
  r.mean = ms.mean;
  r.std = ms.std;
  r.area_or_cubic = family.resize == "area_or_cubic";
  r.cubic = opt.cubic == sapiens_seg::CubicResize::kOpenCV ? core::CubicFlavor::kOpenCV
                                                           : core::CubicFlavor::kWheel;
  r.on_device = opt.pipeline == sapiens_seg::Pipeline::kDevice ||
                (opt.pipeline == sapiens_seg::Pipeline::kAuto && !net.runner->device().is_cpu());
  return r;
}

class CoreColumn final : public LibraryColumn {
 public:
  CoreColumn(const std::string& path, const sapiens_seg::LoadOptions& opt, const RunnerWrap& wrap) {
    if (opt.threads > 0) at::set_num_threads(opt.threads);
    const c10::Device device = core::resolve_device(opt.device);
    core::BuildRequest request;
    request.mode = opt.mode;
    request.device = device;
    request.dtype = core::resolve_dtype(opt.dtype, device);
    request.input_height = opt.input_height;
    request.input_width = opt.input_width;
    core::Built net;
    core::Family family{};
    {
      // The bytes stay only as long as the network holds views of them.
      const core::MappedFile bytes = core::map_file(path, "checkpoint");
      family = family_of(bytes, path);
      net = core::build(family, bytes, path, request);
    }
    recipe_ = input_recipe(core::traits_of(family), net, opt);
    std::unique_ptr<core::Runner> runner =
        wrap ? wrap(std::move(net.runner)) : std::move(net.runner);
    runner_ =
        opt.cuda_graphs > 0
            ? core::with_cuda_graphs(std::move(runner), static_cast<std::size_t>(opt.cuda_graphs))
            : std::move(runner);
    // As load() does: calls run on streams of their own, which do not wait for the default
    // stream that loading may have queued work on.
    if (!device.is_cpu()) {
      c10::impl::getDeviceGuardImpl(device.type())
          ->synchronizeDevice(device.has_index() ? device.index() : 0);
    }
  }

  double segment(const Images& images) override {
    std::vector<core::PreparedInput> prepared;
    prepared.reserve(images.rgb.size());
    for (const auto& px : images.rgb) {
      prepared.push_back(core::prepare({px.data(), images.height, images.width, 3, 0}, recipe_,
                                       runner_->device()));
    }
    return run(prepared, false).network_ms;
  }

  Outputs outputs(const std::vector<std::uint8_t>& rgb, int height, int width) override {
    const std::vector<core::PreparedInput> one{
        core::prepare({rgb.data(), height, width, 3, 0}, recipe_, runner_->device())};
    core::ImageOutput out = std::move(run(one, true).images.front());
    return {std::move(out.raw_logits), std::move(out.labels)};
  }

  sapiens_seg::Backend backend() const override { return runner_->backend(); }
  std::string pipeline() const override {
    return "the library's core steps (core::build, core::prepare + core::run: load and segment "
           "without the weight store and decoding)";
  }
  const core::Runner* runner() const override { return runner_.get(); }

 private:
  core::BatchOutput run(const std::vector<core::PreparedInput>& prepared, bool raw_logits) const {
    std::vector<const core::PreparedInput*> batch;
    batch.reserve(prepared.size());
    for (const auto& p : prepared) batch.push_back(&p);
    return core::run(*runner_, recipe_, batch, /*logits=*/false, raw_logits);
  }

  core::InputRecipe recipe_;
  std::unique_ptr<core::Runner> runner_;
};

}  // namespace

std::unique_ptr<LibraryColumn> load_core_column(const std::string& path,
                                                const sapiens_seg::LoadOptions& options,
                                                const RunnerWrap& wrap) {
  return std::make_unique<CoreColumn>(path, options, wrap);
}

#ifndef SPEED_CHECK_WITH_API
// The build without the IO layer: the library columns are the core steps.

std::unique_ptr<LibraryColumn> load_library_column(const std::string& path,
                                                   const sapiens_seg::LoadOptions& options) {
  return load_core_column(path, options);
}

std::string library_pipeline() {
  return "the library's core steps (core::build, core::prepare + core::run); no IO layer in this "
         "build: no weight store, no decoding";
}

std::string resolve_model(const std::string& id_or_path, const sapiens_seg::LoadOptions&) {
  return id_or_path;
}

std::string cpu_gemm_line() {
  return sapiens_seg::core::cpu::float32_gemm_line();
}
#endif

}  // namespace speed_check
