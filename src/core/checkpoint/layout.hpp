// Checking a checkpoint's tensors against the complete layout a network expects, so that every
// family reports a malformed file the same way: all differences at once, not the first one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "tensor_map.hpp"

namespace sapiens_seg::core {

using Layout = std::map<std::string, std::vector<int64_t>>;  // name -> expected shape

std::string shape_str(at::IntArrayRef s);

// "" when `tensors` holds exactly the floating tensors of `want` (ignoring names for which
// `ignored` is true); else a multi-line report of the missing, unexpected, mis-shaped and
// non-float tensors, each list under its own heading.
std::string layout_mismatches(const TensorMap& tensors, const Layout& want,
                              const std::function<bool(const std::string&)>& ignored = {});

}  // namespace sapiens_seg::core
