// The public Model: ties cards, the weight store, decoding (IO layer) and a Runner (core).
#include "sapiens_seg/model.hpp"

#include <ATen/Parallel.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <optional>

#include <opencv2/core.hpp>

#include "../core/backends/backends.hpp"
#include "../core/checkpoint/mapped_file.hpp"
#include "../core/checkpoint/safetensors.hpp"
#include "../core/checkpoint/torchscript.hpp"
#include "../core/cpu/onednn_thread.hpp"
#include "../core/families.hpp"
#include "../core/resize/resize.hpp"
#include "../core/tensor_ops.hpp"
#include "../core/v1/vit_seg.hpp"
#include "../core/v2/sapiens2.hpp"
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

// ---- Model ---------------------------------------------------------------------------------

struct Model::Impl {
  ModelInfo info;
  std::vector<std::string> classes;
  std::vector<std::array<std::uint8_t, 3>> palette;
  std::array<float, 3> mean{}, std{};
  int input_h = 0, input_w = 0;
  std::string resize = "linear";  // or "area_or_cubic" (see Card::resize)
  core::CubicFlavor cubic = core::CubicFlavor::kWheel;
  bool device_pipeline = false;  // see Pipeline in options.hpp
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

}  // namespace

namespace {

// A file without a card: a zip archive is a Sapiens v1 TorchScript export; anything else is read
// as safetensors (Sapiens2), whose reader reports a file that is neither.
core::Family detect_family(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::memcmp(magic, "PK\x03\x04", 4) == 0) return core::Family::kSapiensV1;
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".pt2" || ext == ".pt") return core::Family::kSapiensV1;  // the zip check explains
  return core::Family::kSapiens2;
}

// The family of a card (checked against the table when the card was read) or of a bare file.
core::Family family_of(const std::optional<Card>& card, const std::string& path) {
  if (!card) return detect_family(path);
  const core::FamilyTraits* t = core::family_named(card->family);
  if (t == nullptr) {
    throw Error(ErrorCode::kFormatError, "card " + card->id + ": unknown family " + card->family);
  }
  return t->family;
}

// The label set of a bare checkpoint: the classes of any bundled card of its family and size.
std::optional<Card> labels_for(core::Family family, int64_t num_classes) {
  const std::string_view set = core::traits_of(family).label_set;
  for (auto& c : list_cards()) {
    if (c.label_set == set && c.num_classes == num_classes) return c;
  }
  return std::nullopt;
}

struct Loaded {
  int64_t num_classes = 0, embed_dim = 0, depth = 0, heads = 0, input_h = 0, input_w = 0;
};

std::unique_ptr<core::Runner> pick_runner(
    const LoadOptions& opt, c10::Device device,
    const std::function<std::unique_ptr<core::Runner>()>& portable,
    const std::function<std::unique_ptr<core::Runner>()>& original,
    const std::function<std::unique_ptr<core::Runner>()>& kernels) {
  switch (opt.mode) {
    case Mode::kOriginal:
      return original();
    case Mode::kKernels: {
      const std::string why = core::kernels_unavailable_reason(device);
      if (!why.empty()) {
        throw Error(ErrorCode::kBackendUnavailable, "kernels mode unavailable: " + why);
      }
      return kernels();
    }
    case Mode::kAuto: {
      // Kernels only where they run and a card's recorded measurement prefers them. No card
      // records kernel measurements yet, so auto is portable everywhere for now.
      const std::string why = core::kernels_unavailable_reason(device);
      io::log(io::Level::kInfo,
              "auto mode: portable (" +
                  (why.empty() ? std::string("the kernels can run here, but no card records a "
                                             "measurement that prefers them")
                               : why) +
                  ")");
      return portable();
    }
    case Mode::kPortable:
      break;
  }
  return portable();
}

Loaded build_v1(Model::Impl& impl, const core::TorchScriptCheckpoint& ckpt, const std::string& path,
                const std::optional<Card>& card, const LoadOptions& opt, c10::Device device,
                at::ScalarType dtype) {
  core::v1::ConfigHints hints;
  if (card) {
    hints.heads = card->heads;
    hints.grid_h = card->input_height / card->patch;
    hints.grid_w = card->input_width / card->patch;
    // The card's input size fixes the position embedding's grid: a checkpoint trained at
    // another size is not the card's.
    if (auto it = ckpt.tensors.find("backbone.pos_embed");
        it != ckpt.tensors.end() && it->second.dim() == 3 &&
        it->second.size(1) != *hints.grid_h * *hints.grid_w) {
      throw Error(ErrorCode::kFormatError,
                  path + ": the card '" + card->id + "' (" + card->source +
                      ") gives the input size " + std::to_string(card->input_height) + "x" +
                      std::to_string(card->input_width) + ", a " + std::to_string(*hints.grid_h) +
                      "x" + std::to_string(*hints.grid_w) + " grid of " +
                      std::to_string(*hints.grid_h * *hints.grid_w) +
                      " patches, but the checkpoint's position embedding has " +
                      std::to_string(it->second.size(1)) +
                      " tokens: the card does not describe this checkpoint (correct its input "
                      "size, or rename the file so that no card claims it)");
    }
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
  impl.runner = pick_runner(
      opt, device, [&] { return core::make_portable_v1(ckpt, cfg, device, dtype); },
      [&] {
        if (opt.input_height > 0 || opt.input_width > 0) {
          throw Error(ErrorCode::kBackendUnavailable,
                      "the original mode runs the traced graph at its own input size only");
        }
        return core::make_original_v1(ckpt, cfg, device, dtype);
      },
      [&] { return core::make_kernels_v1(ckpt, cfg, device, dtype); });
  return {cfg.num_classes, cfg.embed_dim, cfg.depth, cfg.heads, cfg.input_h, cfg.input_w};
}

Loaded build_v2(Model::Impl& impl, const core::SafetensorsFile& file, const std::string& path,
                const std::optional<Card>& card, const LoadOptions& opt, c10::Device device,
                at::ScalarType dtype) {
  core::v2::ConfigHints hints;
  if (card) {
    hints.input_h = card->input_height;
    hints.input_w = card->input_width;
  }
  if (opt.input_height > 0) hints.input_h = opt.input_height;
  if (opt.input_width > 0) hints.input_w = opt.input_width;
  core::TensorMap tensors;
  core::v2::Config cfg;
  try {
    tensors = core::v2::to_original_names(file.all());
    cfg = core::v2::infer_config(tensors, hints);
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
  if (card && card->heads > 0 && card->heads != cfg.heads) {
    throw Error(ErrorCode::kFormatError, path + ": the card says " + std::to_string(card->heads) +
                                             " attention heads but the q/k-norm width gives " +
                                             std::to_string(cfg.heads));
  }
  impl.runner = pick_runner(
      opt, device, [&] { return core::make_portable_v2(tensors, cfg, device, dtype); },
      []() -> std::unique_ptr<core::Runner> {
        throw Error(ErrorCode::kBackendUnavailable,
                    "the original mode does not exist for Sapiens2: the authors release weights "
                    "(safetensors), not a traced graph, so there is nothing to run as shipped. "
                    "Use the portable mode (the network re-implemented from the authors' "
                    "module definition and checked against it).");
      },
      [&] { return core::make_kernels_v2(tensors, cfg, device, dtype); });
  return {cfg.num_classes, cfg.embed_dim, cfg.depth, cfg.heads, cfg.input_h, cfg.input_w};
}

}  // namespace

namespace {
// ---- loading, step by step -------------------------------------------------------------------

// What loading knows of the checkpoint, filled in step by step.
struct Weights {
  std::optional<Card> card;  // of the id, of the file's name, or (verify) of its content
  std::string path;          // "" until obtain() for a card id
  std::string sha256;        // "" until verify(), and for a file that needs no hash
  bool given_as_path = false;
};

// The name or path: a card id ("@revision" allowed), or a file, which a card claims when the file
// bears its file name. Reads no file.
Weights resolve(const std::string& id_or_path) {
  Weights w;
  if (looks_like_path(id_or_path)) {
    w.given_as_path = true;
    w.path = id_or_path;
    w.card = io::card_for_file_name(w.path);
  } else {
    w.card = find_card(id_or_path);
  }
  return w;
}

// The file: a path must exist; a card's file is found in the caches or downloaded (which hashes
// it on the way).
void obtain(Weights& w, const io::GateOptions& gate, const FetchOptions& fetch) {
  if (w.given_as_path) {
    // A directory, FIFO, socket or device is refused by what it is, before anything opens it (a
    // FIFO would block the hashing of step 4 until a writer came).
    core::check_regular_file(w.path, "checkpoint");
    return;
  }
  io::Obtained got = io::obtain_file(*w.card, gate, fetch);
  w.path = std::move(got.path);
  if (got.sha256) w.sha256 = *got.sha256;
}

// Its content: a card's file against the card's size and SHA-256. A file no card's name claims is
// still a card's file when its size and SHA-256 are (a renamed copy), and then its licence is
// checked here, as soon as it is known. Safetensors carry no checksum of their own, so they are
// always hashed and held to their first hash; TorchScript records carry CRC-32s, which the
// archive reader checks.
void verify(Weights& w, const io::GateOptions& gate) {
  if (w.card) {
    if (w.sha256.empty()) w.sha256 = io::verify_weights(*w.card, w.path, gate);
    return;
  }
  if (!fs::is_regular_file(w.path)) return;
  const io::Identified found =
      io::identify_by_content(w.path, detect_family(w.path) == core::Family::kSapiens2);
  w.sha256 = found.sha256;
  if (found.card) {
    w.card = found.card;
    io::check_license(*w.card, gate);
  }
}

Model load_unguarded(const std::string& id_or_path, const LoadOptions& opt) {
  const auto t0 = Clock::now();
  if (opt.threads > 0) at::set_num_threads(opt.threads);
  // Device and dtype first: one that cannot run here (no CUDA, bfloat16 on a CPU without fast
  // bfloat16 GEMMs) fails before any download, hashing or reading.
  const c10::Device device = core::resolve_device(opt.device);
  const at::ScalarType dtype = core::resolve_dtype(opt.dtype, device);
  const io::GateOptions gate{opt.accept_noncommercial, opt.allow_unverified};

  // 1. Resolve the name or path.
  Weights w = resolve(id_or_path);
  // 2. Check the licence of the card named: before any byte is downloaded or hashed. (A card
  //    that only the file's content names is checked in step 4, where it becomes known.)
  if (w.card) io::check_license(*w.card, gate);
  // 3. Obtain the file.
  obtain(w, gate, opt.fetch);
  // 4. Verify it.
  verify(w, gate);
  const std::optional<Card>& card = w.card;
  const std::string& path = w.path;
  const std::string& sha256 = w.sha256;
  const core::Family family = family_of(card, path);
  if (card) io::show_license_notice(*card);

  // 5. Open the format, 6. build the family's network on a Runner of the asked mode.
  auto impl = std::make_shared<Model::Impl>();
  Loaded cfg;
  if (family == core::Family::kSapiens2) {
    // The file's bytes, read once into private memory, stay while the network holds views of them
    // (CPU float32 weights are used in place; other devices and dtypes get one converted copy
    // each).
    const auto file = core::SafetensorsFile::open(path);
    cfg = build_v2(*impl, file, path, card, opt, device, dtype);
  } else {
    // Only the original mode runs the TorchScript module; the others read the tensors alone.
    const auto ckpt = core::open_torchscript(path, /*load_module=*/opt.mode == Mode::kOriginal);
    cfg = build_v1(*impl, ckpt, path, card, opt, device, dtype);
  }
  if (card && cfg.num_classes != card->num_classes) {
    throw Error(ErrorCode::kFormatError,
                path + ": the network has " + std::to_string(cfg.num_classes) +
                    " classes but its card lists " + std::to_string(card->num_classes));
  }

  impl->input_h = static_cast<int>(cfg.input_h);
  impl->input_w = static_cast<int>(cfg.input_w);
  impl->resize = card ? card->resize : std::string(core::traits_of(family).resize);
  impl->cubic =
      opt.cubic == CubicResize::kOpenCV ? core::CubicFlavor::kOpenCV : core::CubicFlavor::kWheel;
  if (opt.cuda_graphs > 0) {
    impl->runner =
        core::with_cuda_graphs(std::move(impl->runner), static_cast<std::size_t>(opt.cuda_graphs));
  }
  // Calls run on streams of their own, which do not wait for the default stream that loading
  // may have queued work on.
  if (!device.is_cpu()) {
    c10::impl::getDeviceGuardImpl(device.type())
        ->synchronizeDevice(device.has_index() ? device.index() : 0);
  }
  impl->device_pipeline = opt.pipeline == Pipeline::kDevice ||
                          (opt.pipeline == Pipeline::kAuto && !impl->runner->device().is_cpu());
  const std::optional<Card> labels = card ? card : labels_for(family, cfg.num_classes);
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
  // Normalisation: the card's values, else the authors' for the family. Sapiens2 uses the
  // ImageNet values in its demo and in training alike.
  const Card* norm = card ? &*card : (labels ? &*labels : nullptr);
  const std::array<float, 3> mean_train{123.675f, 116.28f, 103.53f};
  const std::array<float, 3> std_train{58.395f, 57.12f, 57.375f};
  if (norm) {
    impl->mean = opt.normalization == Normalization::kDemo ? norm->mean : norm->mean_train;
    impl->std = opt.normalization == Normalization::kDemo ? norm->std : norm->std_train;
  } else if (family == core::Family::kSapiens2 || opt.normalization == Normalization::kTraining) {
    impl->mean = mean_train;
    impl->std = std_train;
  } else {
    impl->mean = {123.5f, 116.5f, 103.5f};  // the Sapiens-Lite demo's rounded values
    impl->std = {58.5f, 57.0f, 57.5f};
  }

  ModelInfo& info = impl->info;
  info.id = card ? card->id : fs::path(path).filename().string();
  info.family = core::traits_of(family).name;
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
  info.classes = impl->classes;
  info.palette = impl->palette;
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

Result Model::segment(const Input& input, const SegmentOptions& options) const {
  return std::move(segment(std::span<const Input>(&input, 1), options).front());
}

namespace {

std::string describe(const Input& input, std::size_t i) {
  return input.kind() == Input::Kind::kFile ? input.path()
                                            : "image " + std::to_string(i) + " of the batch";
}

at::Tensor run_network(const core::Runner& runner, const at::Tensor& x, bool on_device) {
  try {
    const auto forward = [&] { return on_device ? runner.forward_device(x) : runner.forward(x); };
    // oneDNN (the CPU's convolutions) cannot build new primitives on a thread where it once ran
    // out of memory; such a call moves to a fresh thread. CUDA work stays on the caller's stream.
    return runner.device().is_cpu() ? core::run_clear_of_onednn_failures(forward) : forward();
  } catch (...) {
    throw as_error(std::current_exception(),
                   "inference failed on a batch of " + std::to_string(x.size(0)) + " image(s)");
  }
}

// Logits of one image to the host as contiguous float32 [K, h, w], then the CPU upsample +
// argmax (and the full-size or raw logits when asked for).
void finish_on_host(Result& r, const at::Tensor& logits, const SegmentOptions& options) {
  const at::Tensor one = logits.to(at::kCPU, at::kFloat).contiguous();
  r.labels.resize(static_cast<std::size_t>(r.height) * r.width);
  if (options.logits) {
    const auto n = static_cast<std::size_t>(one.size(0)) * r.labels.size();
    try {
      r.logits.resize(n);
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::kOutOfMemory,
                  "out of memory for the full-size logits of a " + std::to_string(r.width) + "x" +
                      std::to_string(r.height) + " image (" + std::to_string(one.size(0)) +
                      " float32 channels, " + std::to_string(n * sizeof(float) >> 20) +
                      " MiB); labels alone need no logits");
    }
  }
  core::upsample_argmax(one, r.height, r.width, r.labels.data(),
                        options.logits ? r.logits.data() : nullptr);
  if (options.raw_logits) {
    r.raw_height = static_cast<int>(one.size(1));
    r.raw_width = static_cast<int>(one.size(2));
    r.raw_logits.assign(one.const_data_ptr<float>(), one.const_data_ptr<float>() + one.numel());
  }
}

// The decoded image as a uint8 [h, w, 3] tensor on `device`. For a GPU it goes through pinned
// (page-locked) staging from LibTorch's caching host allocator and is copied asynchronously, so
// the upload overlaps the decoding of the next image; the allocator keeps the staging block
// until the copy has finished.
at::Tensor upload(const cv::Mat& rgb, const c10::Device& device) {
  const bool gpu = !device.is_cpu();
  at::Tensor host =
      at::empty({rgb.rows, rgb.cols, 3}, at::TensorOptions().dtype(at::kByte).pinned_memory(gpu));
  auto* dst = host.data_ptr<std::uint8_t>();
  const auto row = static_cast<std::size_t>(rgb.cols) * 3;
  for (int y = 0; y < rgb.rows; ++y) std::memcpy(dst + y * row, rgb.ptr<std::uint8_t>(y), row);
  return gpu ? host.to(device, /*non_blocking=*/true) : host;
}

}  // namespace

namespace {

std::vector<Result> segment_unguarded(const Model::Impl& m, std::span<const Input> batch,
                                      const SegmentOptions& options) {
  if (batch.empty()) return {};
  const auto t_start = Clock::now();
  const bool on_device = m.device_pipeline;
  const c10::Device device = m.runner->device();
  // On a GPU each call queues its work on a stream of its own, so calls from several threads
  // overlap (one call's upload and resize with another's network).
  std::optional<c10::StreamGuard> stream;
  if (on_device && !device.is_cpu()) {
    stream.emplace(c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device));
  }
  std::vector<Result> results(batch.size());
  std::vector<at::Tensor> inputs;
  inputs.reserve(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    auto t0 = Clock::now();
    io::LoadedInput loaded = io::load_input(batch[i], describe(batch[i], i));
    const cv::Mat& rgb = loaded.rgb;
    results[i].warnings = std::move(loaded.decoded.warnings);
    results[i].timings.decode = ms_since(t0);
    results[i].height = rgb.rows;
    results[i].width = rgb.cols;
    t0 = Clock::now();
    const core::Interp interp = m.resize == "area_or_cubic"
                                    ? core::sapiens2_interp(rgb.cols, m.input_w)
                                    : core::Interp::kLinear;
    if (!on_device) {
      cv::Mat resized(m.input_h, m.input_w, CV_8UC3);
      core::resize_u8({rgb.data, rgb.rows, rgb.cols, 3, rgb.step},
                      {resized.data, resized.rows, resized.cols, 3, resized.step}, interp, m.cubic);
      inputs.push_back(core::normalize_rgb(resized.data, resized.rows, resized.cols, resized.step,
                                           m.mean, m.std));
    } else {
      inputs.push_back(core::resize_normalize(upload(rgb, device), m.input_h, m.input_w, m.mean,
                                              m.std, interp, m.cubic));
    }
    // On a GPU this is the time to queue the work; the device time shows in `network`.
    results[i].timings.preprocess = ms_since(t0);
  }

  const auto t_net = Clock::now();
  const at::Tensor logits = run_network(*m.runner, at::stack(inputs), on_device);
  inputs.clear();
  if (stream) stream->current_stream().synchronize();
  const double net_ms = ms_since(t_net);

  for (std::size_t i = 0; i < batch.size(); ++i) {
    Result& r = results[i];
    const auto t0 = Clock::now();
    const at::Tensor one = logits[static_cast<int64_t>(i)];
    if (!on_device || options.logits || options.raw_logits) {
      finish_on_host(r, one, options);
    } else {
      const at::Tensor labels = core::upsample_argmax_labels(one, r.height, r.width);
      r.labels.resize(static_cast<std::size_t>(r.height) * r.width);
      if (labels.device().is_cpu()) {
        at::from_blob(r.labels.data(), {r.height, r.width}, at::kByte).copy_(labels);
      } else {
        // Through pinned memory: a direct copy to pageable memory is staged by the driver in
        // small pieces.
        at::Tensor staged = at::empty({r.height, r.width},
                                      at::TensorOptions().dtype(at::kByte).pinned_memory(true));
        staged.copy_(labels);
        std::memcpy(r.labels.data(), staged.const_data_ptr<std::uint8_t>(), r.labels.size());
      }
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

}  // namespace

std::vector<Result> Model::segment(std::span<const Input> batch,
                                   const SegmentOptions& options) const {
  try {
    return segment_unguarded(*impl_, batch, options);
  } catch (...) {
    const Error e = as_error(std::current_exception(),
                             "segmenting " + std::to_string(batch.size()) + " image(s)");
    // Most of a batch's memory grows with its size; the full-size logits of one image do not.
    const std::string what = e.what();
    if (e.code() != ErrorCode::kOutOfMemory || batch.size() == 1 ||
        what.find("logits") != std::string::npos) {
      throw e;
    }
    throw Error(e.code(), what + " (a smaller batch needs less memory)");
  }
}

}  // namespace sapiens_seg
