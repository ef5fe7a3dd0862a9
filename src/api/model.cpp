// The public Model: the weight store hands loading a verified checkpoint, its family's folder in
// core/ builds the network, and segment() is prepare() (decode, resize, normalise) then run() (the
// network, then each image's upsample + argmax).
#include "sapiens_seg/model.hpp"

#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>
#include <filesystem>
#include <optional>

#include <opencv2/core.hpp>

#include "../core/backends/backends.hpp"
#include "../core/families.hpp"
#include "../core/pipeline/build.hpp"
#include "../core/pipeline/pipeline.hpp"
#include "../io/image.hpp"
#include "../io/image_header.hpp"
#include "../io/log.hpp"
#include "../io/weights.hpp"
#include "sapiens_seg/cards.hpp"
#include "sapiens_seg/version.hpp"

namespace sapiens_seg {
namespace fs = std::filesystem;

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

// ---- Result, images ------------------------------------------------------------------------

std::vector<std::uint8_t> Result::foreground() const {
  std::vector<std::uint8_t> fg(labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) fg[i] = labels[i] != 0 ? 1 : 0;
  return fg;
}

const char* version() noexcept {
  return SAPIENS_SEG_VERSION;
}

Image read_image(const std::string& path) {
  try {
    return io::decode_image_file(path);
  } catch (...) {
    throw as_error(std::current_exception(), "reading " + path);
  }
}

Image read_image(const std::vector<std::uint8_t>& encoded) {
  try {
    return io::decode_image(encoded.data(), encoded.size(), "encoded image");
  } catch (...) {
    throw as_error(std::current_exception(), "reading an encoded image");
  }
}

ImageInfo read_image_info(const std::uint8_t* data, std::size_t size) {
  try {
    return io::image_info(data, size, "encoded image");
  } catch (...) {
    throw as_error(std::current_exception(), "reading an image header");
  }
}

ImageInfo read_image_info(const std::string& path) {
  try {
    return io::image_info_file(path);
  } catch (...) {
    throw as_error(std::current_exception(), "reading the header of " + path);
  }
}

namespace {
Image overlay_unguarded(const Result& result, ImageView image, float opacity) {
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
}  // namespace

Image overlay(const Result& result, ImageView image, float opacity) {
  try {
    return overlay_unguarded(result, image, opacity);
  } catch (...) {
    throw as_error(std::current_exception(), "overlay");
  }
}

// ---- Model and Prepared --------------------------------------------------------------------

struct Model::Impl {
  ModelInfo info;
  core::InputRecipe recipe;
  std::unique_ptr<core::Runner> runner;
};

struct Prepared::Impl {
  const Model::Impl* model = nullptr;  // whose recipe made `prepared` (run() checks it)
  Input input;                         // an RGB input: keeps rgb_copy()'s pixels alive
  Image decoded;                       // files and encoded bytes
  ImageView view;                      // the pixels: `decoded`'s or the caller's
  core::PreparedInput prepared;
  Timings timings;
};

Model::Model(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

const Model::Impl& Model::checked() const {
  if (!impl_) {
    throw Error(ErrorCode::kInvalidInput,
                "this Model is empty (default-constructed): assign it the result of "
                "sapiens_seg::load()");
  }
  return *impl_;
}

const ModelInfo& Model::info() const {
  return checked().info;
}

Prepared::Prepared(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

const Prepared::Impl& Prepared::impl() const {
  if (!impl_) throw Error(ErrorCode::kInvalidInput, "an empty Prepared (nothing was prepared)");
  return *impl_;
}

int Prepared::height() const noexcept {
  return impl_ ? impl_->prepared.height : 0;
}
int Prepared::width() const noexcept {
  return impl_ ? impl_->prepared.width : 0;
}
ImageView Prepared::image() const noexcept {
  return impl_ ? impl_->view : ImageView{};
}
const std::vector<std::string>& Prepared::warnings() const noexcept {
  static const std::vector<std::string> none;
  return impl_ ? impl_->decoded.warnings : none;
}
const Timings& Prepared::timings() const noexcept {
  static const Timings zero;
  return impl_ ? impl_->timings : zero;
}

// ---- loading, top-down ---------------------------------------------------------------------

namespace {

core::BuildRequest build_request(const LoadOptions& opt, const std::optional<Card>& card,
                                 const c10::Device& device, at::ScalarType dtype) {
  core::BuildRequest r;
  r.mode = opt.mode;
  r.device = device;
  r.dtype = dtype;
  r.input_height = opt.input_height;
  r.input_width = opt.input_width;
  if (card) {
    r.card = core::CardFacts{card->id,           card->source,      card->heads,
                             card->input_height, card->input_width, card->patch};
  }
  return r;
}

// The label set of a bare checkpoint: the classes of any bundled card of its family and size.
std::optional<Card> labels_for(core::Family family, std::int64_t num_classes) {
  const std::string_view set = core::traits_of(family).label_set;
  for (auto& c : list_cards()) {
    if (c.label_set == set && c.num_classes == num_classes) return c;
  }
  return std::nullopt;
}

// Everything ModelInfo says, in one place: the card's facts (or, for a checkpoint no card
// describes, a bundled card of its family with the same classes, else numbered classes), the
// network's shape and the backend.
ModelInfo describe(const io::OpenedCheckpoint& ckpt, const core::Built& net) {
  ModelInfo info;
  const std::optional<Card>& card = ckpt.card;
  info.id = card ? card->id : fs::path(ckpt.path).filename().string();
  info.family = core::traits_of(ckpt.family).name;
  info.path = ckpt.path;
  info.sha256 = ckpt.sha256;
  info.license = card ? card->license_id : "";
  info.input_height = static_cast<int>(net.input_height);
  info.input_width = static_cast<int>(net.input_width);
  info.num_classes = static_cast<int>(net.num_classes);
  info.embed_dim = static_cast<int>(net.embed_dim);
  info.depth = static_cast<int>(net.depth);
  info.heads = static_cast<int>(net.heads);
  info.backend = net.runner->backend();
  if (const std::optional<Card> labels = card ? card : labels_for(ckpt.family, net.num_classes)) {
    info.classes = labels->classes;
    info.palette = labels->palette;
    return info;
  }
  // No card names these classes: numbered, with distinct colours so an overlay still shows them.
  for (std::int64_t k = 0; k < net.num_classes; ++k) {
    info.classes.push_back("class_" + std::to_string(k));
    const auto v = static_cast<std::uint8_t>((k * 67) % 256);
    info.palette.push_back(
        {v, static_cast<std::uint8_t>(255 - v), static_cast<std::uint8_t>((k * 151) % 256)});
  }
  return info;
}

// How images become the network's input: the card's resize and normalisation, else the family's
// (families.hpp); the network's input size; where the work runs.
core::InputRecipe recipe_for(const io::OpenedCheckpoint& ckpt, const core::Built& net,
                             const LoadOptions& opt) {
  const core::FamilyTraits& family = core::traits_of(ckpt.family);
  const std::optional<Card> norm = ckpt.card ? ckpt.card : labels_for(ckpt.family, net.num_classes);
  const bool demo = opt.normalization == Normalization::kDemo;
  core::InputRecipe r;
  r.input_height = static_cast<int>(net.input_height);
  r.input_width = static_cast<int>(net.input_width);
  if (norm) {
    r.mean = demo ? norm->mean : norm->mean_train;
    r.std = demo ? norm->std : norm->std_train;
  } else {
    const core::MeanStd& ms = demo ? family.demo : family.training;
    r.mean = ms.mean;
    r.std = ms.std;
  }
  r.area_or_cubic = (ckpt.card ? ckpt.card->resize : std::string(family.resize)) == "area_or_cubic";
  r.cubic =
      opt.cubic == CubicResize::kOpenCV ? core::CubicFlavor::kOpenCV : core::CubicFlavor::kWheel;
  r.on_device = opt.pipeline == Pipeline::kDevice ||
                (opt.pipeline == Pipeline::kAuto && !net.runner->device().is_cpu());
  return r;
}

void log_auto_choice(const LoadOptions& opt, const c10::Device& device) {
  if (opt.mode != Mode::kAuto) return;
  // Kernels only where they run and a card's recorded measurement prefers them. No card records
  // kernel measurements yet, so auto is portable everywhere for now.
  const std::string why = core::kernels_unavailable_reason(device);
  io::log(io::Level::kInfo, "auto mode: portable (" +
                                (why.empty() ? std::string("the kernels can run here, but no card "
                                                           "records a measurement that prefers "
                                                           "them")
                                             : why) +
                                ")");
}

Model load_unguarded(const std::string& id_or_path, const LoadOptions& opt) {
  const auto t0 = Clock::now();
  if (opt.threads > 0) at::set_num_threads(opt.threads);
  // 1. Device and dtype: one that cannot run here (no CUDA, bfloat16 on a CPU without fast
  //    bfloat16 GEMMs) fails before any download, hashing or reading.
  const c10::Device device = core::resolve_device(opt.device);
  const at::ScalarType dtype = core::resolve_dtype(opt.dtype, device);
  // 2. The checkpoint, resolved, licensed, obtained, read once and verified (weights.hpp).
  const io::OpenedCheckpoint ckpt =
      io::open_checkpoint(id_or_path, {opt.accept_noncommercial, opt.allow_unverified}, opt.fetch);
  // 3. Its family's network on a Runner of the asked mode (core/v1, core/v2).
  core::Built net =
      core::build(ckpt.family, ckpt.bytes, ckpt.path, build_request(opt, ckpt.card, device, dtype));
  log_auto_choice(opt, device);
  if (ckpt.card && net.num_classes != ckpt.card->num_classes) {
    throw Error(ErrorCode::kFormatError,
                ckpt.path + ": the network has " + std::to_string(net.num_classes) +
                    " classes but its card lists " + std::to_string(ckpt.card->num_classes));
  }
  // 4. What the model is, and how images become its input.
  auto impl = std::make_shared<Model::Impl>();
  impl->info = describe(ckpt, net);
  impl->recipe = recipe_for(ckpt, net, opt);
  impl->runner =
      opt.cuda_graphs > 0
          ? core::with_cuda_graphs(std::move(net.runner), static_cast<std::size_t>(opt.cuda_graphs))
          : std::move(net.runner);
  // Calls run on streams of their own, which do not wait for the default stream that loading
  // may have queued work on.
  if (!device.is_cpu()) {
    c10::impl::getDeviceGuardImpl(device.type())
        ->synchronizeDevice(device.has_index() ? device.index() : 0);
  }
  const ModelInfo& info = impl->info;
  io::log(io::Level::kInfo, "loaded " + info.id + " (" + info.family + ", " + info.backend.mode +
                                ", " + info.backend.device + ", " + info.backend.dtype + ") in " +
                                std::to_string(static_cast<int>(ms_since(t0))) + " ms");
  return Model(std::move(impl));
}

}  // namespace

Model load(const std::string& id_or_path, const LoadOptions& opt) {
  try {
    return load_unguarded(id_or_path, opt);
  } catch (...) {
    throw as_error(std::current_exception(), "loading " + id_or_path);
  }
}

// ---- segmenting: prepare, then run ---------------------------------------------------------

namespace {

std::string describe(const Input& input) {
  return input.kind() == Input::Kind::kFile      ? input.path()
         : input.kind() == Input::Kind::kEncoded ? std::string("encoded image")
                                                 : std::string("RGB image");
}

// `what` names the image in messages.
std::shared_ptr<Prepared::Impl> prepare_unguarded(const Model::Impl& m, const Input& input,
                                                  const std::string& what) {
  auto p = std::make_shared<Prepared::Impl>();
  p->model = &m;
  // Pixels given by rgb_copy() live in the Input: kept with it. Encoded bytes are not kept.
  if (input.kind() == Input::Kind::kRgb) p->input = input;
  const auto t0 = Clock::now();
  io::LoadedInput loaded = io::load_input(input, what);
  p->decoded = std::move(loaded.decoded);
  const cv::Mat& rgb = loaded.rgb;
  p->view = input.kind() == Input::Kind::kRgb
                ? input.view()
                : ImageView{p->decoded.rgb.data(), p->decoded.height, p->decoded.width, 0};
  if (input.kind() != Input::Kind::kRgb) p->timings.decode = ms_since(t0);
  const auto t1 = Clock::now();
  p->prepared =
      core::prepare({rgb.data, rgb.rows, rgb.cols, 3, rgb.step}, m.recipe, m.runner->device());
  p->timings.preprocess = ms_since(t1);
  return p;
}

std::vector<Result> run_unguarded(const Model::Impl& m, std::span<const Prepared> batch,
                                  const SegmentOptions& options) {
  std::vector<const core::PreparedInput*> inputs;
  inputs.reserve(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].empty()) {
      throw Error(ErrorCode::kInvalidInput,
                  "image " + std::to_string(i) + " of the batch is an empty Prepared");
    }
    const Prepared::Impl& p = batch[i].impl();
    if (p.model != &m) {
      throw Error(ErrorCode::kInvalidInput,
                  "image " + std::to_string(i) +
                      " of the batch was prepared by another model (its size and normalisation "
                      "are that model's): prepare it with this one");
    }
    inputs.push_back(&p.prepared);
  }
  core::BatchOutput out =
      core::run(*m.runner, m.recipe, inputs, options.logits, options.raw_logits);
  std::vector<Result> results(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Prepared::Impl& p = batch[i].impl();
    core::ImageOutput& o = out.images[i];
    Result& r = results[i];
    r.height = p.prepared.height;
    r.width = p.prepared.width;
    r.labels = std::move(o.labels);
    r.logits = std::move(o.logits);
    r.raw_logits = std::move(o.raw_logits);
    r.raw_height = o.raw_height;
    r.raw_width = o.raw_width;
    r.classes = m.info.classes;
    r.palette = m.info.palette;
    r.backend = m.runner->backend();
    r.warnings = p.decoded.warnings;
    Timings& t = r.timings;
    t.decode = p.timings.decode;
    t.preprocess = p.timings.preprocess + o.preprocess_ms;
    t.network = out.network_ms;
    t.postprocess = o.postprocess_ms;
    t.total = t.decode + t.preprocess + t.network + t.postprocess;
  }
  return results;
}

// A failed batch's error; an out-of-memory one says that a smaller batch needs less (most of a
// batch's memory grows with its size; the full-size logits of one image do not).
Error batch_error(std::size_t size) {
  const Error e =
      as_error(std::current_exception(), "segmenting " + std::to_string(size) + " image(s)");
  const std::string what = e.what();
  if (e.code() != ErrorCode::kOutOfMemory || size == 1 ||
      what.find("logits") != std::string::npos) {
    return e;
  }
  return Error(e.code(), what + " (a smaller batch needs less memory)");
}

}  // namespace

Prepared Model::prepare(const Input& input) const {
  const Impl& m = checked();
  try {
    return Prepared(prepare_unguarded(m, input, describe(input)));
  } catch (...) {
    throw as_error(std::current_exception(), "preparing " + describe(input));
  }
}

std::vector<Result> Model::run(std::span<const Prepared> batch,
                               const SegmentOptions& options) const {
  const Impl& m = checked();
  if (batch.empty()) return {};
  try {
    return run_unguarded(m, batch, options);
  } catch (...) {
    throw batch_error(batch.size());
  }
}

std::vector<Result> Model::segment(std::span<const Input> batch,
                                   const SegmentOptions& options) const {
  const Impl& m = checked();
  if (batch.empty()) return {};
  std::vector<Prepared> prepared;
  prepared.reserve(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const std::string what = batch[i].kind() == Input::Kind::kFile
                                 ? batch[i].path()
                                 : "image " + std::to_string(i) + " of the batch";
    try {
      prepared.emplace_back(prepare_unguarded(m, batch[i], what));
    } catch (...) {
      throw as_error(std::current_exception(), "segmenting " + what);
    }
  }
  return run(prepared, options);
}

Result Model::segment(const Input& input, const SegmentOptions& options) const {
  return std::move(segment(std::span<const Input>(&input, 1), options).front());
}

}  // namespace sapiens_seg
