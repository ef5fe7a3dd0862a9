// The library columns through the public API only (the normal build): what a C++ user runs.
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <utility>

#include "library.hpp"
#include "sapiens_seg/sapiens_seg.hpp"

namespace speed_check {
namespace {

class ApiColumn final : public LibraryColumn {
 public:
  ApiColumn(const std::string& path, const sapiens_seg::LoadOptions& options)
      : model_(sapiens_seg::load(path, options)) {}

  double segment(const Images& images) override {
    std::vector<sapiens_seg::Prepared> prepared;
    prepared.reserve(images.rgb.size());
    for (const auto& px : images.rgb) {
      prepared.push_back(
          model_.prepare(sapiens_seg::Input::rgb({px.data(), images.height, images.width, 0})));
    }
    const auto results = model_.run(prepared);
    if (results.size() != images.rgb.size()) throw std::runtime_error("wrong number of results");
    return results.front().timings.network;  // a batch shares one network call
  }

  Outputs outputs(const std::vector<std::uint8_t>& rgb, int height, int width) override {
    sapiens_seg::SegmentOptions so;
    so.raw_logits = true;
    auto r = model_.segment(sapiens_seg::Input::rgb({rgb.data(), height, width, 0}), so);
    return {std::move(r.raw_logits), std::move(r.labels)};
  }

  sapiens_seg::Backend backend() const override { return model_.info().backend; }
  std::string pipeline() const override { return library_pipeline(); }

 private:
  sapiens_seg::Model model_;
};

}  // namespace

std::unique_ptr<LibraryColumn> load_library_column(const std::string& path,
                                                   const sapiens_seg::LoadOptions& options) {
  return std::make_unique<ApiColumn>(path, options);
}

std::string library_pipeline() {
  return "public API (sapiens_seg::load, Model::prepare + Model::run)";
}

std::string resolve_model(const std::string& id_or_path, const sapiens_seg::LoadOptions& options) {
  if (std::filesystem::exists(id_or_path)) return id_or_path;
  std::cerr << "speed_check: resolving model id " << id_or_path << "\n";
  return sapiens_seg::fetch(id_or_path, options.fetch);
}

std::string cpu_gemm_line() {
  return sapiens_seg::system_info().cpu_gemm;
}

}  // namespace speed_check
