#include "layout.hpp"

#include <sstream>

namespace sapiens_seg::core {

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
  return os.str();
}

std::string layout_mismatches(const TensorMap& tensors, const Layout& want,
                              const std::function<bool(const std::string&)>& ignored) {
  std::vector<std::string> missing, unexpected, bad_shape, bad_dtype;
  for (const auto& [key, shape] : want) {
    auto it = tensors.find(key);
    if (it == tensors.end()) {
      missing.push_back(key);
    } else if (it->second.sizes() != at::IntArrayRef(shape)) {
      bad_shape.push_back(key + " " + shape_str(it->second.sizes()) + " (expected " +
                          shape_str(shape) + ")");
    } else if (!(it->second.scalar_type() == at::kFloat || it->second.scalar_type() == at::kHalf ||
                 it->second.scalar_type() == at::kBFloat16)) {
      bad_dtype.push_back(key + " " + std::string(c10::toString(it->second.scalar_type())) +
                          " (expected float32, float16 or bfloat16)");
    }
  }
  for (const auto& [key, value] : tensors) {
    if (!want.count(key) && !(ignored && ignored(key))) unexpected.push_back(key);
  }
  std::ostringstream os;
  auto list = [&os](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    os << "\n  " << what << " (" << v.size() << "):";
    for (const auto& s : v) os << "\n    " << s;
  };
  list("missing tensors", missing);
  list("unexpected tensors", unexpected);
  list("wrong shape", bad_shape);
  list("wrong dtype", bad_dtype);
  return os.str();
}

}  // namespace sapiens_seg::core
