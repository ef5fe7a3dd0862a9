// A checkpoint's tensors by name, as every format reader returns them and every network takes
// them. Its own header, below the readers, so that a format (the TorchScript archive, safetensors)
// and the opener that picks among them do not include each other.
#pragma once

#include <map>
#include <string>

#include <ATen/Tensor.h>

namespace sapiens_seg::core {

using TensorMap = std::map<std::string, at::Tensor>;

}  // namespace sapiens_seg::core
