#include "sapiens_seg/names.hpp"

#include <array>
#include <charconv>
#include <functional>
#include <limits>
#include <utility>

namespace sapiens_seg {
namespace {

template <class E, std::size_t N>
using Table = std::array<std::pair<E, std::string_view>, N>;

constexpr Table<Mode, 4> kModes{{{Mode::kAuto, "auto"},
                                 {Mode::kPortable, "portable"},
                                 {Mode::kKernels, "kernels"},
                                 {Mode::kOriginal, "original"}}};
constexpr Table<DType, 4> kDTypes{{{DType::kDefault, "default"},
                                   {DType::kFloat32, "float32"},
                                   {DType::kFloat16, "float16"},
                                   {DType::kBFloat16, "bfloat16"}}};
constexpr Table<Normalization, 2> kNormalizations{
    {{Normalization::kDemo, "demo"}, {Normalization::kTraining, "training"}}};
constexpr Table<Pipeline, 3> kPipelines{
    {{Pipeline::kAuto, "auto"}, {Pipeline::kHost, "host"}, {Pipeline::kDevice, "device"}}};
constexpr Table<CubicResize, 2> kCubics{
    {{CubicResize::kWheel, "wheel"}, {CubicResize::kOpenCV, "opencv"}}};

template <class E, std::size_t N>
std::string_view name_in(const Table<E, N>& table, E value) noexcept {
  for (const auto& [v, name] : table) {
    if (v == value) return name;
  }
  return "unknown";
}

template <class E, std::size_t N>
std::vector<std::string> names_in(const Table<E, N>& table) {
  std::vector<std::string> out;
  for (const auto& entry : table) out.emplace_back(entry.second);
  return out;
}

template <class E, std::size_t N>
E parse_in(const Table<E, N>& table, std::string_view name, const char* what) {
  for (const auto& [v, n] : table) {
    if (n == name) return v;
  }
  std::string choices;
  for (const auto& entry : table) {
    choices += (choices.empty() ? "" : ", ") + std::string(entry.second);
  }
  throw Error(ErrorCode::kInvalidInput,
              std::string(what) + " '" + std::string(name) + "' is not one of " + choices);
}

}  // namespace

std::string_view to_string(Mode m) noexcept {
  return name_in(kModes, m);
}
std::string_view to_string(DType d) noexcept {
  return name_in(kDTypes, d);
}
std::string_view to_string(Normalization n) noexcept {
  return name_in(kNormalizations, n);
}
std::string_view to_string(Pipeline p) noexcept {
  return name_in(kPipelines, p);
}
std::string_view to_string(CubicResize c) noexcept {
  return name_in(kCubics, c);
}

std::vector<std::string> mode_names() {
  return names_in(kModes);
}
std::vector<std::string> dtype_names() {
  return names_in(kDTypes);
}
std::vector<std::string> normalization_names() {
  return names_in(kNormalizations);
}
std::vector<std::string> pipeline_names() {
  return names_in(kPipelines);
}
std::vector<std::string> cubic_names() {
  return names_in(kCubics);
}

Mode parse_mode(std::string_view name) {
  return parse_in(kModes, name, "mode");
}
DType parse_dtype(std::string_view name) {
  return parse_in(kDTypes, name, "dtype");
}
Normalization parse_normalization(std::string_view name) {
  return parse_in(kNormalizations, name, "normalization");
}
Pipeline parse_pipeline(std::string_view name) {
  return parse_in(kPipelines, name, "pipeline");
}
CubicResize parse_cubic(std::string_view name) {
  return parse_in(kCubics, name, "cubic");
}

std::vector<ErrorCode> error_codes() {
  // The codes run from 1 without gaps; to_string() names each (its switch covers the enum).
  std::vector<ErrorCode> out;
  for (int c = 1; to_string(static_cast<ErrorCode>(c)) != "unknown"; ++c) {
    out.push_back(static_cast<ErrorCode>(c));
  }
  return out;
}

int exit_status(ErrorCode code) noexcept {
  return 10 + static_cast<int>(code);
}

std::string_view default_model() noexcept {
  return "sapiens-seg-0.3b-goliath";
}

// ---- the option table ------------------------------------------------------------------------

namespace {

std::string option_error(const OptionSpec& spec, std::string_view value, const std::string& want) {
  return "option " + spec.name + ": '" + std::string(value) + "' is not " + want;
}

bool parse_bool(const OptionSpec& spec, std::string_view v) {
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  throw Error(ErrorCode::kInvalidInput, option_error(spec, v, "true or false"));
}

long long parse_int(const OptionSpec& spec, std::string_view v) {
  long long out = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || end != v.data() + v.size() || out < spec.min_value ||
      out > spec.max_value) {
    throw Error(ErrorCode::kInvalidInput,
                option_error(spec, v,
                             "an integer from " + std::to_string(spec.min_value) + " to " +
                                 std::to_string(spec.max_value)));
  }
  return out;
}

std::string bool_text(bool b) {
  return b ? "true" : "false";
}

// One row: its spec, and how it reads and writes its field. `Struct` is the options struct the
// row belongs to.
template <class Struct>
struct Row {
  OptionSpec spec;
  std::function<void(Struct&, const OptionSpec&, std::string_view)> set;
  std::function<std::string(const Struct&)> get;
};

template <class Struct, class E>
Row<Struct> choice_row(std::string name, E Struct::*field, std::vector<std::string> names,
                       E (*parse)(std::string_view), std::string help) {
  Row<Struct> r;
  r.spec.name = std::move(name);
  r.spec.type = OptionType::kChoice;
  r.spec.default_value = std::string(to_string(Struct{}.*field));
  r.spec.choices = std::move(names);
  r.spec.help = std::move(help);
  r.set = [field, parse](Struct& o, const OptionSpec&, std::string_view v) { o.*field = parse(v); };
  r.get = [field](const Struct& o) { return std::string(to_string(o.*field)); };
  return r;
}

template <class Struct>
Row<Struct> bool_row(std::string name, bool Struct::*field, std::string help) {
  Row<Struct> r;
  r.spec.name = std::move(name);
  r.spec.type = OptionType::kBool;
  r.spec.default_value = bool_text(Struct{}.*field);
  r.spec.help = std::move(help);
  r.set = [field](Struct& o, const OptionSpec& s, std::string_view v) {
    o.*field = parse_bool(s, v);
  };
  r.get = [field](const Struct& o) { return bool_text(o.*field); };
  return r;
}

template <class Struct>
Row<Struct> int_row(std::string name, int Struct::*field, long long lo, long long hi,
                    std::string help) {
  Row<Struct> r;
  r.spec.name = std::move(name);
  r.spec.type = OptionType::kInt;
  r.spec.default_value = std::to_string(Struct{}.*field);
  r.spec.min_value = lo;
  r.spec.max_value = hi;
  r.spec.help = std::move(help);
  r.set = [field](Struct& o, const OptionSpec& s, std::string_view v) {
    o.*field = static_cast<int>(parse_int(s, v));
  };
  r.get = [field](const Struct& o) { return std::to_string(o.*field); };
  return r;
}

const std::vector<Row<LoadOptions>>& load_rows() {
  static const std::vector<Row<LoadOptions>> rows = [] {
    std::vector<Row<LoadOptions>> r;
    r.push_back(choice_row("mode", &LoadOptions::mode, mode_names(), &parse_mode,
                           "backend: auto (portable today), portable, kernels (CUDA), original "
                           "(the authors' TorchScript graph, Sapiens v1)"));
    {
      Row<LoadOptions> d;
      d.spec.name = "device";
      d.spec.type = OptionType::kText;
      d.spec.help = "cpu, cuda or cuda:N (empty: cuda when present, else cpu)";
      d.set = [](LoadOptions& o, const OptionSpec&, std::string_view v) { o.device = v; };
      d.get = [](const LoadOptions& o) { return o.device; };
      r.push_back(std::move(d));
    }
    r.push_back(choice_row("dtype", &LoadOptions::dtype, dtype_names(), &parse_dtype,
                           "compute precision (default: float32 on the CPU, float16 on CUDA)"));
    r.push_back(choice_row("normalization", &LoadOptions::normalization, normalization_names(),
                           &parse_normalization,
                           "mean/std: the authors' demo values or the training values"));
    r.push_back(bool_row("accept_noncommercial", &LoadOptions::accept_noncommercial,
                         "accept the CC-BY-NC-4.0 licence of the Sapiens v1 weights (also "
                         "SAPIENS_SEG_NONCOMMERCIAL=1)"));
    r.push_back(bool_row("allow_unverified", &LoadOptions::allow_unverified,
                         "load weights whose card has no pinned SHA-256 (also "
                         "SAPIENS_SEG_ALLOW_UNVERIFIED=1)"));
    r.push_back(int_row("input_height", &LoadOptions::input_height, 0, 16384,
                        "network input height (0: the card's or the checkpoint's)"));
    r.push_back(int_row("input_width", &LoadOptions::input_width, 0, 16384,
                        "network input width (0: the card's or the checkpoint's)"));
    r.push_back(choice_row("pipeline", &LoadOptions::pipeline, pipeline_names(), &parse_pipeline,
                           "resize, normalisation and upsample + argmax on the host or where the "
                           "network runs (auto: device on CUDA); the same bytes either way"));
    r.push_back(choice_row("cubic", &LoadOptions::cubic, cubic_names(), &parse_cubic,
                           "Sapiens2's INTER_CUBIC bytes: the x86-64 opencv-python wheel's (IPP) "
                           "or OpenCV's own (cv2.setUseOptimized(False), builds without IPP)"));
    r.push_back(int_row("cuda_graphs", &LoadOptions::cuda_graphs, 0, 64,
                        "CUDA graphs kept per model, one per batch shape (0: run eagerly)"));
    r.push_back(int_row("threads", &LoadOptions::threads, 0, 4096,
                        "intra-op CPU threads, process-wide (0: LibTorch's default, one per "
                        "core)"));
    {
      Row<LoadOptions> t;
      t.spec.name = "use_hf_token";
      t.spec.type = OptionType::kBool;
      t.spec.default_value = bool_text(FetchOptions{}.use_hf_token);
      t.spec.help = "send $HF_TOKEN when downloading weights (also SAPIENS_SEG_USE_HF_TOKEN=1)";
      t.set = [](LoadOptions& o, const OptionSpec& s, std::string_view v) {
        o.fetch.use_hf_token = parse_bool(s, v);
      };
      t.get = [](const LoadOptions& o) { return bool_text(o.fetch.use_hf_token); };
      r.push_back(std::move(t));
    }
    for (auto& row : r) row.spec.group = OptionGroup::kLoad;
    return r;
  }();
  return rows;
}

const std::vector<Row<SegmentOptions>>& segment_rows() {
  static const std::vector<Row<SegmentOptions>> rows = [] {
    std::vector<Row<SegmentOptions>> r;
    r.push_back(bool_row("logits", &SegmentOptions::logits,
                         "also return the logits at the input's size ([classes, H, W] float32; "
                         "large: 28 x 12 MP is 1.3 GB)"));
    r.push_back(bool_row("raw_logits", &SegmentOptions::raw_logits,
                         "also return the network's own output ([classes, h, w] float32, before "
                         "any resize)"));
    for (auto& row : r) row.spec.group = OptionGroup::kSegment;
    return r;
  }();
  return rows;
}

const std::vector<Row<RunOptions>>& run_rows() {
  static const std::vector<Row<RunOptions>> rows = [] {
    std::vector<Row<RunOptions>> r;
    r.push_back(int_row("batch_size", &RunOptions::batch_size, 1, 256,
                        "images per network call (results do not depend on it; memory grows "
                        "with it)"));
    for (auto& row : r) row.spec.group = OptionGroup::kRun;
    return r;
  }();
  return rows;
}

template <class Struct>
const Row<Struct>& row_named(const std::vector<Row<Struct>>& rows, std::string_view name,
                             const char* what) {
  for (const auto& r : rows) {
    if (r.spec.name == name) return r;
  }
  std::string names;
  for (const auto& r : rows) names += (names.empty() ? "" : ", ") + r.spec.name;
  throw Error(ErrorCode::kInvalidInput,
              "'" + std::string(name) + "' is not an option of " + what + " (" + names + ")");
}

}  // namespace

const std::vector<OptionSpec>& option_specs() {
  static const std::vector<OptionSpec> all = [] {
    std::vector<OptionSpec> out;
    for (const auto& r : load_rows()) out.push_back(r.spec);
    for (const auto& r : segment_rows()) out.push_back(r.spec);
    for (const auto& r : run_rows()) out.push_back(r.spec);
    return out;
  }();
  return all;
}

std::vector<OptionSpec> option_specs(OptionGroup group) {
  std::vector<OptionSpec> out;
  for (const auto& s : option_specs()) {
    if (s.group == group) out.push_back(s);
  }
  return out;
}

void set_option(LoadOptions& o, std::string_view name, std::string_view value) {
  const auto& r = row_named(load_rows(), name, "loading");
  r.set(o, r.spec, value);
}
void set_option(SegmentOptions& o, std::string_view name, std::string_view value) {
  const auto& r = row_named(segment_rows(), name, "segmenting");
  r.set(o, r.spec, value);
}
void set_option(RunOptions& o, std::string_view name, std::string_view value) {
  const auto& r = row_named(run_rows(), name, "a run");
  r.set(o, r.spec, value);
}
std::string get_option(const LoadOptions& o, std::string_view name) {
  return row_named(load_rows(), name, "loading").get(o);
}
std::string get_option(const SegmentOptions& o, std::string_view name) {
  return row_named(segment_rows(), name, "segmenting").get(o);
}
std::string get_option(const RunOptions& o, std::string_view name) {
  return row_named(run_rows(), name, "a run").get(o);
}

}  // namespace sapiens_seg
