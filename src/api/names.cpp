#include "sapiens_seg/names.hpp"

#include <array>
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

}  // namespace sapiens_seg
