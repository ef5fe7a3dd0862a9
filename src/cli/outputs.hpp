// What `sapiens-seg segment` writes for one image, and under which names.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "sapiens_seg/model.hpp"

namespace sapiens_seg::cli {

// --save: which files to write.
struct SaveSet {
  bool labels = true;   // <name>_seg.png, 8-bit grey class indices
  bool overlay = true;  // <name>_overlay.png, or the demo's side-by-side image
  bool mask = true;     // <name>.npy, bool foreground (the authors' demo name)
  bool npy = true;      // <name>_seg.npy, int64 labels (the authors' demo name)
  bool logits = false;  // <name>_logits.npy, float32 [classes, H, W] (large)
  bool json = true;     // summary.json for the run
};

// Parses "labels,overlay,mask,npy,logits,json" (any subset). Throws Error(kInvalidInput).
SaveSet parse_save(const std::string& list);

enum class OverlayStyle {
  kBlend,       // palette blended over the photo, same size
  kSideBySide,  // input | blend, as the authors' demo saves it, under the input's file name
};

struct OutputNames {
  std::string labels_png, overlay, mask_npy, labels_npy, logits_npy;
};

// `stem` is the output base name; `input_name` the input's file name (for the demo's
// side-by-side image, which keeps it).
OutputNames output_names(const std::string& dir, const std::string& stem,
                         const std::string& input_name, OverlayStyle style);

// True when every selected output exists already (--skip-existing).
bool outputs_exist(const OutputNames& names, const SaveSet& save);

// Writes the selected files, each atomically (temporary file, then rename), and returns the
// per-image JSON entry (size, outputs, backend, timings, pixel count per class present).
nlohmann::json write_outputs(const Result& result, const Image& image, const OutputNames& names,
                             const SaveSet& save, OverlayStyle style, float opacity);

// The overlay image (blend or side-by-side) as BGR for encoders.
std::vector<std::uint8_t> overlay_bgr(const Result& result, const Image& image, OverlayStyle style,
                                      float opacity, int* width);

// Pixel count per class present, by name.
nlohmann::json class_counts(const Result& result);

}  // namespace sapiens_seg::cli
