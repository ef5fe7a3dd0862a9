// The public Model: the weight store hands loading a verified checkpoint, its family's folder in
// core/ builds the network, and segment() is prepare() (decode, resize, normalise) then run() (the
// network, then each image's upsample + argmax).
#include "sapiens_seg/model.hpp"

#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>

#include <opencv2/core.hpp>

#include "../core/backends/backends.hpp"
#include "../core/pipeline/build.hpp"
#include "../core/pipeline/pipeline.hpp"
#include "../io/image.hpp"
#include "../io/log.hpp"
#include "../io/weights.hpp"
#include "fork.hpp"
#include "sapiens_seg/cards.hpp"

namespace sapiens_seg {
namespace fs = std::filesystem;

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

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
  int height = 0, width = 0;
  Timings timings;
  // The network input: released by the run() that used it (the pixels stay, for overlays), so
  // a result kept with its Prepared (a list of Python results, a server's answer) does not keep
  // ~9 MB of float32 input alive. A run that fails leaves it, so the image can run again.
  mutable std::mutex mu;
  mutable core::PreparedInput prepared;
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
  return impl_ ? impl_->height : 0;
}
int Prepared::width() const noexcept {
  return impl_ ? impl_->width : 0;
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

// What loading asks of the family's network; the card's facts are added once it is known.
core::BuildRequest build_request(const LoadOptions& opt, const c10::Device& device,
                                 at::ScalarType dtype) {
  core::BuildRequest r;
  r.mode = opt.mode;
  r.device = device;
  r.dtype = dtype;
  r.input_height = opt.input_height;
  r.input_width = opt.input_width;
  return r;
}

// The label set of a bare checkpoint: the classes of any bundled card of its family and size.
std::optional<Card> labels_for(const core::FamilyTraits& family, std::int64_t num_classes) {
  for (auto& c : list_cards()) {
    if (c.label_set == family.label_set && c.num_classes == num_classes) return c;
  }
  return std::nullopt;
}

// What the model is and how images become its input, in one place: the card's facts (or, for a
// checkpoint no card describes, a bundled card of its family with the same classes, else
// numbered classes and the family's normalisation), the network's shape and the backend; the
// card's resize and normalisation, the network's input size, where the work runs.
void describe(Model::Impl& m, const io::OpenedCheckpoint& ckpt, const core::Built& net,
              const LoadOptions& opt) {
  const core::FamilyTraits& family = *ckpt.family;
  const std::optional<Card>& card = ckpt.card;
  const std::optional<Card> labels = card ? card : labels_for(family, net.num_classes);
  ModelInfo& info = m.info;
  info.id = card ? card->id : fs::path(ckpt.path).filename().string();
  info.family = family.name;
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
  if (labels) {
    info.classes = labels->classes;
    info.palette = labels->palette;
  } else {
    // No card names these classes: numbered, with distinct colours so an overlay shows them.
    for (std::int64_t k = 0; k < net.num_classes; ++k) {
      info.classes.push_back("class_" + std::to_string(k));
      const auto v = static_cast<std::uint8_t>((k * 67) % 256);
      info.palette.push_back(
          {v, static_cast<std::uint8_t>(255 - v), static_cast<std::uint8_t>((k * 151) % 256)});
    }
  }

  const bool demo = opt.normalization == Normalization::kDemo;
  core::InputRecipe& r = m.recipe;
  r.input_height = info.input_height;
  r.input_width = info.input_width;
  if (labels) {
    r.mean = demo ? labels->mean : labels->mean_train;
    r.std = demo ? labels->std : labels->std_train;
  } else {
    const core::MeanStd& ms = demo ? family.demo : family.training;
    r.mean = ms.mean;
    r.std = ms.std;
  }
  r.area_or_cubic = (card ? card->resize : std::string(family.resize)) == "area_or_cubic";
  r.cubic =
      opt.cubic == CubicResize::kOpenCV ? core::CubicFlavor::kOpenCV : core::CubicFlavor::kWheel;
  r.on_device = opt.pipeline == Pipeline::kDevice ||
                (opt.pipeline == Pipeline::kAuto && !net.runner->device().is_cpu());
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
  api::settle_after_fork();
  if (opt.threads > 0) at::set_num_threads(opt.threads);
  // 1. Device and dtype: one that cannot run here (no CUDA, bfloat16 on a CPU without fast
  //    bfloat16 GEMMs) fails before any download, hashing or reading.
  const c10::Device device = core::resolve_device(opt.device);
  const at::ScalarType dtype = core::resolve_dtype(opt.dtype, device);
  core::BuildRequest request = build_request(opt, device, dtype);
  // 2. The checkpoint, resolved, licensed, obtained, read once and verified (io/weights.hpp).
  const io::OpenedCheckpoint ckpt =
      io::open_checkpoint(id_or_path, {opt.accept_noncommercial, opt.allow_unverified}, opt.fetch);
  // 3. Its family's network on a Runner of the asked mode (core/v1, core/v2), held to its card.
  request.card = ckpt.card_facts;
  core::Built net = core::build(ckpt.family->family, ckpt.bytes, ckpt.path, request);
  // 4. What the model is, and how images become its input.
  auto impl = std::make_shared<Model::Impl>();
  describe(*impl, ckpt, net, opt);
  log_auto_choice(opt, device);
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
  p->height = p->prepared.height;
  p->width = p->prepared.width;
  p->timings.preprocess = ms_since(t1);
  return p;
}

std::vector<Result> run_unguarded(const Model::Impl& m, std::span<const Prepared> batch,
                                  const SegmentOptions& options) {
  // Copies of the inputs' handles (the tensors are shared, not copied), taken under each
  // Prepared's lock: another thread may be releasing one.
  std::vector<core::PreparedInput> held(batch.size());
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
    {
      const std::lock_guard<std::mutex> lock(p.mu);
      held[i] = p.prepared;
    }
    if (!held[i].input.defined()) {
      throw Error(ErrorCode::kInvalidInput,
                  "image " + std::to_string(i) +
                      " of the batch has run already (run() releases its network input): "
                      "prepare it again to run it again");
    }
    inputs.push_back(&held[i]);
  }
  core::BatchOutput out =
      core::run(*m.runner, m.recipe, inputs, options.logits, options.raw_logits);
  inputs.clear();
  held.clear();
  for (const Prepared& p : batch) {
    const std::lock_guard<std::mutex> lock(p.impl().mu);
    p.impl().prepared.input = at::Tensor();
  }
  std::vector<Result> results(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Prepared::Impl& p = batch[i].impl();
    core::ImageOutput& o = out.images[i];
    Result& r = results[i];
    r.height = p.height;
    r.width = p.width;
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
  api::settle_after_fork();
  try {
    return Prepared(prepare_unguarded(m, input, describe(input)));
  } catch (...) {
    throw as_error(std::current_exception(), "preparing " + describe(input));
  }
}

std::vector<Result> Model::run(std::span<const Prepared> batch,
                               const SegmentOptions& options) const {
  const Impl& m = checked();
  api::settle_after_fork();
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
  api::settle_after_fork();
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
