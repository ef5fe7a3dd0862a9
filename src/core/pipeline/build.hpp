// Loading's last step, family by family: a checkpoint already read (and verified) becomes a network
// on a Runner of the asked mode. The family folders (v1/, v2/) each provide one build function;
// build() picks it from the family table, so api/ holds no family-specific code.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "../backends/backends.hpp"
#include "../checkpoint/mapped_file.hpp"
#include "../families.hpp"
#include "sapiens_seg/options.hpp"

namespace sapiens_seg::core {

struct BuildRequest {
  Mode mode = Mode::kAuto;
  c10::Device device{c10::kCPU};
  at::ScalarType dtype = at::kFloat;
  int input_height = 0, input_width = 0;  // LoadOptions' overrides (0: none)
  std::optional<CardFacts> card;          // nullopt for a checkpoint no card claims
};

// A network ready to run, and the shape facts ModelInfo reports.
struct Built {
  std::unique_ptr<Runner> runner;
  std::int64_t num_classes = 0, embed_dim = 0, depth = 0, heads = 0;
  std::int64_t input_height = 0, input_width = 0;
};

// The family's network from `file` (the checkpoint's bytes; `path` names it in messages).
// Throws Error(kFormatError) for a checkpoint the family cannot read or that contradicts its
// card (heads, input size, classes), Error(kBackendUnavailable) for a mode that cannot run it.
Built build(Family family, const MappedFile& file, const std::string& path,
            const BuildRequest& request);

// The Runner of the asked mode: kernels only where they can run (else
// Error(kBackendUnavailable) with the reason), auto portable today (logged), original where the
// family has one. The family's constructors are called only for the mode chosen.
using RunnerFactory = std::function<std::unique_ptr<Runner>()>;
std::unique_ptr<Runner> pick_runner(Mode mode, const c10::Device& device,
                                    const RunnerFactory& portable, const RunnerFactory& original,
                                    const RunnerFactory& kernels);

namespace v1 {
Built build(const MappedFile& file, const std::string& path, const BuildRequest& request);
}
namespace v2 {
Built build(const MappedFile& file, const std::string& path, const BuildRequest& request);
}

}  // namespace sapiens_seg::core
