// The public Model: ties cards, the weight store, decoding (IO layer) and a Runner (core).
#include "sapiens_seg/model.hpp"

#include <ATen/Parallel.h>

#include <chrono>
#include <filesystem>
#include <optional>

#include <opencv2/core.hpp>

#include "../core/backends.hpp"
#include "../core/checkpoint.hpp"
#include "../core/tensor_ops.hpp"
#include "../core/v1/vit_seg.hpp"
#include "../io/image.hpp"
#include "../io/log.hpp"
#include "../io/weights.hpp"
#include "sapiens_seg/cards.hpp"
#include "sapiens_seg/version.hpp"

namespace sapiens_seg {
namespace fs = std::filesystem;

// ---- Result --------------------------------------------------------------------------------

std::vector<std::uint8_t> Result::foreground() const {
  std::vector<std::uint8_t> fg(labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) fg[i] = labels[i] != 0 ? 1 : 0;
  return fg;
}

const char* version() noexcept {
  return SAPIENS_SEG_VERSION;
}

namespace {
Image to_image(const cv::Mat& rgb) {
  Image img;
  img.height = rgb.rows;
  img.width = rgb.cols;
  img.rgb.resize(rgb.total() * 3);
  cv::Mat dst(rgb.rows, rgb.cols, CV_8UC3, img.rgb.data());
  rgb.copyTo(dst);
  return img;
}
}  // namespace

Image read_image(const std::string& path) {
  return to_image(io::decode_file(path));
}

Image read_image(const std::vector<std::uint8_t>& encoded) {
  return to_image(io::decode_bytes(encoded, "encoded image"));
}

Image overlay(const Result& result, ImageView image, float opacity) {
  if (image.height != result.height || image.width != result.width) {
    throw Error(ErrorCode::kInvalidInput, "overlay: the image is " + std::to_string(image.width) +
                                              "x" + std::to_string(image.height) +
                                              " but the result is " + std::to_string(result.width) +
                                              "x" + std::to_string(result.height));
  }
  if (!(opacity >= 0.0f && opacity <= 1.0f)) {
    throw Error(ErrorCode::kInvalidInput, "overlay: opacity must be in [0, 1]");
  }
  const cv::Mat src = io::wrap_view(image, "overlay image");
  Image out;
  out.height = image.height;
  out.width = image.width;
  out.rgb.resize(static_cast<std::size_t>(out.height) * out.width * 3);
  for (int y = 0; y < out.height; ++y) {
    const std::uint8_t* s = src.ptr<std::uint8_t>(y);
    std::uint8_t* d = out.rgb.data() + static_cast<std::size_t>(y) * out.width * 3;
    const std::uint8_t* l = result.labels.data() + static_cast<std::size_t>(y) * out.width;
    for (int x = 0; x < out.width; ++x) {
      const auto& c = result.palette.at(l[x]);
      for (int ch = 0; ch < 3; ++ch) {
        d[3 * x + ch] =
            static_cast<std::uint8_t>(static_cast<float>(s[3 * x + ch]) * (1.0f - opacity) +
                                      static_cast<float>(c[ch]) * opacity);
      }
    }
  }
  return out;
}

// ---- Model ---------------------------------------------------------------------------------

struct Model::Impl {
  ModelInfo info;
  std::vector<std::string> classes;
  std::vector<std::array<std::uint8_t, 3>> palette;
  std::array<float, 3> mean{}, std{};
  int input_h = 0, input_w = 0;
  std::unique_ptr<core::Runner> runner;
};

Model::Model(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

const ModelInfo& Model::info() const {
  return impl_->info;
}

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

bool looks_like_path(const std::string& s) {
  std::error_code ec;
  if (fs::exists(s, ec) || s.find('/') != std::string::npos) return true;
  for (const char* ext : {".pt2", ".pt", ".safetensors"}) {
    const std::string e(ext);
    if (s.size() > e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

// The 28 Goliath labels are the only v1 label set; a bare checkpoint with 28 classes gets them
// from any v1 card that has them.
std::optional<Card> card_for_file(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  for (auto& c : list_cards()) {
    if (c.file == name) return c;
  }
  return std::nullopt;
}

std::optional<Card> goliath_labels() {
  for (auto& c : list_cards()) {
    if (c.label_set == "goliath-28") return c;
  }
  return std::nullopt;
}

}  // namespace

Model load(const std::string& id_or_path, const LoadOptions& opt) {
  const auto t0 = Clock::now();
  if (opt.threads > 0) at::set_num_threads(opt.threads);
  const io::GateOptions gate{opt.accept_noncommercial, opt.allow_unverified};

  std::optional<Card> card;
  std::string path, sha256;
  if (looks_like_path(id_or_path)) {
    path = id_or_path;
    // A file that is a known checkpoint (by name) is held to its card: licence and hash.
    card = card_for_file(path);
    if (card) {
      io::check_license(*card, gate);
      if (!fs::exists(path)) throw Error(ErrorCode::kNotFound, "checkpoint not found: " + path);
      sha256 = io::verify_weights(*card, path, gate);
    }
  } else {
    card = find_card(id_or_path);
    io::check_license(*card, gate);
    const io::Verified v = io::obtain_weights(*card, gate, opt.fetch);
    path = v.path;
    sha256 = v.sha256;
  }
  if (card && card->family != "sapiens-v1") {
    throw Error(ErrorCode::kBackendUnavailable,
                "model family '" + card->family + "' is not supported by this build");
  }

  auto ckpt = core::open_torchscript(path);
  core::v1::ConfigHints hints;
  if (card) {
    hints.heads = card->heads;
    hints.grid_h = card->input_height / card->patch;
    hints.grid_w = card->input_width / card->patch;
  }
  if (ckpt.heads_from_graph) {
    if (hints.heads && *hints.heads != *ckpt.heads_from_graph) {
      throw Error(ErrorCode::kFormatError, path + ": the card says " +
                                               std::to_string(*hints.heads) +
                                               " attention heads but the traced graph uses " +
                                               std::to_string(*ckpt.heads_from_graph));
    }
    hints.heads = *ckpt.heads_from_graph;
  }
  if (opt.input_height > 0) hints.input_h = opt.input_height;
  if (opt.input_width > 0) hints.input_w = opt.input_width;
  core::v1::Config cfg;
  try {
    cfg = core::v1::infer_config(ckpt.tensors, hints);
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
  if (card && cfg.num_classes != card->num_classes) {
    throw Error(ErrorCode::kFormatError,
                path + ": the network has " + std::to_string(cfg.num_classes) +
                    " classes but its card lists " + std::to_string(card->num_classes));
  }

  const c10::Device device = core::resolve_device(opt.device);
  const at::ScalarType dtype = core::resolve_dtype(opt.dtype, device);
  auto impl = std::make_shared<Model::Impl>();
  switch (opt.mode) {
    case Mode::kOriginal:
      if (opt.input_height > 0 || opt.input_width > 0) {
        throw Error(ErrorCode::kBackendUnavailable,
                    "the original mode runs the traced graph at its own input size only");
      }
      impl->runner = core::make_original_v1(ckpt, cfg, device, dtype);
      break;
    case Mode::kKernels:
      throw Error(ErrorCode::kBackendUnavailable,
                  "kernels mode unavailable: " + core::kernels_unavailable_reason(device));
    case Mode::kAuto: {
      const std::string why = core::kernels_unavailable_reason(device);
      io::log(io::Level::kInfo,
              "auto mode: portable (" +
                  (why.empty() ? std::string("no kernel measurements in card") : why) + ")");
      impl->runner = core::make_portable_v1(ckpt, cfg, device, dtype);
      break;
    }
    case Mode::kPortable:
      impl->runner = core::make_portable_v1(ckpt, cfg, device, dtype);
      break;
  }

  impl->input_h = static_cast<int>(cfg.input_h);
  impl->input_w = static_cast<int>(cfg.input_w);
  const std::optional<Card> labels =
      card ? card : (cfg.num_classes == 28 ? goliath_labels() : std::nullopt);
  if (labels) {
    impl->classes = labels->classes;
    impl->palette = labels->palette;
  } else {
    for (int64_t k = 0; k < cfg.num_classes; ++k) {
      impl->classes.push_back("class_" + std::to_string(k));
      const auto v = static_cast<std::uint8_t>((k * 67) % 256);
      impl->palette.push_back(
          {v, static_cast<std::uint8_t>(255 - v), static_cast<std::uint8_t>((k * 151) % 256)});
    }
  }
  // Normalisation: the card's values, else the authors' (same for every v1 model).
  const Card* norm = card ? &*card : (labels ? &*labels : nullptr);
  if (norm) {
    impl->mean = opt.normalization == Normalization::kDemo ? norm->mean : norm->mean_train;
    impl->std = opt.normalization == Normalization::kDemo ? norm->std : norm->std_train;
  } else {
    impl->mean = opt.normalization == Normalization::kDemo
                     ? std::array<float, 3>{123.5f, 116.5f, 103.5f}
                     : std::array<float, 3>{123.675f, 116.28f, 103.53f};
    impl->std = opt.normalization == Normalization::kDemo
                    ? std::array<float, 3>{58.5f, 57.0f, 57.5f}
                    : std::array<float, 3>{58.395f, 57.12f, 57.375f};
  }

  ModelInfo& info = impl->info;
  info.id = card ? card->id : fs::path(path).filename().string();
  info.family = "sapiens-v1";
  info.path = path;
  info.sha256 = sha256;
  info.license = card ? card->license_id : "";
  info.input_height = impl->input_h;
  info.input_width = impl->input_w;
  info.num_classes = static_cast<int>(cfg.num_classes);
  info.embed_dim = static_cast<int>(cfg.embed_dim);
  info.depth = static_cast<int>(cfg.depth);
  info.heads = static_cast<int>(cfg.heads);
  info.backend = impl->runner->backend();
  io::log(io::Level::kInfo, "loaded " + info.id + " (" + info.backend.mode + ", " +
                                info.backend.device + ", " + info.backend.dtype + ") in " +
                                std::to_string(static_cast<int>(ms_since(t0))) + " ms");
  return Model(std::move(impl));
}

Result Model::segment(const Input& input, const SegmentOptions& options) const {
  return std::move(segment(std::span<const Input>(&input, 1), options).front());
}

std::vector<Result> Model::segment(std::span<const Input> batch,
                                   const SegmentOptions& options) const {
  const Impl& m = *impl_;
  if (batch.empty()) return {};
  const auto t_start = Clock::now();
  std::vector<Result> results(batch.size());
  std::vector<at::Tensor> inputs;
  inputs.reserve(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const std::string what = batch[i].kind() == Input::Kind::kFile
                                 ? batch[i].path()
                                 : "image " + std::to_string(i) + " of the batch";
    auto t0 = Clock::now();
    const cv::Mat rgb = io::load_input(batch[i], what);
    results[i].timings.decode = ms_since(t0);
    t0 = Clock::now();
    const cv::Mat resized = io::resize_linear(rgb, m.input_h, m.input_w);
    inputs.push_back(
        core::normalize_rgb(resized.data, resized.rows, resized.cols, resized.step, m.mean, m.std));
    results[i].timings.preprocess = ms_since(t0);
    results[i].height = rgb.rows;
    results[i].width = rgb.cols;
  }

  const auto t_net = Clock::now();
  at::Tensor logits;
  try {
    logits = m.runner->forward(at::stack(inputs));
  } catch (const c10::Error& e) {
    std::string why = e.what_without_backtrace();
    throw Error(ErrorCode::kInternal, "inference failed: " + why.substr(0, why.find('\n')));
  }
  const double net_ms = ms_since(t_net);

  for (std::size_t i = 0; i < batch.size(); ++i) {
    Result& r = results[i];
    const auto t0 = Clock::now();
    const at::Tensor one = logits[static_cast<int64_t>(i)].contiguous();
    r.labels.resize(static_cast<std::size_t>(r.height) * r.width);
    if (options.logits) r.logits.resize(static_cast<std::size_t>(one.size(0)) * r.labels.size());
    core::upsample_argmax(one, r.height, r.width, r.labels.data(),
                          options.logits ? r.logits.data() : nullptr);
    if (options.raw_logits) {
      r.raw_height = static_cast<int>(one.size(1));
      r.raw_width = static_cast<int>(one.size(2));
      r.raw_logits.assign(one.const_data_ptr<float>(), one.const_data_ptr<float>() + one.numel());
    }
    r.classes = m.classes;
    r.palette = m.palette;
    r.backend = m.runner->backend();
    r.timings.network = net_ms;
    r.timings.postprocess = ms_since(t0);
  }
  const double total = ms_since(t_start);
  for (auto& r : results) r.timings.total = total;
  return results;
}

}  // namespace sapiens_seg
