// Reading the authors' Sapiens v1 TorchScript archives (*_torchscript.pt2): the tensors by name
// for the native backends, and the scripted module itself for the `original` mode.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include <ATen/Tensor.h>

#include "mapped_file.hpp"
#include "tensor_map.hpp"

namespace torch::jit {
struct Module;
}

namespace sapiens_seg::core {

struct TorchScriptCheckpoint {
  std::string path;
  // The module's parameters and buffers by name, in their stored dtypes: read-only CPU views over
  // the memory-mapped archive (see torchscript_archive.hpp), so no byte is copied here.
  TensorMap tensors;
  // The traced graph, as shipped; only when open_torchscript was asked for it (original mode).
  std::shared_ptr<torch::jit::Module> module;
  // Attention head count read from the serialized code of the first attention module (the
  // reshape of the fused qkv output), since no tensor shape carries it. nullopt when the code
  // does not show it.
  std::optional<int> heads_from_graph;
};

// Checks the zip container first so a truncated file or a non-archive gets its own message,
// then reads the tensors straight from the archive. `load_module` also compiles the TorchScript
// module with LibTorch (seconds for a large file), which only the original mode needs. Throws
// Error(kNotFound / kFormatError / kIo).
TorchScriptCheckpoint open_torchscript(const std::string& path, bool load_module = false);
// The same over a file already read whole (map_file): nothing opens the file again, and the
// tensors are views of `file`'s memory. `path` names it in messages.
TorchScriptCheckpoint open_torchscript(const MappedFile& file, const std::string& path,
                                       bool load_module = false);

}  // namespace sapiens_seg::core
