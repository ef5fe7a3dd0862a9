// What `sapiens-seg segment` writes for one image, and under which names.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "cli/naming.hpp"
#include "sapiens_seg/model.hpp"

namespace cv {
class Mat;
}

namespace sapiens_seg::cli {

// --save: which files to write.
// Writes the selected files, each atomically (files.hpp), and returns the per-image JSON entry
// (size, outputs, backend, timings, pixel count per class present). Memory: besides the image
// and its labels, at most one full-size picture (the overlay, in the encoder's BGR order) and
// buffers of a few MB; the .npy files are written in pieces.
nlohmann::json write_outputs(const Result& result, ImageView image, const OutputNames& names,
                             const SaveSet& save, OverlayStyle style, float opacity);

// The overlay image (blend or side-by-side) as BGR for encoders, made in strips of rows so that
// no second full-size RGB copy exists on the way.
cv::Mat overlay_bgr(const Result& result, ImageView image, OverlayStyle style, float opacity);

// Pixel count per class present, by name.
nlohmann::json class_counts(const Result& result);

// The library's Timings as the JSON object the summary and --json lines carry ("timings_ms").
nlohmann::json timings_json(const Timings& t);

}  // namespace sapiens_seg::cli
