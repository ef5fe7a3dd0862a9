// What `sapiens-seg segment` writes for one image.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "sapiens_seg/model.hpp"

namespace sapiens_seg::cli {

// Writes <stem>_seg.png (labels as 8-bit grey), <stem>_overlay.png (palette over the image),
// <stem>_seg.npy (int64 labels, as the authors' demo) and <stem>.npy (bool foreground), each
// atomically. Returns the JSON entry of the summary.
nlohmann::json write_outputs(const Result& result, const Image& image, const std::string& dir,
                             const std::string& stem, float opacity);

}  // namespace sapiens_seg::cli
