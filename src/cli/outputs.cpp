#include "outputs.hpp"

#include <filesystem>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "io/npy.hpp"

namespace sapiens_seg::cli {
namespace fs = std::filesystem;

namespace {
void write_png(const std::string& path, const cv::Mat& m) {
  std::vector<std::uint8_t> buf;
  if (!cv::imencode(".png", m, buf)) throw Error(ErrorCode::kIo, "cannot encode " + path);
  io::write_file_atomic(path, buf.data(), buf.size());
}
}  // namespace

nlohmann::json write_outputs(const Result& r, const Image& image, const std::string& dir,
                             const std::string& stem, float opacity) {
  const fs::path base = fs::path(dir) / stem;
  const std::string seg_png = base.string() + "_seg.png";
  const std::string overlay_png = base.string() + "_overlay.png";
  const std::string seg_npy = base.string() + "_seg.npy";
  const std::string fg_npy = base.string() + ".npy";

  const cv::Mat labels(r.height, r.width, CV_8U, const_cast<std::uint8_t*>(r.labels.data()));
  write_png(seg_png, labels);

  const Image ov = overlay(r, image.view(), opacity);
  cv::Mat ov_bgr;
  cv::cvtColor(cv::Mat(ov.height, ov.width, CV_8UC3, const_cast<std::uint8_t*>(ov.rgb.data())),
               ov_bgr, cv::COLOR_RGB2BGR);
  write_png(overlay_png, ov_bgr);

  const std::vector<std::int64_t> shape = {r.height, r.width};
  const std::vector<std::int64_t> wide(r.labels.begin(), r.labels.end());
  io::write_npy(seg_npy, "<i8", 8, shape, wide.data());
  const std::vector<std::uint8_t> fg = r.foreground();
  io::write_npy(fg_npy, "|b1", 1, shape, fg.data());

  // Share of the image per class present, for a quick look without opening the files.
  std::vector<std::int64_t> counts(r.classes.size(), 0);
  for (auto l : r.labels) ++counts[l];
  nlohmann::json classes = nlohmann::json::object();
  for (std::size_t k = 0; k < counts.size(); ++k) {
    if (counts[k] > 0) {
      classes[r.classes[k]] = static_cast<double>(counts[k]) / static_cast<double>(r.labels.size());
    }
  }
  return {{"height", r.height},
          {"width", r.width},
          {"outputs",
           {{"labels_png", seg_png},
            {"overlay_png", overlay_png},
            {"labels_npy", seg_npy},
            {"foreground_npy", fg_npy}}},
          {"backend",
           {{"mode", r.backend.mode}, {"device", r.backend.device}, {"dtype", r.backend.dtype}}},
          {"timings_ms",
           {{"decode", r.timings.decode},
            {"preprocess", r.timings.preprocess},
            {"network", r.timings.network},
            {"postprocess", r.timings.postprocess},
            {"total", r.timings.total}}},
          {"class_fractions", classes}};
}

}  // namespace sapiens_seg::cli
