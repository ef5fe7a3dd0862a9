#include "outputs.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string_view>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "cli/files.hpp"
#include "cli/json_paths.hpp"
#include "formats/npy.hpp"

namespace sapiens_seg::cli {
namespace fs = std::filesystem;

namespace {
// The SaveSet field of each --save item (save_items()); nullptr for another word.
bool SaveSet::*save_field(std::string_view item) {
  static const std::pair<std::string_view, bool SaveSet::*> kFields[] = {
      {"labels", &SaveSet::labels}, {"overlay", &SaveSet::overlay},
      {"mask", &SaveSet::mask},     {"npy", &SaveSet::npy},
      {"logits", &SaveSet::logits}, {"raw_logits", &SaveSet::raw_logits},
      {"json", &SaveSet::json}};
  for (const auto& [name, field] : kFields) {
    if (item == name) return field;
  }
  return nullptr;
}

bool selected(const SaveSet& s, const OutputKind& k) {
  return k.save != nullptr && s.*save_field(k.save);
}
}  // namespace

SaveSet parse_save(const std::string& list) {
  SaveSet s{false, false, false, false, false, false, false};
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    bool SaveSet::*field = save_field(item);
    if (field == nullptr) {
      std::string items;
      for (const auto& i : save_items()) items += (items.empty() ? "" : ", ") + i;
      throw Error(ErrorCode::kInvalidInput,
                  "--save: unknown output '" + item + "' (" + items + ")");
    }
    s.*field = true;
  }
  return s;
}

bool outputs_exist(const OutputNames& n, const SaveSet& s) {
  std::error_code ec;
  for (const auto& k : output_kinds()) {
    if (!k.video && selected(s, k) && !fs::exists(n.*k.field, ec)) return false;
  }
  return true;
}

cv::Mat overlay_bgr(const Result& r, ImageView image, OverlayStyle style, float opacity) {
  const bool sbs = style == OverlayStyle::kSideBySide;
  const int w = r.width, h = r.height;
  cv::Mat out(h, sbs ? 2 * w : w, CV_8UC3);
  // The library's overlay() on strips of 64 to 95 rows (a Result holding only those rows'
  // labels): its arithmetic, without a full-size RGB picture besides the output. A strip has at
  // least 32 rows, as any image the library takes.
  constexpr int kRows = 64, kMinRows = 32;
  Result strip;
  strip.width = w;
  strip.palette = r.palette;
  strip.classes = r.classes;
  for (int y0 = 0, rows = 0; y0 < h; y0 += rows) {
    rows = h - y0 - kRows < kMinRows ? h - y0 : kRows;
    const std::size_t first = static_cast<std::size_t>(y0) * w;
    strip.height = rows;
    strip.labels.assign(
        r.labels.begin() + static_cast<std::ptrdiff_t>(first),
        r.labels.begin() + static_cast<std::ptrdiff_t>(first + std::size_t(rows) * w));
    const std::size_t stride = image.stride ? image.stride : static_cast<std::size_t>(w) * 3;
    const ImageView view{image.data + static_cast<std::size_t>(y0) * stride, rows, w, stride};
    const Image ov = overlay(strip, view, opacity);
    const cv::Mat blend(rows, w, CV_8UC3, const_cast<std::uint8_t*>(ov.rgb.data()));
    if (sbs) {
      const cv::Mat input(rows, w, CV_8UC3, const_cast<std::uint8_t*>(view.data), stride);
      cv::Mat left = out(cv::Rect(0, y0, w, rows)), right = out(cv::Rect(w, y0, w, rows));
      cv::cvtColor(input, left, cv::COLOR_RGB2BGR);
      cv::cvtColor(blend, right, cv::COLOR_RGB2BGR);
    } else {
      cv::Mat dst = out(cv::Rect(0, y0, w, rows));
      cv::cvtColor(blend, dst, cv::COLOR_RGB2BGR);
    }
  }
  return out;
}

nlohmann::json class_counts(const Result& r) {
  std::vector<std::int64_t> counts(r.classes.size(), 0);
  for (auto l : r.labels) ++counts[l];
  nlohmann::json classes = nlohmann::json::object();
  for (std::size_t k = 0; k < counts.size(); ++k) {
    if (counts[k] > 0) classes[r.classes[k]] = counts[k];
  }
  return classes;
}

nlohmann::json timings_json(const Timings& t) {
  return {{"decode", t.decode},
          {"preprocess", t.preprocess},
          {"network", t.network},
          {"postprocess", t.postprocess},
          {"total", t.total}};
}

namespace {
void write_floats(const std::string& path, const std::vector<float>& values,
                  std::vector<std::int64_t> shape) {
  std::size_t at = 0;
  write_npy(path, "<f4", 4, std::move(shape), [&](void* buf, std::size_t n) {
    std::memcpy(buf, values.data() + at, n * sizeof(float));
    at += n;
    return n;
  });
}
}  // namespace

nlohmann::json write_outputs(const Result& r, ImageView image, const OutputNames& names,
                             const SaveSet& save, OverlayStyle style, float opacity) {
  nlohmann::json outputs = nlohmann::json::object();
  const std::vector<std::int64_t> shape = {r.height, r.width};
  if (save.labels) {
    const cv::Mat labels(r.height, r.width, CV_8U, const_cast<std::uint8_t*>(r.labels.data()));
    write_image(names.labels_png, labels);
    put_path(outputs, "labels_png", names.labels_png);
  }
  if (save.overlay) {
    write_image(names.overlay, overlay_bgr(r, image, style, opacity));
    put_path(outputs, "overlay", names.overlay);
  }
  if (save.npy) {  // int64, as the demo saves it: 8 bytes a pixel, so converted piece by piece
    std::size_t at = 0;
    write_npy(names.labels_npy, "<i8", 8, shape, [&](void* buf, std::size_t n) {
      formats::widen_labels(r.labels.data() + at, n, buf);
      at += n;
      return n;
    });
    put_path(outputs, "labels_npy", names.labels_npy);
  }
  if (save.mask) {
    std::size_t at = 0;
    write_npy(names.mask_npy, "|b1", 1, shape, [&](void* buf, std::size_t n) {
      auto* out = static_cast<std::uint8_t*>(buf);
      for (std::size_t k = 0; k < n; ++k) out[k] = r.labels[at + k] != 0 ? 1 : 0;
      at += n;
      return n;
    });
    put_path(outputs, "mask_npy", names.mask_npy);
  }
  const auto classes = static_cast<std::int64_t>(r.classes.size());
  if (save.logits) {
    write_floats(names.logits_npy, r.logits, {classes, r.height, r.width});
    put_path(outputs, "logits_npy", names.logits_npy);
  }
  if (save.raw_logits) {
    write_floats(names.raw_logits_npy, r.raw_logits, {classes, r.raw_height, r.raw_width});
    put_path(outputs, "raw_logits_npy", names.raw_logits_npy);
  }
  return {{"height", r.height},
          {"width", r.width},
          {"outputs", outputs},
          {"backend",
           {{"mode", r.backend.mode}, {"device", r.backend.device}, {"dtype", r.backend.dtype}}},
          {"timings_ms", timings_json(r.timings)},
          {"classes", class_counts(r)},
          {"warnings", r.warnings}};
}

}  // namespace sapiens_seg::cli
