// Sapiens2's forward pass stage by stage, for the parity tests that hold each stage to the PyTorch
// reference's intermediates. The product's forward records nothing: it is the network's public
// stages composed (embed, blocks, final_norm, head), and this runs the same stages one at a time,
// keeping what a test names. ParitySapiens2 checks that the two give the same logits.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "core/v2/sapiens2.hpp"

namespace sapiens_seg::test {

class Sapiens2Stages {
 public:
  // The intermediates to keep, by the reference's names: "rope_cos", "rope_sin", "tokens",
  // "block_00".."block_NN", "final_norm", and from module_head "featmap", "head_0".."head_K".
  explicit Sapiens2Stages(std::vector<std::string> wanted) : wanted_(std::move(wanted)) {}

  // x -> the logits of the network's own head (on the CPU its fused head), as forward computes
  // them.
  at::Tensor forward(const core::v2::Network& net, const at::Tensor& x);
  // The logits of the head as the authors' module runs it, op by op, on the tokens the last
  // forward() left after the final norm: the only head with stage outputs to compare.
  at::Tensor module_head(const core::v2::Network& net);

  // A kept intermediate, float32 on the CPU.
  const at::Tensor& operator[](const std::string& name) const { return kept_.at(name); }

 private:
  void keep(const std::string& name, const at::Tensor& t);

  std::vector<std::string> wanted_;
  std::map<std::string, at::Tensor> kept_;
  at::Tensor final_tokens_;
};

}  // namespace sapiens_seg::test
