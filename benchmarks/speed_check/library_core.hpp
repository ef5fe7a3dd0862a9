// The library's own IO-free steps as a column (library.hpp): core::build on the checkpoint's bytes
// (core::map_file), then core::prepare and core::run with the InputRecipe api/model.cpp would
// make for a checkpoint no card describes (its family's normalisation and demo resize,
// core/families.hpp). Compiled in every build: the build without the IO layer times its library
// columns with it, and gpu_extras runs the benchmark's own original-autocast column on it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/families.hpp"
#include "library.hpp"

namespace sapiens_seg::core {
struct MappedFile;
}

namespace speed_check {

// Applied to the network core::build made, before the CUDA-graph runner wraps it (gpu_extras: the
// original graph under autocast).
using RunnerWrap = std::function<std::unique_ptr<sapiens_seg::core::Runner>(
    std::unique_ptr<sapiens_seg::core::Runner>)>;

std::unique_ptr<LibraryColumn> load_core_column(const std::string& path,
                                                const sapiens_seg::LoadOptions& options,
                                                const RunnerWrap& wrap = {});

// The family of a checkpoint no card claims, by what its bytes are (the weight store's rule): a
// zip archive is a Sapiens v1 TorchScript export, so is a .pt2 or .pt that is not one (its reader
// says what is wrong); anything else is read as Sapiens2 safetensors.
sapiens_seg::core::Family family_of(const sapiens_seg::core::MappedFile& bytes,
                                    const std::string& path);

}  // namespace speed_check
