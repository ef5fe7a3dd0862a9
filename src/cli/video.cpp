#include "cli/video.hpp"

#include <cstdio>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>
#include <opencv2/core/utils/logger.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>

#include "cli/files.hpp"
#include "cli/json_paths.hpp"
#include "cli/stop.hpp"

namespace sapiens_seg::cli {
namespace fs = std::filesystem;
namespace {

// The overlay video's writer. H.264 ('avc1' in .mp4, 4:2:0) is what browsers, chat apps and
// file previews play; MPEG-4 Part 2 ('mp4v') is what any OpenCV with FFmpeg writes, but browsers
// do not play it. Whether H.264 can be written is known only at run time (it depends on the
// FFmpeg that the linked OpenCV uses, e.g. Debian's links libx264): opening the writer is the
// check. --codec auto takes H.264 when that works and says so when it falls back.
struct VideoOut {
  cv::VideoWriter writer;
  std::string codec;     // "h264" or "mp4v" once open
  std::string fallback;  // why auto wrote mp4v ("" when it did not fall back)
  cv::Size size;         // what is written: 4:2:0 needs even sides, so one edge row/column is
                         // repeated for an odd input (OpenCV would rescale the frames instead)
  cv::Mat padded;

  void open(const std::string& path, const std::string& requested, double fps, cv::Size frame) {
    size = cv::Size(frame.width + frame.width % 2, frame.height + frame.height % 2);
    if (requested == "auto" || requested == "h264") {
      // A failed attempt is expected where there is no encoder, and said below in our words:
      // OpenCV's own error lines about it are muted.
      namespace cvlog = cv::utils::logging;
      const cvlog::LogLevel level = cvlog::setLogLevel(cvlog::LOG_LEVEL_SILENT);
      const bool opened =
          writer.open(path, cv::CAP_FFMPEG, cv::VideoWriter::fourcc('a', 'v', 'c', '1'), fps, size);
      cvlog::setLogLevel(level);
      if (opened) {
        codec = "h264";
        return;
      }
      const std::string why = "this OpenCV (" + std::string(CV_VERSION) +
                              ") and its FFmpeg cannot encode H.264 here (no H.264 encoder, or it "
                              "failed to open)";
      if (requested == "h264") {
        throw Error(ErrorCode::kIo, "--codec h264: " + why + "; use --codec mp4v (or auto)");
      }
      fallback = why + "; wrote MPEG-4 Part 2 (mp4v) instead, which browsers do not play";
    }
    if (!writer.open(path, cv::VideoWriter::fourcc('m', 'p', '4', 'v'), fps, size)) {
      throw Error(ErrorCode::kIo, "cannot write video " + path + " (mp4v)");
    }
    codec = "mp4v";
  }

  void write(const cv::Mat& frame) {
    if (frame.size() == size) {
      writer.write(frame);
      return;
    }
    cv::copyMakeBorder(frame, padded, 0, size.height - frame.rows, 0, size.width - frame.cols,
                       cv::BORDER_REPLICATE);
    writer.write(padded);
  }
};

// Videos: frames in order, batched, written to an overlay video (H.264 or mp4v in .mp4, see
// VideoOut; the input's fps divided by the stride, the input's frame size) and/or one label PNG
// per processed frame.
}  // namespace

void run_video(const Model& model, const std::string& path, const OutputNames& names,
               const SegmentArgs& a, const SaveSet& save, OverlayStyle style, Reporter& report,
               const std::atomic<bool>& cancel) {
  cv::VideoCapture cap(path);
  if (!cap.isOpened()) {
    report.failed(path, Error(ErrorCode::kInvalidInput, "cannot open video " + path));
    return;
  }
  const double fps = cap.get(cv::CAP_PROP_FPS) > 0 ? cap.get(cv::CAP_PROP_FPS) : 25.0;
  const auto total = static_cast<std::int64_t>(cap.get(cv::CAP_PROP_FRAME_COUNT));
  const std::string& video_out = names.overlay_video;
  const std::string& video_tmp = names.overlay_video_partial;
  const fs::path frames_dir = names.frames_dir;
  VideoOut video;
  // A second signal (stop.hpp) removes the unfinished video before the process ends.
  const TempFileGuard partial_guard(video_tmp);
  std::int64_t read = 0, processed = 0;
  std::vector<Prepared> batch;
  std::vector<std::int64_t> batch_index;
  auto flush = [&] {
    if (batch.empty()) return;
    const std::vector<Result> results = model.run(batch);
    for (std::size_t j = 0; j < batch.size(); ++j) {
      if (save.overlay) {
        const cv::Mat frame = overlay_bgr(results[j], batch[j].image(), style, a.opacity);
        if (!video.writer.isOpened()) {
          video.open(video_tmp, a.codec, fps / a.stride, frame.size());
          if (!video.fallback.empty()) report.warn(path + ": " + video.fallback);
        }
        video.write(frame);
      }
      if (save.labels) {
        char name[32];
        std::snprintf(name, sizeof name, "frame_%06lld_seg.png",
                      static_cast<long long>(batch_index[j]));
        write_image((frames_dir / name).string(),
                    cv::Mat(results[j].height, results[j].width, CV_8U,
                            const_cast<std::uint8_t*>(results[j].labels.data())));
      }
      ++processed;
    }
    batch.clear();
    batch_index.clear();
    report.frames(path, read, total);
  };
  try {
    if (save.labels) fs::create_directories(frames_dir);
    cv::Mat frame, rgb;
    while (!cancel && cap.read(frame)) {
      if (read++ % a.stride != 0) continue;
      cv::cvtColor(frame, rgb, cv::COLOR_BGR2RGB);
      batch.push_back(model.prepare(Input::rgb_copy({rgb.data, rgb.rows, rgb.cols, rgb.step})));
      batch_index.push_back(read - 1);
      if (batch.size() == static_cast<std::size_t>(a.run.batch_size)) flush();
    }
    if (!cancel) flush();
    video.writer.release();
    std::error_code ec;
    if (cancel) {
      fs::remove(video_tmp, ec);  // no truncated video under the final name
      return;
    }
    nlohmann::json outputs = nlohmann::json::object();
    if (save.overlay && processed > 0) {
      fs::rename(video_tmp, video_out, ec);
      if (ec) throw Error(ErrorCode::kIo, "cannot write " + video_out + ": " + ec.message());
      put_path(outputs, "overlay_video", video_out);
    }
    if (save.labels) put_path(outputs, "frames_dir", frames_dir.string());
    if (processed == 0)
      throw Error(ErrorCode::kInvalidInput, "no frame could be read from " + path);
    nlohmann::json entry = {{"frames", processed},
                            {"frames_read", read},
                            {"frames_in_container", total},
                            {"fps", fps},
                            {"width", static_cast<int>(cap.get(cv::CAP_PROP_FRAME_WIDTH))},
                            {"height", static_cast<int>(cap.get(cv::CAP_PROP_FRAME_HEIGHT))},
                            {"outputs", outputs}};
    if (save.overlay) {
      entry["codec"] = video.codec;
      if (!video.fallback.empty()) entry["codec_fallback"] = video.fallback;
    }
    // A cut file (a copy or download that stopped) decodes up to the cut and then reads as
    // ended: only the container's frame count (given, or estimated by FFmpeg from its duration)
    // tells. The frames read are segmented and written; the entry says what is missing.
    if (total > 0 && read < total) {
      const std::string why = "truncated or damaged: only " + std::to_string(read) + " of the " +
                              std::to_string(total) + " frames the container lists could be read";
      entry["truncated"] = true;
      entry["warnings"] = nlohmann::json::array({why});
      report.warn(path + ": " + why);
    }
    report.ok(path, std::move(entry));
  } catch (...) {
    const Error e = as_error(std::current_exception(), "segmenting the video " + path);
    try {
      video.writer.release();
    } catch (...) {  // the file is removed below either way
    }
    std::error_code ec;
    fs::remove(video_tmp, ec);
    report.failed(path, e);
  }
}

}  // namespace sapiens_seg::cli
