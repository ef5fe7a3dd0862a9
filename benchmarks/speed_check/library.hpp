// The library as speed_check's workers time it: load, then each call's two steps (prepare every
// image, run them as one network batch). One interface, two implementations, chosen by the build:
//
//   library_api.cpp   (SPEED_CHECK_WITH_API, the normal build): the public API only,
//                     sapiens_seg::load() and Model::prepare / Model::run, as users call them.
//   library_core.cpp  (the build without the IO layer: the GPU machine has no OpenCV, OpenSSL or
//                     curl): the library's own IO-free steps, core::build, core::prepare and
//                     core::run, i.e. what api/model.cpp runs minus decoding and the weight store.
//
// Neither builds a network or a pre- or post-processing of its own, so a change of the library is
// measured as it is, and a change of a core step's signature breaks this build instead of leaving
// a copy behind.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sapiens_seg/model.hpp"
#include "sapiens_seg/options.hpp"

namespace sapiens_seg::core {
class Runner;
}

namespace speed_check {

// Synthetic uint8 RGB images of one size (packed rows).
struct Images {
  int height = 0, width = 0;
  std::vector<std::vector<std::uint8_t>> rgb;
};

// One image's network output [classes, raw_height, raw_width] (float32, before any resize) and its
// labels at the image's size.
struct Outputs {
  std::vector<float> raw_logits;
  std::vector<std::uint8_t> labels;
};

class LibraryColumn {
 public:
  virtual ~LibraryColumn() = default;
  // Every image prepared (resized, normalised), then all run as one batch (the network, then each
  // image's upsample + argmax at its own size): what segment() does. Returns the batch's
  // Timings::network in ms.
  virtual double segment(const Images& images) = 0;
  // One image, with the network's raw logits.
  virtual Outputs outputs(const std::vector<std::uint8_t>& rgb, int height, int width) = 0;
  virtual sapiens_seg::Backend backend() const = 0;
  // How this column reaches the library, for the record.
  virtual std::string pipeline() const = 0;
  // The network that the core steps run, for gpu_extras (its CUDA-graph counts); null through
  // the public API, which keeps it inside Model.
  virtual const sapiens_seg::core::Runner* runner() const { return nullptr; }
};

// The library's column for `path` with these options (the worker sets them from the option
// table).
std::unique_ptr<LibraryColumn> load_library_column(const std::string& path,
                                                   const sapiens_seg::LoadOptions& options);

// How the library columns reach the library in this build (the record's meta.pipeline).
std::string library_pipeline();

// A checkpoint path for `id_or_path`: with the IO layer a card id is fetched (options.fetch) and
// verified first; without it a path is taken as it is.
std::string resolve_model(const std::string& id_or_path, const sapiens_seg::LoadOptions& options);

// Which library runs the CPU's float32 GEMMs, as `sapiens-seg info` says it.
std::string cpu_gemm_line();

}  // namespace speed_check
