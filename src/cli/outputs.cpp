#include "outputs.hpp"

#include <filesystem>
#include <sstream>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "cli/json_paths.hpp"
#include "io/atomic_file.hpp"
#include "io/npy.hpp"

namespace sapiens_seg::cli {
namespace fs = std::filesystem;

namespace {
void write_image(const std::string& path, const cv::Mat& m) {
  std::vector<std::uint8_t> buf;
  const std::string ext = fs::path(path).extension().string();
  if (!cv::imencode(ext.empty() ? ".png" : ext, m, buf)) {
    throw Error(ErrorCode::kIo, "cannot encode " + path);
  }
  io::write_file_atomic(path, buf.data(), buf.size());
}
}  // namespace

SaveSet parse_save(const std::string& list) {
  SaveSet s{false, false, false, false, false, false};
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item == "labels")
      s.labels = true;
    else if (item == "overlay")
      s.overlay = true;
    else if (item == "mask")
      s.mask = true;
    else if (item == "npy")
      s.npy = true;
    else if (item == "logits")
      s.logits = true;
    else if (item == "json")
      s.json = true;
    else if (!item.empty()) {
      throw Error(ErrorCode::kInvalidInput, "--save: unknown output '" + item +
                                                "' (labels, overlay, mask, npy, logits, json)");
    }
  }
  return s;
}

OutputNames output_names(const std::string& dir, const std::string& stem,
                         const std::string& input_name, OverlayStyle style) {
  const std::string base = (fs::path(dir) / stem).string();
  OutputNames n;
  n.labels_png = base + "_seg.png";
  // The authors' demo writes its side-by-side picture under the input's own name.
  std::string ext = fs::path(input_name).extension().string();
  if (ext.empty() || !cv::haveImageWriter("x" + ext)) ext = ".png";
  n.overlay = style == OverlayStyle::kSideBySide ? base + ext : base + "_overlay.png";
  n.mask_npy = base + ".npy";
  n.labels_npy = base + "_seg.npy";
  n.logits_npy = base + "_logits.npy";
  return n;
}

bool outputs_exist(const OutputNames& n, const SaveSet& s) {
  std::error_code ec;
  auto ok = [&](bool wanted, const std::string& p) { return !wanted || fs::exists(p, ec); };
  return ok(s.labels, n.labels_png) && ok(s.overlay, n.overlay) && ok(s.mask, n.mask_npy) &&
         ok(s.npy, n.labels_npy) && ok(s.logits, n.logits_npy);
}

std::vector<std::uint8_t> overlay_bgr(const Result& r, const Image& image, OverlayStyle style,
                                      float opacity, int* width) {
  const Image ov = overlay(r, image.view(), opacity);
  cv::Mat blend(ov.height, ov.width, CV_8UC3, const_cast<std::uint8_t*>(ov.rgb.data()));
  cv::Mat out;
  if (style == OverlayStyle::kSideBySide) {
    const cv::Mat input(image.height, image.width, CV_8UC3,
                        const_cast<std::uint8_t*>(image.rgb.data()));
    cv::hconcat(input, blend, out);
    cv::cvtColor(out, out, cv::COLOR_RGB2BGR);
  } else {
    cv::cvtColor(blend, out, cv::COLOR_RGB2BGR);
  }
  *width = out.cols;
  return {out.data, out.data + out.total() * 3};
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

nlohmann::json write_outputs(const Result& r, const Image& image, const OutputNames& names,
                             const SaveSet& save, OverlayStyle style, float opacity) {
  nlohmann::json outputs = nlohmann::json::object();
  const std::vector<std::int64_t> shape = {r.height, r.width};
  if (save.labels) {
    const cv::Mat labels(r.height, r.width, CV_8U, const_cast<std::uint8_t*>(r.labels.data()));
    write_image(names.labels_png, labels);
    put_path(outputs, "labels_png", names.labels_png);
  }
  if (save.overlay) {
    int w = 0;
    std::vector<std::uint8_t> bgr = overlay_bgr(r, image, style, opacity, &w);
    write_image(names.overlay, cv::Mat(r.height, w, CV_8UC3, bgr.data()));
    put_path(outputs, "overlay", names.overlay);
  }
  if (save.npy) {
    const std::vector<std::int64_t> wide(r.labels.begin(), r.labels.end());
    io::write_npy(names.labels_npy, "<i8", 8, shape, wide.data());
    put_path(outputs, "labels_npy", names.labels_npy);
  }
  if (save.mask) {
    const std::vector<std::uint8_t> fg = r.foreground();
    io::write_npy(names.mask_npy, "|b1", 1, shape, fg.data());
    put_path(outputs, "mask_npy", names.mask_npy);
  }
  if (save.logits) {
    const std::int64_t classes = static_cast<std::int64_t>(r.classes.size());
    io::write_npy(names.logits_npy, "<f4", 4, {classes, r.height, r.width}, r.logits.data());
    put_path(outputs, "logits_npy", names.logits_npy);
  }
  return {{"height", r.height},
          {"width", r.width},
          {"outputs", outputs},
          {"backend",
           {{"mode", r.backend.mode}, {"device", r.backend.device}, {"dtype", r.backend.dtype}}},
          {"timings_ms",
           {{"decode", r.timings.decode},
            {"preprocess", r.timings.preprocess},
            {"network", r.timings.network},
            {"postprocess", r.timings.postprocess},
            {"total", r.timings.total}}},
          {"classes", class_counts(r)}};
}

}  // namespace sapiens_seg::cli
