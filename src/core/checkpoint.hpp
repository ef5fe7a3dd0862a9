// Reading the authors' Sapiens v1 TorchScript archives (*_torchscript.pt2): the tensors by name
// for the native backends, and the scripted module itself for the `original` mode.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include <ATen/Tensor.h>

namespace torch::jit {
struct Module;
}

namespace sapiens_seg::core {

using TensorMap = std::map<std::string, at::Tensor>;

struct TorchScriptCheckpoint {
  std::string path;
  TensorMap tensors;                           // named_parameters + named_buffers, on the CPU
  std::shared_ptr<torch::jit::Module> module;  // the traced graph, as shipped
  // Attention head count read from the traced graph (the reshape of the fused qkv output), since
  // no tensor shape carries it. nullopt when the graph does not show it.
  std::optional<int> heads_from_graph;
};

// Checks the zip container first so a truncated file or a non-archive gets its own message,
// then loads it with LibTorch. Throws Error(kNotFound / kFormatError / kIo).
TorchScriptCheckpoint open_torchscript(const std::string& path);

}  // namespace sapiens_seg::core
