// speed_check: load time, speed and peak memory of every mode beside the original, measured in
// the same run on the same machine (the protocol of the project's design, section 7).
//
// Every mode runs in its own worker process (this program with --worker, original_python.py
// --worker for the authors' pipeline in Python, peers_python.py --worker for the runtimes a CPU
// user would pick instead: ONNX Runtime and OpenVINO on the project's ONNX export, Hugging Face
// transformers for Sapiens2), so that each one's peak memory is its own and no mode inherits
// another's caches. The parent drives them in lock step:
// for each image size and batch, every worker makes its first call and its warm-up calls and
// resets its peak counters; then the timed rounds alternate between the workers, so that a
// machine shared with other jobs slows all modes alike and the ratios stay meaningful.
//
// With the IO layer built, workers use the public API (sapiens_seg::load, Model::segment: the
// same pre- and post-processing users get). Without it (the GPU machine has no OpenCV), they use
// the core directly with an ATen resize in place of OpenCV's.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#ifdef SPEED_CHECK_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "sapiens_seg/error.hpp"
#include "sapiens_seg/names.hpp"
#include "sapiens_seg/version.hpp"

#ifdef SPEED_CHECK_WITH_API
#include "sapiens_seg/sapiens_seg.hpp"
#else
#include <ATen/autocast_mode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/script.h>

#include "core/backends/backends.hpp"
#include "core/backends/cuda_graphs.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "core/checkpoint/torchscript.hpp"
#include "core/cpu/cpuid.hpp"
#include "core/cpu/gemm.hpp"
#include "core/tensor_ops.hpp"
#include "core/v1/vit_seg.hpp"
#ifdef SAPIENS_SEG_WITH_KERNELS
#include "core/kernel_ops.hpp"
#include "core/v1/kernels_schedule.hpp"
#endif
#endif

extern char** environ;

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<std::string> split(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// ---- /proc ------------------------------------------------------------------------------------

std::int64_t vm_status(const char* field) {
  std::ifstream in("/proc/self/status");
  const std::string key = std::string(field) + ":";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  }
  return 0;
}

// Writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS.
void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// The CPU's identity: one model name ("AMD EPYC" in a VM) spans generations whose vector units
// differ by 2x, so the record names vendor, family, model and stepping (what CPUID reports, as
// /proc/cpuinfo prints it).
json cpu_identity() {
  json id = {{"vendor", ""}, {"family", -1}, {"model", -1}, {"stepping", -1}};
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line) && !line.empty();) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "vendor_id") id["vendor"] = value;
    const char* num_keys[] = {"cpu family", "model", "stepping"};
    const char* names[] = {"family", "model", "stepping"};
    for (int i = 0; i < 3; ++i) {
      if (key == num_keys[i] && !value.empty() &&
          std::isdigit(static_cast<unsigned char>(value[0])))
        id[names[i]] = std::stoi(value);
    }
  }
  return id;
}

// Which library ran the float32 GEMMs (the library's CPU table, or SAPIENS_SEG_CPU_GEMM).
std::string cpu_gemm_line() {
#ifdef SPEED_CHECK_WITH_API
  return sapiens_seg::system_info().cpu_gemm;
#else
  return sapiens_seg::core::cpu::float32_gemm_line();
#endif
}

bool cpu_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) == 0)
      return (line + " ").find(" " + flag + " ") != std::string::npos;
  }
  return false;
}

// The ISA flags that decide the CPU's fast dtypes (as in src/core/cpu/cpuinfo.cpp), for the record.
std::vector<std::string> isa_flags() {
  std::vector<std::string> out;
  for (const char* f : {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                        "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16"}) {
    if (cpu_flag(f)) out.emplace_back(f);
  }
  return out;
}

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// User + system CPU time of this process, all threads, in ms.
double process_cpu_ms() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return (static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

// Busy CPUs (0 .. cores) over `ms` milliseconds, from /proc/stat. Called while every worker is
// idle, so it measures the other jobs on the machine.
double busy_cpus(int ms) {
  auto sample = [] {
    std::ifstream in("/proc/stat");
    std::string cpu;
    std::uint64_t v[8] = {};
    in >> cpu >> v[0] >> v[1] >> v[2] >> v[3] >> v[4] >> v[5] >> v[6] >> v[7];
    const std::uint64_t idle = v[3] + v[4];
    std::uint64_t total = 0;
    for (auto x : v) total += x;
    return std::pair<std::uint64_t, std::uint64_t>{total - idle, total};
  };
  const auto a = sample();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  const auto b = sample();
  const double total = static_cast<double>(b.second - a.second);
  return total > 0 ? static_cast<double>(b.first - a.first) / total *
                         static_cast<double>(std::thread::hardware_concurrency())
                   : 0.0;
}

// ---- inputs -----------------------------------------------------------------------------------

// The benchmark pattern (original_python.py draws the same one): two gradients and a diagonal
// texture, shifted per batch index, uint8 RGB.
std::vector<std::uint8_t> synthetic_rgb(int h, int w, int index) {
  std::vector<std::uint8_t> px(static_cast<size_t>(h) * w * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      std::uint8_t* p = px.data() + (static_cast<size_t>(y) * w + x) * 3;
      p[0] = static_cast<std::uint8_t>((static_cast<int64_t>(x) * 255) / std::max(w - 1, 1));
      p[1] = static_cast<std::uint8_t>((static_cast<int64_t>(y) * 255) / std::max(h - 1, 1));
      p[2] = static_cast<std::uint8_t>(((static_cast<int64_t>(x) + y) * 7 + index * 31) % 256);
    }
  }
  return px;
}

// ---- what a worker runs -----------------------------------------------------------------------

struct WorkerOptions {
  std::string model, mode = "portable", dtype = "float32", device = "cpu";
  int threads = 0, load_repeats = 3;
  bool accept_noncommercial = false;
  bool split = false;  // keep what the backbone/head split needs
};

class Pipeline {
 public:
  virtual ~Pipeline() = default;
  // End to end, as a user calls it: RGB images in, label maps at each image's size out. Returns
  // the network's own time in ms (without pre- and post-processing).
  virtual double segment(const std::vector<std::vector<std::uint8_t>>& images, int h, int w) = 0;
  // One image: the network's logits [classes, h/2 of the network input, ...] as float32, and the
  // labels at the image's size.
  virtual std::pair<std::vector<float>, std::vector<std::uint8_t>> outputs(
      const std::vector<std::uint8_t>& image, int h, int w) = 0;
  virtual json backend() const = 0;
  // The CUDA-graph runner's counts (captured and eager shapes, why), or null.
  virtual json graphs() const { return nullptr; }
  // The network's backbone and head timed apart at batch 1, eagerly (no CUDA graph): backbone_ms,
  // head_ms, or a note saying why this mode has no split.
  virtual json split() { return {{"note", "no split in this pipeline"}}; }
};

#ifdef SPEED_CHECK_WITH_API

// The library's mode names, and one of the benchmark's own that the API cannot run.
sapiens_seg::Mode parse_mode(const std::string& m) {
  if (m == "original-autocast") {
    throw std::invalid_argument(
        "original under autocast runs in builds without the IO layer only (the core pipeline)");
  }
  return sapiens_seg::parse_mode(m);
}

class ApiPipeline final : public Pipeline {
 public:
  explicit ApiPipeline(const WorkerOptions& o) {
    sapiens_seg::LoadOptions opt;
    opt.mode = parse_mode(o.mode);
    opt.dtype = sapiens_seg::parse_dtype(o.dtype);
    opt.device = o.device;
    opt.threads = o.threads;
    opt.accept_noncommercial = o.accept_noncommercial;
    model_ = sapiens_seg::load(o.model, opt);
  }
  double segment(const std::vector<std::vector<std::uint8_t>>& images, int h, int w) override {
    std::vector<sapiens_seg::Input> inputs;
    for (const auto& px : images) inputs.push_back(sapiens_seg::Input::rgb({px.data(), h, w, 0}));
    const auto results = model_->segment(inputs);
    if (results.size() != images.size()) throw std::runtime_error("wrong number of results");
    return results.front().timings.network;  // a batch shares one network call
  }
  std::pair<std::vector<float>, std::vector<std::uint8_t>> outputs(
      const std::vector<std::uint8_t>& image, int h, int w) override {
    sapiens_seg::SegmentOptions so;
    so.raw_logits = true;
    auto r = model_->segment(sapiens_seg::Input::rgb({image.data(), h, w, 0}), so);
    return {std::move(r.raw_logits), std::move(r.labels)};
  }
  json backend() const override {
    const auto& b = model_->info().backend;
    return {{"mode", b.mode}, {"device", b.device}, {"dtype", b.dtype}};
  }

 private:
  std::optional<sapiens_seg::Model> model_;
};

std::unique_ptr<Pipeline> make_pipeline(const WorkerOptions& o) {
  return std::make_unique<ApiPipeline>(o);
}
const char* kPipeline = "public API (sapiens_seg::load, Model::segment)";

#else

namespace core = sapiens_seg::core;

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
  auto sync = [&] {
    if (!dev.is_cpu()) c10::impl::getDeviceGuardImpl(dev.type())->synchronizeDevice(dev.index());
  };
  std::vector<double> ms;
  for (int i = 0; i < reps + 2; ++i) {
    sync();
    const auto t0 = Clock::now();
    fn();
    sync();
    if (i >= 2) ms.push_back(ms_since(t0));
  }
  return median(ms);
}

// The library's device pipeline rebuilt from the core (the build on the GPU machine has no IO
// layer): core::resize_normalize, the network, core::upsample_argmax_labels. Sapiens v1
// TorchScript files and Sapiens2 .safetensors files (no `original` mode for the latter).
class CorePipeline final : public Pipeline {
 public:
  explicit CorePipeline(const WorkerOptions& o) {
    if (o.threads > 0) at::set_num_threads(o.threads);
    const c10::Device device = core::resolve_device(o.device);
    const at::ScalarType dtype = core::resolve_dtype(sapiens_seg::parse_dtype(o.dtype), device);
    const std::string ext = ".safetensors";
    if (o.model.size() > ext.size() &&
        o.model.compare(o.model.size() - ext.size(), ext.size(), ext) == 0) {
      // Sapiens2: the tensors are views of the mapped file, which they keep alive. Its demo
      // resizes with INTER_AREA or INTER_CUBIC; this pipeline's linear device resize stands in
      // for it (the timing of a resize, not its rule).
      const core::TensorMap t =
          core::v2::to_original_names(core::SafetensorsFile::open(o.model).all());
      const core::v2::Config cfg = core::v2::infer_config(t, {});
      input_h_ = cfg.input_h;
      input_w_ = cfg.input_w;
      mean_ = {123.675f, 116.28f, 103.53f};
      std_ = {58.395f, 57.12f, 57.375f};
      if (o.mode == "original") {
        throw std::runtime_error(
            "Sapiens2 has no original mode (the authors ship weights, not a "
            "graph): use --modes portable,kernels");
      }
      runner_ = o.mode == "kernels" ? core::make_kernels_v2(t, cfg, device, dtype)
                                    : core::make_portable_v2(t, cfg, device, dtype);
    } else {
      const bool original = o.mode == "original" || o.mode == "original-autocast";
      ckpt_ = core::open_torchscript(o.model, /*load_module=*/original);
      core::v1::ConfigHints hints;
      if (ckpt_.heads_from_graph) hints.heads = *ckpt_.heads_from_graph;
      v1_ = core::v1::infer_config(ckpt_.tensors, hints);
      input_h_ = v1_.input_h;
      input_w_ = v1_.input_w;
      if (o.mode == "original-autocast") {
        if (device.is_cpu()) {
          throw std::runtime_error("the original under autocast is a CUDA column");
        }
        runner_ = std::make_unique<AutocastRunner>(
            core::make_original_v1(ckpt_, v1_, device, at::kFloat), dtype);
      } else {
        runner_ = o.mode == "original" ? core::make_original_v1(ckpt_, v1_, device, dtype)
                  : o.mode == "kernels" ? core::make_kernels_v1(ckpt_, v1_, device, dtype)
                                        : core::make_portable_v1(ckpt_, v1_, device, dtype);
      }
    }
    mode_ = o.mode;
    dtype_ = dtype;
    // The host copy of the weights goes before the timed rounds (it would count in every peak):
    // the split needs only the original's traced module (shared with its runner) or, for the
    // kernels, the file, read again after the timed rounds.
    module_ = ckpt_.module;
    model_path_ = o.model;
    ckpt_ = core::TorchScriptCheckpoint();
    // As Model does by default (LoadOptions::cuda_graphs); nothing changes on the CPU.
    runner_ = core::with_cuda_graphs(std::move(runner_), 4);
  }
  // Model::segment's device pipeline: the uint8 image uploaded through pinned staging, resized
  // and normalised where the network runs, labels computed there (the CPU runs the same ops).
  at::Tensor preprocess(const std::vector<std::uint8_t>& px, int h, int w) const {
    const c10::Device dev = runner_->device();
    at::Tensor img = at::from_blob(const_cast<std::uint8_t*>(px.data()), {h, w, 3}, at::kByte);
    if (!dev.is_cpu()) {
      at::Tensor staged =
          at::empty({h, w, 3}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      staged.copy_(img);
      img = staged.to(dev, /*non_blocking=*/true);
    }
    return core::resize_normalize(img, input_h_, input_w_, mean_, std_);
  }
  double segment(const std::vector<std::vector<std::uint8_t>>& images, int h, int w) override {
    const c10::Device dev = runner_->device();
    const bool gpu = !dev.is_cpu();
    // A stream per call, as Model::segment uses.
    std::optional<c10::StreamGuard> stream;
    if (gpu)
      stream.emplace(c10::impl::getDeviceGuardImpl(dev.type())->getStreamFromGlobalPool(dev));
    std::vector<at::Tensor> inputs;
    for (const auto& px : images) inputs.push_back(preprocess(px, h, w));
    const at::Tensor batch = at::stack(inputs);
    if (gpu) c10::impl::getDeviceGuardImpl(dev.type())->synchronizeDevice(dev.index());
    const auto t0 = Clock::now();
    const at::Tensor logits = runner_->forward_device(batch);
    if (gpu) c10::impl::getDeviceGuardImpl(dev.type())->synchronizeDevice(dev.index());
    const double net_ms = ms_since(t0);
    at::Tensor host = at::empty({h, w}, at::TensorOptions().dtype(at::kByte).pinned_memory(gpu));
    for (size_t i = 0; i < images.size(); ++i) {
      host.copy_(core::upsample_argmax_labels(logits[static_cast<int64_t>(i)], h, w));
    }
    return net_ms;
  }
  std::pair<std::vector<float>, std::vector<std::uint8_t>> outputs(
      const std::vector<std::uint8_t>& image, int h, int w) override {
    const at::Tensor logits =
        runner_->forward(preprocess(image, h, w).unsqueeze(0))[0].contiguous();
    std::vector<std::uint8_t> labels(static_cast<size_t>(h) * w);
    core::upsample_argmax(logits, h, w, labels.data());
    return {std::vector<float>(logits.data_ptr<float>(), logits.data_ptr<float>() + logits.numel()),
            std::move(labels)};
  }
  json backend() const override {
    const auto& b = runner_->backend();
    return {{"mode", b.mode}, {"device", b.device}, {"dtype", b.dtype}};
  }
  json graphs() const override {
    const auto st = core::cuda_graph_stats(*runner_);
    if (!st) return nullptr;
    return {{"captured", st->captured},       {"eager", st->eager},
            {"evicted", st->evicted},         {"replays", st->replays},
            {"eager_calls", st->eager_calls}, {"failures", st->failures},
            {"summary", st->summary()}};
  }
  json split() override {
    const c10::Device dev = runner_->device();
    if (v1_.input_h == 0) return {{"note", "Sapiens2: no split measured"}};
    c10::InferenceMode inference;
    at::manual_seed(0);
    const at::Tensor x = at::randn({1, 3, input_h_, input_w_}).to(dev);
    if (mode_ == "original" || mode_ == "original-autocast") {
      // The traced file keeps the authors' two submodules, each with its own traced forward.
      torch::jit::Module backbone = module_->attr("backbone").toModule();
      torch::jit::Module head = module_->attr("decode_head").toModule();
      const bool autocast = mode_ == "original-autocast";
      auto run = [&](torch::jit::Module& m, const c10::IValue& in) {
        std::optional<AutocastScope> scope;
        if (autocast) scope.emplace(dev.type(), dtype_);
        return m.forward({in});
      };
      const c10::IValue feats = run(backbone, x);
      return {{"backbone_ms", median_ms_of(dev, 5, [&] { run(backbone, x); })},
              {"head_ms", median_ms_of(dev, 5, [&] { run(head, feats); })}};
    }
#ifdef SAPIENS_SEG_WITH_KERNELS
    if (mode_ == "kernels") {
      // The runner's own schedule on a second copy of the weights (this is measured after the
      // timed rounds and the peak-memory readings).
      namespace schedule = core::v1::kernels_schedule;
      const schedule::Weights w =
          schedule::prepare(core::open_torchscript(model_path_).tensors, v1_, dev, dtype_);
      const auto ops = core::cuda_kernel_ops(dev);
      const at::Tensor feat = schedule::backbone(w, v1_, *ops, x);
      return {{"backbone_ms", median_ms_of(dev, 5, [&] { schedule::backbone(w, v1_, *ops, x); })},
              {"head_ms", median_ms_of(dev, 5, [&] { schedule::head(w, v1_, *ops, feat, 1); })}};
    }
#endif
    return {{"note", "the " + mode_ + " network has no backbone/head entry point"}};
  }

 private:
  core::TorchScriptCheckpoint ckpt_;            // Sapiens v1, while loading
  std::shared_ptr<torch::jit::Module> module_;  // the original's, for the split
  std::string model_path_;                      // the kernels' split reads the file again
  core::v1::Config v1_;
  std::string mode_;
  at::ScalarType dtype_ = at::kFloat;
  int64_t input_h_ = 0, input_w_ = 0;
  // Sapiens v1's lite demo constants by default; Sapiens2 uses the ImageNet values.
  std::array<float, 3> mean_{123.5f, 116.5f, 103.5f}, std_{58.5f, 57.0f, 57.5f};
  std::unique_ptr<core::Runner> runner_;
};

std::unique_ptr<Pipeline> make_pipeline(const WorkerOptions& o) {
  return std::make_unique<CorePipeline>(o);
}
const char* kPipeline = "core, device pipeline (no IO layer in this build: no OpenCV)";

#endif

bool is_cuda(const std::string& device) {
  return device.rfind("cuda", 0) == 0;
}

json memory_peaks(const std::string& device) {
  json out = {{"peak_rss", vm_status("VmHWM")}, {"rss", vm_status("VmRSS")}};
#ifdef SPEED_CHECK_CUDA
  if (is_cuda(device)) {
    const auto idx = static_cast<c10::DeviceIndex>(c10::cuda::current_device());
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(idx);
    out["cuda_peak_allocated"] = stats.allocated_bytes[0].peak;
    out["cuda_peak_reserved"] = stats.reserved_bytes[0].peak;
  }
#else
  (void)device;
#endif
  return out;
}

void reset_peaks(const std::string& device) {
  reset_peak_rss();
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

// Serves the parent's commands: one JSON object per line in, one per line out.
int run_worker(const WorkerOptions& o) {
  auto reply = [](const json& j) {
    std::cout << j.dump() << std::endl;  // flushed: the parent waits for the line
  };
  std::unique_ptr<Pipeline> pipe;
  std::vector<double> loads;
  const std::int64_t rss_before_load = vm_status("VmRSS");
  reset_peak_rss();
  try {
    for (int i = 0; i < std::max(1, o.load_repeats); ++i) {
      pipe.reset();  // the previous model goes first, as it would in a fresh process
      const auto t0 = Clock::now();
      pipe = make_pipeline(o);
      loads.push_back(ms_since(t0));
    }
  } catch (const sapiens_seg::Error& e) {
    reply({{"event", "unavailable"},
           {"reason", e.what()},
           {"code", std::string(sapiens_seg::to_string(e.code()))}});
    return 0;
  } catch (const std::exception& e) {
    reply({{"event", "unavailable"}, {"reason", e.what()}});
    return 0;
  }
  const char* omp = std::getenv("OMP_NUM_THREADS");
  reply({{"event", "ready"},
         {"load_ms", loads},
         {"threads", at::get_num_threads()},
         {"omp_num_threads", omp ? json(omp) : json(nullptr)},
         {"backend", pipe->backend()},
         {"pipeline", kPipeline},
         {"rss_before_load", rss_before_load},
         {"load_peak_rss", vm_status("VmHWM")},
         {"rss_after_load", vm_status("VmRSS")}});

  std::vector<std::vector<std::uint8_t>> images;
  int h = 0, w = 0;
  double cpu_ms = 0;  // CPU time of the last call, all threads
  double net_ms = 0;  // the network's share of the last call
  auto call = [&] {
    sync(o.device);
    const double c0 = process_cpu_ms();
    const auto t0 = Clock::now();
    net_ms = pipe->segment(images, h, w);
    sync(o.device);
    const double ms = ms_since(t0);
    cpu_ms = process_cpu_ms() - c0;
    return ms;
  };
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    const json cmd = json::parse(line);
    const std::string kind = cmd.value("cmd", "");
    try {
      if (kind == "quit") break;
      if (kind == "prepare") {
        h = cmd.at("height");
        w = cmd.at("width");
        images.clear();
        for (int i = 0; i < cmd.at("batch").get<int>(); ++i)
          images.push_back(synthetic_rgb(h, w, i));
        const double first = call();
        std::vector<double> warm;
        for (int i = 0; i < cmd.value("warmup", 3); ++i) warm.push_back(call());
        reset_peaks(o.device);
        reply({{"first_ms", first}, {"warmup_ms", warm}});
      } else if (kind == "run") {
        std::vector<double> ms, cpu, net;
        for (int i = 0; i < cmd.at("calls").get<int>(); ++i) {
          ms.push_back(call());
          cpu.push_back(cpu_ms);
          net.push_back(net_ms);
        }
        reply({{"ms", ms}, {"cpu_ms", cpu}, {"net_ms", net}});
      } else if (kind == "peak") {
        json peaks = memory_peaks(o.device);
        peaks["graphs"] = pipe->graphs();
        reply(peaks);
      } else if (kind == "split") {
        reply(pipe->split());
      } else if (kind == "outputs") {
        // Raw float32 logits and uint8 labels into two files, for the parent to compare.
        const int oh = cmd.at("height"), ow = cmd.at("width");
        const auto [logits, labels] = pipe->outputs(synthetic_rgb(oh, ow, 0), oh, ow);
        const std::string prefix = cmd.at("prefix");
        std::ofstream(prefix + ".logits", std::ios::binary)
            .write(reinterpret_cast<const char*>(logits.data()),
                   static_cast<std::streamsize>(logits.size() * sizeof(float)));
        std::ofstream(prefix + ".labels", std::ios::binary)
            .write(reinterpret_cast<const char*>(labels.data()),
                   static_cast<std::streamsize>(labels.size()));
        reply({{"logits", logits.size()}, {"labels", labels.size()}});
      } else {
        reply({{"error", "unknown command " + kind}});
      }
    } catch (const std::exception& e) {
      reply({{"error", e.what()}});
    }
  }
  return 0;
}

// ---- the parent -------------------------------------------------------------------------------

// A worker process with its stdin and stdout on pipes (stderr is shared, for its logs).
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    int to_child[2], from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = ::posix_spawnp(&pid_, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(to_child[0]);
    ::close(from_child[1]);
    if (rc != 0) {
      ::close(to_child[1]);
      ::close(from_child[0]);
      throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
    }
    in_ = ::fdopen(to_child[1], "w");
    out_ = ::fdopen(from_child[0], "r");
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (in_) {
      std::fputs("{\"cmd\":\"quit\"}\n", in_);
      std::fclose(in_);
    }
    if (out_) std::fclose(out_);
    int status = 0;
    if (pid_ > 0) ::waitpid(pid_, &status, 0);
  }

  json read() {
    std::string line;
    for (int c; (c = std::fgetc(out_)) != EOF && c != '\n';) line += static_cast<char>(c);
    if (line.empty()) throw std::runtime_error("the worker exited: " + how_it_ended());
    return json::parse(line);
  }
  json request(const json& cmd) {
    const std::string s = cmd.dump() + "\n";
    if (std::fputs(s.c_str(), in_) < 0 || std::fflush(in_) != 0) {
      throw std::runtime_error("the worker is gone: " + how_it_ended());
    }
    json r = read();
    if (r.contains("error")) throw std::runtime_error(r["error"].get<std::string>());
    return r;
  }

 private:
  // Reaps the worker (its pipe is closed, so it is exiting or gone) and says why it went: a
  // SIGKILL nobody sent by hand is usually the kernel's OOM killer, when the columns' models
  // together outgrow the machine's memory.
  std::string how_it_ended() {
    int status = 0;
    pid_t got = 0;
    for (int i = 0; i < 50 && (got = ::waitpid(pid_, &status, WNOHANG)) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (got != pid_) return "still running, but its pipe is closed";
    pid_ = -1;
    if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
      const int sig = WTERMSIG(status);
      return "killed by signal " + std::to_string(sig) +
             (sig == SIGKILL ? " (SIGKILL: the kernel's out-of-memory killer, if nobody sent it; "
                               "run fewer columns at once)"
                             : std::string(" (") + strsignal(sig) + ")");
    }
    return "unknown status";
  }

  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

struct Column {
  Column(std::string id_, std::string title_, std::string mode_, std::string dtype_, bool python_,
         std::string runtime_ = "")
      : id(std::move(id_)),
        title(std::move(title_)),
        mode(std::move(mode_)),
        dtype(std::move(dtype_)),
        python(python_),
        runtime(std::move(runtime_)) {}
  std::string id, title, mode, dtype;
  bool python = false;  // original_python.py, or peers_python.py when runtime is set
  std::string runtime;  // peers_python.py --runtime (onnxruntime, openvino, ...)
  std::unique_ptr<Child> child;
  json ready;
  std::string unavailable;  // reason, when it cannot run here (or failed)
};

struct Options {
  bool quick = false, worker = false, accept_noncommercial = false, split = false;
  std::string model, device = "cpu", python, python_script, peers_script, onnx, export_script;
  bool modes_given = false;
  std::vector<std::string> modes, dtypes;
  struct Config {
    int h, w, batch;
  };
  std::vector<Config> configs;
  int threads = 0, warmup = 3, rounds = 3, calls = 5, load_repeats = 3;
  double wait_quiet = 0;  // seconds to wait, before each timed round, for other jobs to calm down
  std::string json_out;
  std::string worker_mode, worker_dtype;
};

const char* kUsage =
    R"(speed_check: load time, speed and peak memory of each mode beside the original.

  speed_check [--quick] [--model PATH|ID] [--device cpu|cuda|cuda:N]
              [--modes original-python,original,original-autocast,portable,kernels,
                       onnxruntime,openvino,transformers]
              [--dtype float32,bfloat16] [--onnx FILE.onnx]
              [--sizes 480x640,720x1280,...] [--batch 1,8] [--threads N]
              [--warmup 3] [--rounds 3] [--calls 5] [--load-repeats 3]
              [--json FILE] [--python PY] [--python-script original_python.py]
              [--wait-quiet SECONDS] [--accept-noncommercial] [--split]

--quick: the tiny_b fixture (fast to run, not representative of full-size speed), 480x640 at
batch 1 and 8, 1080x1920 and 3000x4000 at batch 1, 1 warm-up, 2 rounds x 3 calls; a few minutes
on 2 cores. --model defaults to the quick fixture with --quick and to sapiens-seg-0.3b-goliath
otherwise. --dtype applies to portable and kernels; the original runs in float32.
OMP_NUM_THREADS is honoured as LibTorch and PyTorch honour it; --threads overrides it.
--wait-quiet S: before each timed call, wait up to S seconds until other jobs use less than a
fifth of a core (the load seen is recorded either way); for machines shared with other work.
Peers (CPU only; benchmarks/peers_python.py, their packages from `tools/setup.sh --bench`):
onnxruntime and openvino (two columns: f32, and OpenVINO's default precision for this CPU;
openvino-f32 or openvino-default for one, e.g. where the default is f32 anyway) run
the project's ONNX export of the model (tools/export_onnx.py, made for this run and checked
against the original unless --onnx names one); transformers runs Sapiens2 files only.
original-python is the authors' pipeline: torch.jit for Sapiens v1, the authors' module
structure (tests/reference/sapiens2.py) for Sapiens2.
On CUDA, original-autocast is the authors' float32 graph run under autocast in the --dtype (their
way to half precision), and each column reports its CUDA-graph captures (how many input shapes
were captured, how many run eagerly and why). --split: after the timed rounds, each column's
backbone and head timed apart at batch 1, eagerly (Sapiens v1; the original's traced submodules
and the kernels schedule's two halves; the portable network has no such entry point).
The result is JSON (--json FILE, else stdout); benchmarks/readme_performance.py --print FILE
shows it as the performance page's tables.
)";

std::pair<int, int> parse_size(const std::string& s) {
  const auto x = s.find('x');
  if (x == std::string::npos) throw std::invalid_argument("size '" + s + "' is not HxW");
  return {std::stoi(s.substr(0, x)), std::stoi(s.substr(x + 1))};
}

Options parse_args(int argc, char** argv, std::string& command) {
  Options o;
  std::string sizes, batches, dtypes;
  std::string modes =
      "original-python,original,original-autocast,portable,kernels,onnxruntime,openvino,"
      "transformers";
  // The command as typed, minus this machine's directories (results are committed).
  for (int i = 0; i < argc; ++i) {
    std::string a = i == 0 ? fs::path(argv[0]).filename().string() : argv[i];
    if (a.size() > 1 && a[0] == '/') a = fs::path(a).filename().string();
    command += (i ? " " : "") + a;
  }
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick")
      o.quick = true;
    else if (a == "--worker")
      o.worker = true;
    else if (a == "--accept-noncommercial")
      o.accept_noncommercial = true;
    else if (a == "--split")
      o.split = true;
    else if (a == "--model")
      o.model = value(i);
    else if (a == "--device")
      o.device = value(i);
    else if (a == "--modes") {
      modes = value(i);
      o.modes_given = true;
    } else if (a == "--onnx")
      o.onnx = value(i);
    else if (a == "--peers-script")
      o.peers_script = value(i);
    else if (a == "--dtype")
      dtypes = value(i);
    else if (a == "--sizes")
      sizes = value(i);
    else if (a == "--batch")
      batches = value(i);
    else if (a == "--threads")
      o.threads = std::stoi(value(i));
    else if (a == "--warmup")
      o.warmup = std::stoi(value(i));
    else if (a == "--rounds")
      o.rounds = std::stoi(value(i));
    else if (a == "--calls")
      o.calls = std::stoi(value(i));
    else if (a == "--load-repeats")
      o.load_repeats = std::stoi(value(i));
    else if (a == "--wait-quiet")
      o.wait_quiet = std::stod(value(i));
    else if (a == "--json")
      o.json_out = value(i);
    else if (a == "--python")
      o.python = value(i);
    else if (a == "--python-script")
      o.python_script = value(i);
    else if (a == "--mode")
      o.worker_mode = value(i);
    else if (a == "--worker-dtype")
      o.worker_dtype = value(i);
    else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument '" + a + "'\n\n" + kUsage);
    }
  }
  const bool quick_sizes = o.quick && sizes.empty() && batches.empty();
  if (o.quick) {
    // The quick protocol, unless given explicitly.
    auto given = [&](const char* flag) {
      return command.find(std::string(" ") + flag + " ") != std::string::npos;
    };
    if (!given("--warmup")) o.warmup = 1;
    if (!given("--rounds")) o.rounds = 2;
    if (!given("--calls")) o.calls = 3;
  }
  if (quick_sizes) {
    // Batch 8 only at the smallest size: at 3000x4000 it alone takes longer than the rest.
    o.configs = {{480, 640, 1}, {480, 640, 8}, {1080, 1920, 1}, {3000, 4000, 1}};
  } else {
    if (sizes.empty()) sizes = "480x640,720x1280,1080x1920,1024x2048,3000x4000";
    if (batches.empty()) batches = "1,8";
    for (const auto& sz : split(sizes)) {
      const auto [h, w] = parse_size(sz);
      for (const auto& b : split(batches)) o.configs.push_back({h, w, std::stoi(b)});
    }
  }
  if (dtypes.empty()) dtypes = is_cuda(o.device) ? "float16" : "float32,bfloat16";
  o.modes = split(modes);
  o.dtypes = split(dtypes);
  if (o.python.empty()) o.python = SPEED_CHECK_PYTHON;
  if (o.python_script.empty()) o.python_script = SPEED_CHECK_PYTHON_SCRIPT;
  if (o.peers_script.empty()) o.peers_script = SPEED_CHECK_PEERS_SCRIPT;
  o.export_script = SPEED_CHECK_EXPORT_SCRIPT;
  return o;
}

std::string find_quick_model(const char* argv0) {
  std::vector<fs::path> dirs;
  if (const char* f = std::getenv("SAPIENS_SEG_FIXTURES")) dirs.emplace_back(f);
  std::error_code ec;
  const fs::path exe = fs::canonical(fs::path("/proc/self/exe"), ec);
  if (!ec) dirs.push_back(exe.parent_path().parent_path() / "fixtures");
  dirs.push_back(fs::path(argv0).parent_path().parent_path() / "fixtures");
  for (const auto& d : dirs) {
    if (fs::exists(d / "tiny_b_torchscript.pt2")) return (d / "tiny_b_torchscript.pt2").string();
  }
  throw std::runtime_error(
      "--quick needs the tiny_b fixture: build it with `python tests/fixtures/make_fixtures.py "
      "--out BUILD/fixtures --only tiny_b` (or run the tests once), or pass --model");
}

std::string fmt(double v, int digits = 0) {
  if (std::isnan(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string gib(double bytes) {
  return fmt(bytes / (1024.0 * 1024.0 * 1024.0), 2);
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::localtime(&t));
  return buf;
}

// The CPUs other jobs keep busy, sampled over a second; with a budget, samples again (for up to
// `seconds`) until that falls under a fifth of a core.
double wait_for_quiet(double seconds) {
  const auto t0 = Clock::now();
  double busy = busy_cpus(1000);
  while (busy > 0.2 && ms_since(t0) < seconds * 1e3) busy = busy_cpus(1000);
  return busy;
}

// Every column's outputs for one synthetic image against the reference column's (the original in
// Python when it runs, else the original mode, else the first portable column): logits at the
// network's output size and labels at the image's size.
json compare_outputs(std::vector<Column>& cols, int h, int w) {
  std::error_code ec;
  std::string tmpl = (fs::temp_directory_path(ec) / "speed_check.XXXXXX").string();
  const char* dir = ::mkdtemp(tmpl.data());
  if (!dir) return json::object();
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  };
  std::map<std::string, std::pair<std::vector<char>, std::vector<char>>> got;
  for (auto& c : cols) {
    if (!c.child) continue;
    const std::string prefix = std::string(dir) + "/" + std::to_string(got.size());
    try {
      c.child->request({{"cmd", "outputs"}, {"height", h}, {"width", w}, {"prefix", prefix}});
      got[c.id] = {read(prefix + ".logits"), read(prefix + ".labels")};
    } catch (const std::exception& e) {
      std::cerr << "speed_check:   " << c.title << ": no outputs (" << e.what() << ")\n";
    }
    std::remove((prefix + ".logits").c_str());
    std::remove((prefix + ".labels").c_str());
  }
  ::rmdir(dir);
  // Against the original; without one (Sapiens2 has none), against the first portable column.
  std::string ref = got.count("original-python") ? "original-python" : "original";
  for (const auto& c : cols) {  // in column order (got is sorted by name)
    if (got.count(ref)) break;
    if (c.id.rfind("portable", 0) == 0 && got.count(c.id)) ref = c.id;
  }
  json out = {{"reference", ref}, {"height", h}, {"width", w}, {"columns", json::object()}};
  if (!got.count(ref)) return out;
  const auto& [rl, rb] = got[ref];
  for (const auto& [id, v] : got) {
    const auto& [l, b] = v;
    if (l.size() != rl.size() || b.size() != rb.size()) {
      out["columns"][id] = {{"error", "output shapes differ"}};
      continue;
    }
    const auto* x = reinterpret_cast<const float*>(l.data());
    const auto* y = reinterpret_cast<const float*>(rl.data());
    const size_t n = l.size() / sizeof(float);
    double max_diff = 0, sum_diff = 0;
    for (size_t i = 0; i < n; ++i) {
      const double d = std::abs(static_cast<double>(x[i]) - y[i]);
      max_diff = std::max(max_diff, d);
      sum_diff += d;
    }
    size_t same = 0;
    for (size_t i = 0; i < b.size(); ++i) same += b[i] == rb[i];
    out["columns"][id] = {
        {"max_abs_logit_diff", max_diff},
        {"mean_abs_logit_diff", n ? sum_diff / static_cast<double>(n) : 0.0},
        {"label_agreement",
         b.empty() ? 1.0 : static_cast<double>(same) / static_cast<double>(b.size())}};
  }
  return out;
}

// Runs argv to completion (stdout and stderr shared with this process); its exit status.
int run_command(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) return 127;
  int status = 0;
  if (::waitpid(pid, &status, 0) < 0) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int run_parent(const Options& o, const std::string& command, const char* argv0) {
  std::string model = o.model;
  if (model.empty()) model = o.quick ? find_quick_model(argv0) : "sapiens-seg-0.3b-goliath";
#ifdef SPEED_CHECK_WITH_API
  if (!fs::exists(model)) {
    std::cerr << "speed_check: resolving model id " << model << "\n";
    model = sapiens_seg::fetch(model);
  }
#endif
  if (!fs::exists(model)) throw std::runtime_error("model file not found: " + model);
  model = fs::absolute(model).string();

  const std::string load_at_start = loadavg();
  const bool sapiens2 = fs::path(model).extension() == ".safetensors";
  const bool cpu = !is_cuda(o.device);
  std::vector<Column> cols;
  for (const auto& m : o.modes) {
    if (m == "original-python") {
      cols.emplace_back("original-python",
                        sapiens2 ? "original (Python, authors' module)" : "original (Python)",
                        "original", "float32", true);
    } else if (m == "original") {
      // Sapiens2 has no original graph; by default its column is the authors' module above.
      if (sapiens2 && !o.modes_given) continue;
      cols.emplace_back("original", "original", "original", "float32", false);
    } else if (m == "original-autocast") {
      if (cpu) continue;  // a GPU column
      const std::string d = o.dtypes.front() == "float32" ? "float16" : o.dtypes.front();
      cols.emplace_back("original autocast " + d, "original (autocast " + d + ")",
                        "original-autocast", d, false);
    } else if (m == "portable" || m == "kernels") {
      for (const auto& d : o.dtypes) cols.emplace_back(m + " " + d, m + " " + d, m, d, false);
    } else if (m == "onnxruntime" || m == "openvino" || m == "openvino-f32" ||
               m == "openvino-default" || m == "transformers") {
      if (!cpu && !o.modes_given) continue;                              // CPU peers
      if (m == "transformers" && !sapiens2 && !o.modes_given) continue;  // no v1 model there
      if (m == "onnxruntime") {
        cols.emplace_back("onnxruntime", "ONNX Runtime", m, "float32", true, "onnxruntime");
      } else if (m != "transformers") {
        // openvino-f32 alone where OpenVINO's default precision is f32 anyway (CPUs without
        // bf16 or f16 dot products): the default column would time the same graph twice.
        if (m != "openvino-default") {
          cols.emplace_back("openvino f32", "OpenVINO f32", "openvino", "float32", true,
                            "openvino");
        }
        if (m != "openvino-f32") {
          cols.emplace_back("openvino default", "OpenVINO default", "openvino", "default", true,
                            "openvino-default");
        }
      } else {
        cols.emplace_back("transformers", "transformers", m, "float32", true, "transformers");
      }
    } else {
      throw std::invalid_argument("unknown mode '" + m +
                                  "' (original-python, original, original-autocast, portable, "
                                  "kernels, onnxruntime, openvino, openvino-f32, "
                                  "openvino-default, transformers)");
    }
  }

  // The ONNX peers run the project's export of the same file, checked against the original by
  // the exporter before anything is timed (and by compare_outputs below, like every column).
  std::string onnx = o.onnx, onnx_reason;
  json onnx_export = nullptr;
  std::string onnx_dir;
  const bool need_onnx = std::any_of(cols.begin(), cols.end(), [](const Column& c) {
    return c.runtime == "onnxruntime" || c.runtime.rfind("openvino", 0) == 0;
  });
  if (need_onnx && onnx.empty()) {
    std::error_code ec;
    std::string tmpl = (fs::temp_directory_path(ec) / "speed_check_onnx.XXXXXX").string();
    if (const char* d = ::mkdtemp(tmpl.data())) {
      onnx_dir = d;
      onnx = onnx_dir + "/" + fs::path(model).stem().string() + ".onnx";
      std::cerr << "speed_check: exporting " << fs::path(model).filename().string()
                << " to ONNX for the peers (tools/export_onnx.py) ..." << std::endl;
      const int rc = run_command({o.python, o.export_script, "--model", model, "--out", onnx});
      if (rc != 0) {
        onnx_reason = "the ONNX export failed (tools/export_onnx.py exit " + std::to_string(rc) +
                      "; its message is in the log)";
      }
    } else {
      onnx_reason = "no temporary folder for the ONNX export";
    }
  }
  if (need_onnx && onnx_reason.empty()) {
    std::ifstream side(onnx + ".json");
    if (side) onnx_export = json::parse(side, nullptr, false);
    if (!fs::exists(onnx)) onnx_reason = "ONNX file not found: " + onnx;
  }

  const std::string self = fs::canonical("/proc/self/exe").string();
  for (auto& c : cols) {
    std::vector<std::string> argv;
    if (!c.runtime.empty()) {
      if (c.runtime != "transformers" && !onnx_reason.empty()) {
        c.unavailable = onnx_reason;
        std::cerr << "speed_check: " << c.title << " unavailable: " << c.unavailable << "\n";
        continue;
      }
      argv = {o.python,
              o.peers_script,
              "--worker",
              "--runtime",
              c.runtime,
              "--model",
              model,
              "--device",
              o.device,
              "--load-repeats",
              std::to_string(o.load_repeats)};
      if (c.runtime != "transformers") {
        argv.push_back("--onnx");
        argv.push_back(onnx);
      }
    } else if (c.python) {
      argv = {o.python,
              o.python_script,
              "--worker",
              "--model",
              model,
              "--device",
              o.device,
              "--load-repeats",
              std::to_string(o.load_repeats)};
    } else {
      argv = {self,     "--worker",       "--model",
              model,    "--device",       o.device,
              "--mode", c.mode,           "--worker-dtype",
              c.dtype,  "--load-repeats", std::to_string(o.load_repeats)};
    }
    if (o.threads > 0) {
      argv.push_back("--threads");
      argv.push_back(std::to_string(o.threads));
    }
    if (o.accept_noncommercial && !c.python) argv.push_back("--accept-noncommercial");
    if (o.split && !c.python) argv.push_back("--split");
    std::cerr << "speed_check: loading " << c.title << " ..." << std::endl;
    try {
      c.child = std::make_unique<Child>(argv);
      c.ready = c.child->read();
      if (c.ready.value("event", "") != "ready") {
        c.unavailable = c.ready.value("reason", "failed to start");
        c.child.reset();
      } else if (c.runtime == "openvino-default") {
        // Name the column after the precision OpenVINO chose for this CPU.
        const std::string p = c.ready.value("inference_precision", "");
        if (!p.empty()) c.title = "OpenVINO default (" + p + ")";
        c.dtype = c.ready["backend"].value("dtype", c.dtype);
      }
    } catch (const std::exception& e) {
      c.unavailable = e.what();
      c.child.reset();
    }
    if (!c.unavailable.empty())
      std::cerr << "speed_check:   unavailable: " << c.unavailable << "\n";
  }

  json accuracy = compare_outputs(cols, o.configs.front().h, o.configs.front().w);

  json results = json::array();
  for (const auto& cfg : o.configs) {
    const int h = cfg.h, w = cfg.w, batch = cfg.batch;
    {
      std::cerr << "speed_check: " << h << "x" << w << " batch " << batch << std::endl;
      json entry = {{"height", h}, {"width", w}, {"batch", batch}, {"columns", json::object()}};
      std::map<std::string, std::vector<double>> round_medians, net_medians;
      std::map<std::string, json> per;
      auto fail = [&](Column& c, const std::exception& e) {
        std::cerr << "speed_check:   " << c.title << " failed: " << e.what() << "\n";
        per[c.id] = {{"error", e.what()}};
        c.child.reset();
        c.unavailable = std::string("failed during the run: ") + e.what();
      };
      for (auto& c : cols) {
        if (!c.child) continue;
        try {
          per[c.id] = c.child->request({{"cmd", "prepare"},
                                        {"height", h},
                                        {"width", w},
                                        {"batch", batch},
                                        {"warmup", o.warmup}});
          per[c.id]["rounds_ms"] = json::array();
          per[c.id]["rounds_net_ms"] = json::array();
          per[c.id]["rounds_cpu_ms"] = json::array();
          per[c.id]["background_cpus"] = json::array();
        } catch (const std::exception& e) {
          fail(c, e);
        }
      }
      for (int r = 0; r < o.rounds; ++r) {
        for (auto& c : cols) {
          if (!c.child) continue;
          try {
            const double background = wait_for_quiet(o.wait_quiet);
            const json got = c.child->request({{"cmd", "run"}, {"calls", o.calls}});
            const auto ms = got.at("ms").get<std::vector<double>>();
            per[c.id]["rounds_ms"].push_back(ms);
            if (got.contains("net_ms")) {
              const auto net = got["net_ms"].get<std::vector<double>>();
              per[c.id]["rounds_net_ms"].push_back(net);
              net_medians[c.id].push_back(median(net));
            }
            per[c.id]["rounds_cpu_ms"].push_back(got.value("cpu_ms", json::array()));
            per[c.id]["background_cpus"].push_back(background);
            round_medians[c.id].push_back(median(ms));
          } catch (const std::exception& e) {
            fail(c, e);
          }
        }
      }
      for (auto& c : cols) {
        if (!c.child) continue;
        try {
          per[c.id].update(c.child->request({{"cmd", "peak"}}));
          per[c.id]["median_ms"] = median(round_medians[c.id]);
          if (!net_medians[c.id].empty()) per[c.id]["median_net_ms"] = median(net_medians[c.id]);
          per[c.id]["min_ms"] =
              *std::min_element(round_medians[c.id].begin(), round_medians[c.id].end());
          std::cerr << "speed_check:   " << c.title << ": "
                    << fmt(per[c.id]["median_ms"].get<double>()) << " ms, peak RSS "
                    << gib(per[c.id]["peak_rss"].get<double>()) << " GiB\n";
        } catch (const std::exception& e) {
          fail(c, e);
        }
      }
      for (auto& [id, j] : per) {
        if (!j.contains("error")) entry["columns"][id] = j;
      }
      results.push_back(entry);
    }
  }

  // Each column's CUDA-graph counts (from its last "peak" reply) and, with --split, its
  // backbone/head split, both after every timed call.
  json graphs = json::object(), splits = json::object();
  for (auto& c : cols) {
    if (!c.child) continue;
    try {
      const json g = c.child->request({{"cmd", "peak"}}).value("graphs", json());
      if (!g.is_null()) {
        graphs[c.id] = g;
        std::cerr << "speed_check:   " << c.title << " graphs: " << g.value("summary", "") << "\n";
      }
      // Only the C++ workers know the split (the Python ones answer "unknown command").
      if (o.split && !c.python) {
        splits[c.id] = c.child->request({{"cmd", "split"}});
        std::cerr << "speed_check:   " << c.title << " split: " << splits[c.id].dump() << "\n";
      }
    } catch (const std::exception& e) {
      std::cerr << "speed_check:   " << c.title << ": no graphs/split (" << e.what() << ")\n";
      if (o.split && !c.python) splits[c.id] = {{"error", e.what()}};
    }
  }

  json columns = json::array(), load = json::object(), workers = json::object();
  json threads = json::object();
  json omp = nullptr;
  for (const auto& c : cols) {
    const bool ok = c.ready.value("event", "") == "ready";
    columns.push_back({{"id", c.id},
                       {"title", c.title},
                       {"mode", c.mode},
                       {"dtype", c.dtype},
                       {"runtime", c.runtime},
                       {"available", ok},
                       {"reason", c.unavailable}});
    if (c.ready.value("event", "") == "ready") {
      load[c.id] = median(c.ready["load_ms"].get<std::vector<double>>());
      threads[c.id] = c.ready["threads"];
      omp = c.ready["omp_num_threads"];
      workers[c.id] = c.ready;
    }
  }
  std::string torch_python;
  if (workers.contains("original-python"))
    torch_python = workers["original-python"].value("torch", "");
  json meta = {
      {"date", today()},
      {"cpu", cpu_model()},
      {"cores", std::thread::hardware_concurrency()},
      {"avx512_bf16", cpu_flag("avx512_bf16")},
      {"isa_flags", isa_flags()},
      {"cpu_id", cpu_identity()},
      {"cpu_gemm", cpu_gemm_line()},
      {"onednn_cap", std::getenv("ONEDNN_MAX_CPU_ISA") ? std::getenv("ONEDNN_MAX_CPU_ISA")
                     : std::getenv("DNNL_MAX_CPU_ISA") ? std::getenv("DNNL_MAX_CPU_ISA")
                                                       : ""},
      {"loadavg_at_end", loadavg()},
      {"onnx_export", onnx_export},
      {"device", o.device},
      {"torch", std::string(TORCH_VERSION) +
                    (torch_python.empty() ? "" : " (Python: " + torch_python + ")")},
      {"sapiens_seg", SAPIENS_SEG_VERSION},
      {"pipeline", kPipeline},
      {"model_file", fs::path(model).filename().string()},
      {"model_bytes", fs::file_size(model)},
      {"threads", threads},
      {"omp_num_threads", omp},
      {"quick", o.quick},
      {"quick_note",
       "the tiny_b fixture unless --model says otherwise (random weights, 2 blocks, 128 wide, a "
       "64-channel head): fast to run, not representative of full-size speed; " +
           std::to_string(o.configs.size()) + " sizes and batches, " + std::to_string(o.warmup) +
           " warm-up, " + std::to_string(o.rounds) + " rounds x " + std::to_string(o.calls) +
           " calls"},
      {"protocol",
       {{"warmup", o.warmup},
        {"rounds", o.rounds},
        {"calls", o.calls},
        {"load_repeats", o.load_repeats},
        {"wait_quiet_s", o.wait_quiet}}},
      {"command", command},
  };
  // Versions of everything that ran a column (torch, onnxruntime, openvino, transformers).
  json versions = {{"libtorch", TORCH_VERSION}};
  for (const auto& [id, w] : workers.items()) {
    if (w.contains("torch")) versions["torch (Python)"] = w["torch"];
    if (w.contains("versions")) versions.update(w["versions"]);
  }
  meta["versions"] = versions;
  meta["loadavg_at_start"] = load_at_start;
  if (!onnx_dir.empty()) {
    std::error_code ec;
    fs::remove_all(onnx_dir, ec);  // the export and its external data
  }
  json report = {{"meta", meta},          {"columns", columns}, {"load_ms", load},
                 {"accuracy", accuracy},  {"workers", workers}, {"results", results},
                 {"cuda_graphs", graphs}, {"split", splits}};
  // The result is JSON only; benchmarks/readme_performance.py renders it (one renderer for the
  // pages and for a look during a session: --print FILE).
  if (o.json_out.empty()) {
    std::cout << report.dump(2) << "\n";
  } else {
    std::ofstream(o.json_out) << report.dump(2) << "\n";
    std::cerr << "speed_check: wrote " << o.json_out << "; as tables: python "
              << "benchmarks/readme_performance.py --print " << o.json_out << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A worker that dies (e.g. killed for memory) closes its pipe; writing the next request must
  // fail with EPIPE and mark that column failed, not kill the whole run with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  std::string command;
  try {
    const Options o = parse_args(argc, argv, command);
    if (o.worker) {
      WorkerOptions w;
      w.model = o.model;
      w.mode = o.worker_mode.empty() ? "portable" : o.worker_mode;
      w.dtype = o.worker_dtype.empty() ? "float32" : o.worker_dtype;
      w.device = o.device;
      w.threads = o.threads;
      w.load_repeats = o.load_repeats;
      w.accept_noncommercial = o.accept_noncommercial;
      w.split = o.split;
      return run_worker(w);
    }
    return run_parent(o, command, argv[0]);
  } catch (const std::exception& e) {
    std::cerr << "speed_check: " << e.what() << "\n";
    return 2;
  }
}
