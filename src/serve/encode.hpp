// What `sapiens-seg serve` answers, as bytes: the label PNG, the .npy, the overlay PNG and the
// JSON summary. The C++ server and the Ray Serve deployment (through the Python binding,
// python/src/serve_binding.cpp) both call these, so the two servers answer the same bytes for
// the same result, and the PNG and .npy are the CLI's files byte for byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sapiens_seg/model.hpp"

namespace sapiens_seg::serve {

// The 8-bit grey label map, PNG-encoded by OpenCV with its default settings: the bytes of the
// CLI's <name>_seg.png (cv::imwrite) for the same result.
std::string labels_png(const Result& result);

// The H x W int64 label map as the CLI's <name>_seg.npy.
std::string labels_npy(const Result& result);

// Which classes a request selects: `shown[k]` for class k. Empty means every class.
using ClassSet = std::vector<bool>;

// `spec` is a comma list of class names or indices ("face_neck,3"); "" selects every class.
// Error(kInvalidInput) naming the item for an unknown name, an index out of range or an empty
// item.
ClassSet parse_classes(std::string_view spec, const std::vector<std::string>& names);
ClassSet parse_classes(const std::vector<std::string>& items,
                       const std::vector<std::string>& names);

// The authors' overlay (sapiens_seg::overlay at `opacity`) as an RGB PNG with OpenCV's default
// settings: the pixels of the CLI's <name>_overlay.png. With `shown` set, the pixels of other
// classes keep the photo's colour. `image` is the decoded photo (the result's size).
std::string overlay_png(const Result& result, ImageView image, float opacity,
                        const ClassSet& shown = {});

struct SummaryOptions {
  std::string model;    // the model's id as /v1/models lists it
  ClassSet shown;       // the classes to report (empty: all)
  bool rle = false;     // add each reported class's COCO compressed RLE mask
  double queue_ms = 0;  // time between prepare() and run() (not in Result::timings)
};

// The JSON summary (serve-contract: model, width, height, backend, classes with pixels,
// fraction, COCO bbox [x, y, w, h] and optional RLE, timings_ms, warnings), compact, keys in the
// contract's order.
std::string summary_json(const Result& result, const SummaryOptions& options);

// COCO's run-length encoding of the mask `labels == k` for every k with `wanted[k]`: counts of
// alternating 0 and 1 runs in column-major order, starting with a (possibly empty) run of 0s.
// One pass over the labels for all classes. The counts of unwanted classes are left empty.
std::vector<std::vector<std::uint32_t>> rle_counts(const Result& result, const ClassSet& wanted);

// The counts in pycocotools' compressed string form (what its RLE "counts" holds as text).
std::string rle_string(const std::vector<std::uint32_t>& counts);

}  // namespace sapiens_seg::serve
