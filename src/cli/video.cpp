#include "cli/video.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>
#include <opencv2/core/utils/logger.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>

#include "cli/files.hpp"
#include "cli/json_paths.hpp"
#include "cli/stop.hpp"
#include "cli/video_reader.hpp"

namespace sapiens_seg::cli {
namespace fs = std::filesystem;
namespace {

// OpenCV's own log lines (a backend that cannot open a file, an encoder that is missing) are
// muted while we try: what failed is said in our words.
class QuietOpenCV {
 public:
  QuietOpenCV() : level_(cv::utils::logging::setLogLevel(cv::utils::logging::LOG_LEVEL_SILENT)) {}
  ~QuietOpenCV() { cv::utils::logging::setLogLevel(level_); }
  QuietOpenCV(const QuietOpenCV&) = delete;
  QuietOpenCV& operator=(const QuietOpenCV&) = delete;

 private:
  cv::utils::logging::LogLevel level_;
};

// The overlay video's writer. H.264 ('avc1' in .mp4, 4:2:0) is what browsers, chat apps and
// file previews play; MPEG-4 Part 2 ('mp4v') is what any OpenCV with FFmpeg writes, but browsers
// do not play it. Whether H.264 can be written is known only at run time (it depends on the
// FFmpeg that the linked OpenCV uses, e.g. Debian's links libx264): opening the writer is the
// check. --codec auto takes H.264 when that works and says so when it falls back.
//
// Frames are placed on the output's constant-rate timeline by their presentation time, so a
// variable-frame-rate input keeps its duration and its pictures stay in time: a frame is
// repeated until the next one is due, and a frame due in a slot already filled is left out of
// the video (its labels are still written).
class VideoOut {
 public:
  std::string codec;     // "h264" or "mp4v" once open
  std::string fallback;  // why auto wrote mp4v ("" when it did not fall back)

  bool is_open() const { return writer_.isOpened(); }
  std::int64_t written() const { return written_; }
  std::int64_t left_out() const { return left_out_; }
  std::int64_t times_ignored() const { return times_ignored_; }
  double fps() const { return fps_; }

  void open(const std::string& path, const std::string& requested, double fps, cv::Size frame) {
    // A file that cannot be created (no space for it, no permission) is said as such, not as a
    // missing encoder.
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw Error(ErrorCode::kIo, "cannot write " + path + " (" + std::strerror(errno) + ")");
    }
    ::close(fd);
    fps_ = fps;
    frame_ = frame;
    size_ = cv::Size(frame.width + frame.width % 2, frame.height + frame.height % 2);
    if (requested == "auto" || requested == "h264") {
      bool opened = false;
      {
        const QuietOpenCV quiet;
        opened = writer_.open(path, cv::CAP_FFMPEG, cv::VideoWriter::fourcc('a', 'v', 'c', '1'),
                              fps, size_);
      }
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
    if (!writer_.open(path, cv::VideoWriter::fourcc('m', 'p', '4', 'v'), fps, size_)) {
      throw Error(ErrorCode::kIo, "cannot write video " + path + " (mp4v)");
    }
    codec = "mp4v";
  }

  // A frame's time is believed only as far as it can be true: inside the stream's duration as its
  // header gives it (a second of slack), and at most kMaxGapSeconds after the previous frame's.
  // A damaged or hostile timestamp (a 2 KB file whose third frame is due 10^6 s after its
  // second) would otherwise have the last picture repeated millions of times; such a frame is
  // placed right after the previous one, as a frame without a time is, and counted.
  static constexpr double kMaxGapSeconds = 60;
  void limit_times(std::optional<double> header_duration) { header_duration_ = header_duration; }

  // `frame` at `seconds` after the first frame (nullopt: no usable time; then right after the
  // previous frame).
  void place(const cv::Mat& frame, std::optional<double> seconds) {
    std::int64_t slot = written_;
    if (seconds && !believable(*seconds)) {
      ++times_ignored_;
      seconds.reset();
    }
    if (seconds && (!last_seconds_ || *seconds > *last_seconds_)) {
      slot = std::llround(*seconds * fps_);
      last_seconds_ = seconds;
    }
    if (slot < written_) {
      ++left_out_;
      return;
    }
    while (written_ < slot && !last_.empty()) put(last_);
    fit(frame, last_);
    put(last_);
  }

  // A frame whose picture could not be decoded: black, never a repeated picture.
  void place_black(std::optional<double> seconds) {
    place(cv::Mat::zeros(frame_, CV_8UC3), seconds);
  }

  // The last frame is held until the input's end (`seconds` after its first frame).
  void finish(double seconds) {
    if (!believable(seconds)) return;
    const std::int64_t end = std::llround(seconds * fps_);
    while (written_ < end && !last_.empty()) put(last_);
  }

  void release() { writer_.release(); }

 private:
  // The first frame's size, even sides for 4:2:0 (one edge row/column repeated; OpenCV would
  // rescale the frames instead); a frame of another size (a stream whose size changes) is
  // scaled to fit, centred on black.
  void fit(const cv::Mat& frame, cv::Mat& out) const {
    if (frame.size() == frame_) {
      if (frame_ == size_) {
        frame.copyTo(out);
      } else {
        cv::copyMakeBorder(frame, out, 0, size_.height - frame.rows, 0, size_.width - frame.cols,
                           cv::BORDER_REPLICATE);
      }
      return;
    }
    out = cv::Mat::zeros(size_, CV_8UC3);
    const double scale = std::min(static_cast<double>(frame_.width) / frame.cols,
                                  static_cast<double>(frame_.height) / frame.rows);
    const cv::Size inner(std::max(1, static_cast<int>(frame.cols * scale)),
                         std::max(1, static_cast<int>(frame.rows * scale)));
    cv::Mat roi = out(cv::Rect((frame_.width - inner.width) / 2, (frame_.height - inner.height) / 2,
                               inner.width, inner.height));
    cv::resize(frame, roi, inner, 0, 0, cv::INTER_AREA);
  }

  void put(const cv::Mat& frame) {
    writer_.write(frame);
    ++written_;
  }

  cv::VideoWriter writer_;
  double fps_ = 25;
  cv::Size frame_, size_;
  cv::Mat last_;
  std::int64_t written_ = 0, left_out_ = 0;
  std::optional<double> last_seconds_, header_duration_;
  std::int64_t times_ignored_ = 0;

  bool believable(double seconds) const {
    if (!std::isfinite(seconds) || seconds < 0) return false;
    if (header_duration_ && seconds > *header_duration_ + 1.0) return false;
    return seconds - last_seconds_.value_or(0.0) <= kMaxGapSeconds;
  }
};

// OpenCV's VideoWriter reports no write error (a full disk, a file size limit): the finished
// file is flushed to disk and read back (decoded by FFmpeg, video_reader.hpp), and must hold
// every frame written, or it is not kept.
void check_written_video(const std::string& tmp, const std::string& final_path,
                         std::int64_t frames) {
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  int err = fd < 0 ? errno : 0;
  if (fd >= 0) {
    if (::fsync(fd) != 0 && errno != EINVAL) err = errno;
    ::close(fd);
  }
  if (err) {
    throw Error(ErrorCode::kIo, "cannot write " + final_path + " (" + std::strerror(err) + ")");
  }
  const std::int64_t n = std::max<std::int64_t>(0, count_decodable_frames(tmp));
  if (n != frames) {
    throw Error(ErrorCode::kIo,
                "cannot write " + final_path + ": the finished video holds " + std::to_string(n) +
                    " of the " + std::to_string(frames) +
                    " frames written (the file system is full, or a file size limit was reached; "
                    "the video encoder reports no write error); it is not kept");
  }
}

// Frame numbers as ranges ([[10, 19], [40, 40]]) for the JSON entry, and in words.
struct Ranges {
  std::vector<std::pair<std::int64_t, std::int64_t>> r;
  void add(std::int64_t i) {
    if (!r.empty() && r.back().second + 1 == i) {
      r.back().second = i;
    } else {
      r.emplace_back(i, i);
    }
  }
  std::int64_t count() const {
    std::int64_t n = 0;
    for (const auto& [a, b] : r) n += b - a + 1;
    return n;
  }
  nlohmann::json json() const {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& [a, b] : r) j.push_back({a, b});
    return j;
  }
  std::string text() const {
    std::string list;
    for (const auto& [f, l] : r) {
      list += (list.empty() ? "" : ", ") + std::to_string(f) +
              (l > f ? "-" + std::to_string(l) : std::string());
    }
    return list;
  }
};

}  // namespace

// Videos: frames in order, decoded and turned as players show them (video_reader.hpp), batched,
// written to an overlay video (H.264 or mp4v in .mp4, see VideoOut; the input's frame rate
// divided by the stride, the input's duration, the first displayed frame's size) and/or one
// label PNG per processed frame, each at its frame's own size.
void run_video(const Model& model, const std::string& path, const OutputNames& names,
               const SegmentArgs& a, const SaveSet& save, OverlayStyle style, Reporter& report,
               const std::atomic<bool>& cancel) {
  std::unique_ptr<VideoReader> reader;
  try {
    reader = std::make_unique<VideoReader>(path, cancel);
  } catch (...) {
    if (cancel) return;
    report.failed(path, as_error(std::current_exception(), "opening the video " + path));
    return;
  }
  const VideoStreamInfo& vi = reader->info();
  std::vector<std::string> warnings;
  if (vi.odd_matrix) {
    char angle[64];
    std::snprintf(angle, sizeof angle, "%.1f", vi.odd_angle);
    warnings.push_back(std::string("its display matrix turns the picture by ") + angle +
                       " degrees, not a quarter turn; frames are segmented as stored");
  }
  const double rate = vi.rate;
  // For the progress line: what the container lists, else its duration at the rate.
  const std::int64_t expected =
      vi.frames_listed     ? *vi.frames_listed
      : vi.header_duration ? static_cast<std::int64_t>(std::llround(*vi.header_duration * rate))
                           : 0;
  const std::string& video_out = names.overlay_video;
  const std::string& video_tmp = names.overlay_video_partial;
  const fs::path frames_dir = names.frames_dir;
  VideoOut video;
  // A second signal (stop.hpp) removes the unfinished video before the process ends.
  const TempFileGuard partial_guard(video_tmp);
  std::int64_t read = 0, processed = 0;
  bool frames_dir_made = false;
  std::optional<cv::Size> displayed;
  std::vector<cv::Size> sizes;  // the distinct displayed sizes, in order (at most 16)
  Ranges undecodable, damaged;
  struct Item {
    std::int64_t index;
    std::optional<double> seconds;
  };
  std::vector<Prepared> batch;
  std::vector<Item> items;
  auto overlay_open = [&](cv::Size size) {
    if (video.is_open()) return;
    video.open(video_tmp, a.codec, rate / a.stride, size);
    video.limit_times(vi.header_duration);
    if (!video.fallback.empty()) report.warn(path + ": " + video.fallback);
  };
  auto flush = [&] {
    if (batch.empty()) return;
    const std::vector<Result> results = model.run(batch);
    for (std::size_t j = 0; j < batch.size(); ++j) {
      if (save.overlay) {
        const cv::Mat frame = overlay_bgr(results[j], batch[j].image(), style, a.opacity);
        overlay_open(frame.size());
        video.place(frame, items[j].seconds);
      }
      if (save.labels) {
        if (!frames_dir_made) {  // only for a video with frames: no empty folder
          std::error_code ec;
          fs::create_directories(frames_dir, ec);
          if (ec) {
            throw Error(ErrorCode::kIo,
                        "cannot create the folder " + frames_dir.string() + ": " + ec.message());
          }
          frames_dir_made = true;
        }
        char name[32];
        std::snprintf(name, sizeof name, "frame_%06lld_seg.png",
                      static_cast<long long>(items[j].index));
        write_image((frames_dir / name).string(),
                    cv::Mat(results[j].height, results[j].width, CV_8U,
                            const_cast<std::uint8_t*>(results[j].labels.data())));
      }
      ++processed;
    }
    batch.clear();
    items.clear();
    report.frames(path, read, std::max(expected, read));
  };
  auto written_outputs = [&] {
    nlohmann::json outputs = nlohmann::json::object();
    if (frames_dir_made) put_path(outputs, "frames_dir", frames_dir.string());
    return outputs;
  };
  try {
    VideoFrame f;
    while (!cancel && reader->next(f)) {
      read = f.index + 1;
      if (f.index % a.stride != 0) continue;
      if (!f.decoded) {
        // No picture: not segmented, black in the overlay (never a repeated picture).
        flush();
        undecodable.add(f.index);
        if (save.overlay && video.is_open()) video.place_black(f.seconds);
        continue;
      }
      if (f.damaged) damaged.add(f.index);
      const cv::Mat& rgb = reader->rgb();
      if (!displayed) displayed = rgb.size();
      if (sizes.size() < 16 && std::find(sizes.begin(), sizes.end(), rgb.size()) == sizes.end()) {
        sizes.push_back(rgb.size());
      }
      batch.push_back(model.prepare(Input::rgb_copy({rgb.data, rgb.rows, rgb.cols, rgb.step})));
      items.push_back({f.index, f.seconds});
      if (batch.size() == static_cast<std::size_t>(a.run.batch_size)) flush();
    }
    if (!cancel) flush();
    if (cancel) {
      video.release();
      std::error_code ec;
      fs::remove(video_tmp, ec);  // no truncated video under the final name
      return;
    }
    const VideoEnd end = reader->end();
    if (processed == 0) {
      std::string why;
      if (end.frames == 0 && end.packets == 0 && !end.truncated) {
        why = path + " has no video frames (its video track is empty)";
      } else if (end.frames == 0) {
        why = "no frame could be read from " + path +
              (end.truncated ? " (" + end.why + ")" : std::string());
      } else {
        why = "none of the " + std::to_string(end.frames) + " frames of " + path +
              " could be decoded" +
              (end.decode_error.empty() ? std::string() : " (FFmpeg: " + end.decode_error + ")");
      }
      throw Error(ErrorCode::kInvalidInput, why);
    }
    nlohmann::json outputs = nlohmann::json::object();
    if (save.overlay && video.is_open()) {
      video.finish(end.duration);  // the last frame lasts to the input's end
      video.release();
      check_written_video(video_tmp, video_out, video.written());
      if (std::rename(video_tmp.c_str(), video_out.c_str()) != 0) {
        throw Error(ErrorCode::kIo,
                    "cannot write " + video_out + ": rename failed (" + std::strerror(errno) + ")");
      }
      put_path(outputs, "overlay_video", video_out);
    }
    if (frames_dir_made) {
      sync_dir(frames_dir.string());
      put_path(outputs, "frames_dir", frames_dir.string());
    }
    nlohmann::json entry = {
        {"frames", processed},       {"frames_read", read},         {"fps", rate},
        {"width", displayed->width}, {"height", displayed->height}, {"outputs", outputs}};
    if (vi.rotation != 0 || vi.mirrored) {
      entry["rotation"] = vi.rotation;
      if (vi.mirrored) entry["mirrored"] = true;
    }
    if (sizes.size() > 1) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& s : sizes) list.push_back({s.width, s.height});
      entry["frame_sizes"] = list;
    }
    if (end.variable_rate) {
      entry["variable_frame_rate"] = true;
      entry["duration_s"] = end.duration;
    }
    if (save.overlay) {
      entry["codec"] = video.codec;
      if (!video.fallback.empty()) entry["codec_fallback"] = video.fallback;
      if (video.left_out() > 0) entry["frames_not_in_overlay"] = video.left_out();
      if (video.times_ignored() > 0) {
        entry["frame_times_ignored"] = video.times_ignored();
        warnings.push_back(std::to_string(video.times_ignored()) +
                           " frame times lie beyond the stream's duration or over " +
                           std::to_string(static_cast<int>(VideoOut::kMaxGapSeconds)) +
                           " s after the frame before (damaged timestamps): those frames follow "
                           "the frame before in the overlay video");
      }
    }
    // A cut file (a copy or download that stopped) decodes up to the cut and then reads as
    // ended; the reader tells it from a healthy variable-rate or trimmed file by the
    // container's index, count or duration (video_reader.hpp).
    if (end.frames_in_container) entry["frames_in_container"] = *end.frames_in_container;
    if (end.truncated) {
      entry["truncated"] = true;
      warnings.push_back(end.why);
    }
    if (!undecodable.r.empty()) {
      entry["frames_not_segmented"] = undecodable.json();
      warnings.push_back(
          "frames " + undecodable.text() + " (" + std::to_string(undecodable.count()) +
          ") could not be decoded" +
          (end.decode_error.empty() ? std::string() : " (FFmpeg: " + end.decode_error + ")") +
          ": they are not segmented" + (save.overlay ? " (black in the overlay video)" : ""));
    }
    if (!damaged.r.empty()) {
      entry["frames_damaged"] = damaged.json();
      warnings.push_back(
          "frames " + damaged.text() + " (" + std::to_string(damaged.count()) +
          ") were decoded with errors that the decoder concealed" +
          (end.decode_error.empty() ? std::string() : " (FFmpeg: " + end.decode_error + ")") +
          "; they are segmented as decoded");
    }
    if (!warnings.empty()) {
      entry["warnings"] = warnings;
      for (const auto& w : warnings) report.warn(path + ": " + w);
    }
    report.ok(path, std::move(entry));
  } catch (...) {
    const Error e = as_error(std::current_exception(), "segmenting the video " + path);
    try {
      video.release();
    } catch (...) {  // the file is removed below either way
    }
    std::error_code ec;
    fs::remove(video_tmp, ec);
    const nlohmann::json extra = {{"frames", processed}, {"frames_read", read}};
    if (e.code() == ErrorCode::kIo) {
      // The label frames written whole stay, listed; the video is not kept.
      report.output_failed(path, e, written_outputs(), extra);
    } else {
      report.failed(path, e, extra);
    }
  }
}

}  // namespace sapiens_seg::cli
