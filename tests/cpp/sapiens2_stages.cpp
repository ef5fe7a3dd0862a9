#include "sapiens2_stages.hpp"

#include <algorithm>
#include <cstddef>

namespace sapiens_seg::test {

void Sapiens2Stages::keep(const std::string& name, const at::Tensor& t) {
  if (std::find(wanted_.begin(), wanted_.end(), name) != wanted_.end()) {
    kept_[name] = t.to(at::kCPU, at::kFloat).contiguous();
  }
}

at::Tensor Sapiens2Stages::forward(const core::v2::Network& net, const at::Tensor& x) {
  keep("rope_cos", net.rope_cos());
  keep("rope_sin", net.rope_sin());
  at::Tensor t = net.embed(x);
  keep("tokens", t);
  const auto depth = static_cast<std::size_t>(net.config().depth);
  for (std::size_t i = 0; i < depth; ++i) {
    t = net.blocks(t, i, i + 1);
    keep((i < 10 ? "block_0" : "block_") + std::to_string(i), t);
  }
  final_tokens_ = net.final_norm(t);
  keep("final_norm", final_tokens_);
  return net.head(final_tokens_);
}

at::Tensor Sapiens2Stages::module_head(const core::v2::Network& net) {
  at::Tensor y = net.featmap(final_tokens_);
  keep("featmap", y);
  for (std::size_t s = 0; s < net.head_stages(); ++s) {
    y = net.head_stage(s, y);
    keep("head_" + std::to_string(s), y);
  }
  return net.classify(y);
}

}  // namespace sapiens_seg::test
