#include "cli/video.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>
#include <opencv2/core/utils/logger.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>

#include "cli/files.hpp"
#include "cli/json_paths.hpp"
#include "cli/mkv_meta.hpp"
#include "cli/mp4_meta.hpp"
#include "cli/stop.hpp"

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

  // `frame` at `seconds` after the first frame (nullopt: no usable time; then right after the
  // previous frame).
  void place(const cv::Mat& frame, std::optional<double> seconds) {
    std::int64_t slot = written_;
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
    cv::Mat roi = out(cv::Rect((frame_.width - inner.width) / 2,
                               (frame_.height - inner.height) / 2, inner.width, inner.height));
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
  std::optional<double> last_seconds_;
};

// OpenCV's VideoWriter reports no write error (a full disk, a file size limit): the finished
// file is flushed to disk and read back, and must hold every frame written, or it is not kept.
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
  std::int64_t n = 0;
  {
    const QuietOpenCV quiet;
    cv::VideoCapture check(tmp, cv::CAP_FFMPEG);
    while (check.isOpened() && n <= frames && check.grab()) ++n;
  }
  if (n != frames) {
    throw Error(ErrorCode::kIo,
                "cannot write " + final_path + ": the finished video holds " + std::to_string(n) +
                    " of the " + std::to_string(frames) +
                    " frames written (the file system is full, or a file size limit was reached; "
                    "the video encoder reports no write error); it is not kept");
  }
}

// A stored frame as players show it (mp4::Transform: a horizontal mirror, then a turn).
cv::Mat as_displayed(const cv::Mat& stored, const mp4::Transform& t) {
  if (t.identity()) return stored;
  cv::Mat m = stored;
  if (t.mirrored()) cv::flip(stored, m, 1);
  cv::Mat out;
  switch (t.clockwise_degrees()) {
    case 90:
      cv::rotate(m, out, cv::ROTATE_90_CLOCKWISE);
      return out;
    case 180:
      cv::rotate(m, out, cv::ROTATE_180);
      return out;
    case 270:
      cv::rotate(m, out, cv::ROTATE_90_COUNTERCLOCKWISE);
      return out;
    default:
      return m.data == stored.data ? stored.clone() : m;
  }
}

// The container's facts that the frames are checked and timed against (mp4_meta.hpp,
// mkv_meta.hpp), for MP4/MOV and Matroska/WebM; other containers (AVI, ...) get none, and
// OpenCV's counts and times are used.
struct Timeline {
  bool known = false;
  std::vector<double> times;          // presented frames, seconds after the first
  std::vector<mp4::Size> sizes;       // their decoded picture sizes (0x0: unknown)
  double duration = 0;                // seconds, first frame to the end of the last
  double rate = 0;                    // frames per second (see below)
  bool variable = false;              // frame durations differ beyond rounding
  std::size_t complete = 0, samples = 0;  // samples whose data is in the file, of all
};

Timeline timeline_of(const mp4::Info& info) {
  Timeline t;
  if (!info.ok || info.timescale == 0) return t;
  const auto shown = mp4::presented(info);
  t.samples = info.samples.size();
  t.complete = mp4::complete_samples(info);
  if (shown.empty()) return t;  // nothing to check against: OpenCV's counts are used
  const double ts = info.timescale;
  const std::int64_t first = shown.front()->pts;
  double min_step = 0, max_step = 0;
  for (std::size_t i = 0; i < shown.size(); ++i) {
    t.times.push_back(static_cast<double>(shown[i]->pts - first) / ts);
    t.sizes.push_back(shown[i]->picture);
    if (i > 0) {
      const double step = t.times[i] - t.times[i - 1];
      if (step > 0) {
        min_step = min_step == 0 ? step : std::min(min_step, step);
        max_step = std::max(max_step, step);
      }
    }
  }
  std::int64_t end = shown.back()->pts + shown.back()->duration;
  if (info.edit_end) end = std::min(end, *info.edit_end);
  t.duration = std::max(static_cast<double>(end - first) / ts, t.times.back());
  // Constant rate: the frames over the duration. Variable: the fastest step (up to 60 frames a
  // second), so that no frame has to share a slot of the overlay video with another.
  t.variable = min_step > 0 && max_step > 1.5 * min_step;
  if (t.variable) {
    t.rate = std::clamp(1.0 / min_step, shown.size() / std::max(t.duration, 1e-3), 60.0);
    // Millisecond timestamps (Matroska) make 30 fps steps of 33 ms: the common rate it is.
    for (const double common : {24000.0 / 1001, 24.0, 25.0, 30000.0 / 1001, 30.0, 50.0,
                                60000.0 / 1001, 60.0}) {
      if (std::abs(t.rate - common) < 0.015 * common) {
        t.rate = common;
        break;
      }
    }
  } else if (t.duration > 0) {
    t.rate = shown.size() / t.duration;
  }
  t.rate = std::round(t.rate * 1000) / 1000;
  t.known = t.rate > 0;
  return t;
}

// Which presented frame was decoded at `seconds` after the first (nearest time within half a
// frame), or nullopt.
std::optional<std::size_t> frame_at(const Timeline& t, double seconds) {
  if (!t.known || t.times.empty()) return std::nullopt;
  const auto it = std::lower_bound(t.times.begin(), t.times.end(), seconds);
  std::optional<std::size_t> best;
  double best_d = 0;
  for (auto c : {it, it == t.times.begin() ? it : it - 1}) {
    if (c == t.times.end()) continue;
    const double d = std::abs(*c - seconds);
    if (!best || d < best_d) {
      best = static_cast<std::size_t>(c - t.times.begin());
      best_d = d;
    }
  }
  const double tolerance = t.rate > 0 ? 0.5 / t.rate : 0.02;
  return best && best_d <= tolerance ? best : std::nullopt;
}

std::string size_text(int w, int h) {
  return std::to_string(w) + "x" + std::to_string(h);
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
};

}  // namespace

// Videos: frames in order, turned as players show them, batched, written to an overlay video
// (H.264 or mp4v in .mp4, see VideoOut; the input's frame rate divided by the stride, the
// input's duration, the displayed frame size) and/or one label PNG per processed frame.
void run_video(const Model& model, const std::string& path, const OutputNames& names,
               const SegmentArgs& a, const SaveSet& save, OverlayStyle style, Reporter& report,
               const std::atomic<bool>& cancel) {
  mp4::Info info = mp4::read_info(path);
  if (info.container.empty()) info = mkv::read_info(path);
  const Timeline timeline = timeline_of(info);
  cv::VideoCapture cap;
  {
    const QuietOpenCV quiet;
    if (!cap.open(path, cv::CAP_FFMPEG)) cap.open(path);
  }
  const bool empty_track = info.ok && mp4::presented(info).empty();
  if (!cap.isOpened()) {
    std::string why = "cannot open video " + path;
    if (empty_track) {
      why = path + " has no video frames (its video track is empty)";
    } else if (!info.container.empty() && !info.problem.empty()) {
      why += ": " + info.problem +
             " (a copy or download that stopped early, or a recording that was not finished)";
    }
    report.failed(path, Error(ErrorCode::kInvalidInput, why));
    return;
  }
  // The frames as stored: the turn is ours, from the file's own display matrix (OpenCV's
  // FFmpeg capture turns 90/270-degree videos the wrong way in some releases).
  cap.set(cv::CAP_PROP_ORIENTATION_AUTO, 0);
  std::vector<std::string> warnings;
  mp4::Transform turn = info.ok && info.iso ? info.display : mp4::Transform{};
  if (info.ok && info.display.exotic) {
    warnings.push_back("its display matrix is not a quarter turn or mirror; frames are "
                       "segmented as stored");
  }
  if (!turn.identity() && cap.get(cv::CAP_PROP_ORIENTATION_AUTO) != 0) {
    report.failed(path, Error(ErrorCode::kInternal,
                              "cannot read the frames of " + path +
                                  " unturned: this OpenCV (" + CV_VERSION +
                                  ") keeps turning them itself, possibly the wrong way"));
    return;
  }
  if (!info.iso && cap.get(cv::CAP_PROP_ORIENTATION_META) != 0) {
    warnings.push_back("its container says the picture is turned (" +
                       std::to_string(static_cast<int>(cap.get(cv::CAP_PROP_ORIENTATION_META))) +
                       " degrees, as OpenCV reads it); only MP4/MOV display matrices are "
                       "applied, so frames are segmented as stored");
  }
  if (!info.container.empty() && !info.ok && !info.problem.empty()) {
    warnings.push_back("its " + info.container + " index could not be read (" + info.problem +
                       "); frames are counted and timed as OpenCV gives them");
  }
  const double opencv_fps = cap.get(cv::CAP_PROP_FPS);
  const double rate = timeline.known && timeline.rate > 0 ? timeline.rate
                      : opencv_fps > 0 && opencv_fps <= 1000 ? opencv_fps
                                                             : 25.0;
  const auto opencv_count = static_cast<std::int64_t>(cap.get(cv::CAP_PROP_FRAME_COUNT));
  const std::int64_t total =
      timeline.known ? static_cast<std::int64_t>(timeline.times.size()) : opencv_count;
  const std::string& video_out = names.overlay_video;
  const std::string& video_tmp = names.overlay_video_partial;
  const fs::path frames_dir = names.frames_dir;
  VideoOut video;
  // A second signal (stop.hpp) removes the unfinished video before the process ends.
  const TempFileGuard partial_guard(video_tmp);
  std::int64_t read = 0, processed = 0;
  bool frames_dir_made = false;
  std::optional<double> first_time, last_time;
  std::optional<std::size_t> matched;  // the container's frame last matched (MP4/MOV)
  std::optional<cv::Size> displayed;
  Ranges undecodable;
  std::vector<std::string> size_notes;
  struct Item {
    std::int64_t index;
    std::optional<double> seconds;
  };
  std::vector<Prepared> batch;
  std::vector<Item> items;
  auto overlay_open = [&](cv::Size size) {
    if (video.is_open()) return;
    video.open(video_tmp, a.codec, rate / a.stride, size);
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
    report.frames(path, read, total);
  };
  auto written_outputs = [&] {
    nlohmann::json outputs = nlohmann::json::object();
    if (frames_dir_made) put_path(outputs, "frames_dir", frames_dir.string());
    return outputs;
  };
  try {
    cv::Mat frame, rgb;
    cv::Size stored_size;
    while (!cancel && cap.read(frame)) {
      const std::int64_t index = read++;
      // The frame's time after the first, from its timestamp (nullopt when the backend gives
      // none that moves on: OpenCV 4.6 gives 0 for the frames the decoder hands over at the
      // end of the stream).
      std::optional<double> seconds;
      const double ms = cap.get(cv::CAP_PROP_POS_MSEC);
      if (!first_time) first_time = ms;
      const double rel = (ms - *first_time) / 1000.0;
      if (index == 0 || (rel > 0 && (!last_time || rel > *last_time))) seconds = rel;
      // MP4/MOV: which of the frames the container shows this is (by its time; without one,
      // the one after the previous), its exact time and its picture size.
      std::optional<mp4::Size> want;
      if (timeline.known && !timeline.times.empty()) {
        std::optional<std::size_t> k = seconds ? frame_at(timeline, *seconds) : std::nullopt;
        if (!k && !seconds) {
          const std::size_t next = matched ? *matched + 1 : 0;
          if (next < timeline.times.size()) k = next;
        }
        if (k) {
          matched = k;
          seconds = timeline.times[*k];
          want = timeline.sizes[*k];
        }
      }
      if (seconds) last_time = seconds;
      if (index == 0) stored_size = frame.size();
      if (index % a.stride != 0) continue;
      // OpenCV converts every frame at the first frame's size, so a frame of another size
      // comes out stale or scrambled: it is not segmented, and said so, rather than labelled
      // as a picture it is not.
      if (want && want->width > 0 && (want->width != frame.cols || want->height != frame.rows)) {
        flush();
        if (undecodable.r.empty() || undecodable.r.back().second + 1 != index) {
          size_notes.push_back(size_text(want->width, want->height));
        }
        undecodable.add(index);
        if (save.overlay && video.is_open()) video.place_black(seconds);
        continue;
      }
      const cv::Mat shown = as_displayed(frame, turn);
      if (!displayed) displayed = shown.size();
      cv::cvtColor(shown, rgb, cv::COLOR_BGR2RGB);
      batch.push_back(model.prepare(Input::rgb_copy({rgb.data, rgb.rows, rgb.cols, rgb.step})));
      items.push_back({index, seconds});
      if (batch.size() == static_cast<std::size_t>(a.run.batch_size)) flush();
    }
    if (!cancel) flush();
    if (cancel) {
      video.release();
      std::error_code ec;
      fs::remove(video_tmp, ec);  // no truncated video under the final name
      return;
    }
    if (processed == 0 && undecodable.r.empty()) {
      throw Error(ErrorCode::kInvalidInput,
                  empty_track ? path + " has no video frames (its video track is empty)"
                              : "no frame could be read from " + path +
                                    (info.cut ? " (the file is cut short)" : ""));
    }
    nlohmann::json outputs = nlohmann::json::object();
    if (save.overlay && video.is_open()) {
      // The last frame lasts to the input's end.
      const double end = timeline.known ? timeline.duration
                                        : last_time.value_or(0) + 1.0 / rate;
      video.finish(end);
      video.release();
      check_written_video(video_tmp, video_out, video.written());
      if (std::rename(video_tmp.c_str(), video_out.c_str()) != 0) {
        throw Error(ErrorCode::kIo, "cannot write " + video_out + ": rename failed (" +
                                        std::strerror(errno) + ")");
      }
      put_path(outputs, "overlay_video", video_out);
    }
    if (frames_dir_made) {
      sync_dir(frames_dir.string());
      put_path(outputs, "frames_dir", frames_dir.string());
    }
    nlohmann::json entry = {{"frames", processed},
                            {"frames_read", read},
                            {"fps", rate},
                            {"width", displayed ? displayed->width : stored_size.width},
                            {"height", displayed ? displayed->height : stored_size.height},
                            {"outputs", outputs}};
    if (!turn.identity()) {
      entry["rotation"] = turn.clockwise_degrees();
      if (turn.mirrored()) entry["mirrored"] = true;
    }
    if (timeline.variable) {
      entry["variable_frame_rate"] = true;
      entry["duration_s"] = timeline.duration;
    }
    if (save.overlay) {
      entry["codec"] = video.codec;
      if (!video.fallback.empty()) entry["codec_fallback"] = video.fallback;
      if (video.left_out() > 0) entry["frames_not_in_overlay"] = video.left_out();
    }
    if (!undecodable.r.empty()) {
      std::string sizes;
      for (const auto& s : size_notes) {
        if (sizes.find(s) == std::string::npos) sizes += (sizes.empty() ? "" : ", ") + s;
      }
      std::string list;
      for (const auto& [f, l] : undecodable.r) {
        list += (list.empty() ? "" : ", ") + std::to_string(f) +
                (l > f ? "-" + std::to_string(l) : std::string());
      }
      entry["frames_not_segmented"] = undecodable.json();
      warnings.push_back("frames " + list + " (" + std::to_string(undecodable.count()) +
                         ") have another size (" + sizes + ") than the stream's first frame (" +
                         size_text(stored_size.width, stored_size.height) +
                         "), which this OpenCV (" + CV_VERSION +
                         ") cannot decode: they are not segmented" +
                         (save.overlay ? " (black in the overlay video)" : ""));
    }
    // A cut file (a copy or download that stopped) decodes up to the cut and then reads as
    // ended. MP4/MOV: the index says how many frames are shown (an edit list's hidden frames
    // left out, a variable frame rate counted as it is) and whether their data is all in the
    // file. Other containers: only FFmpeg's frame count (given, or estimated from the
    // duration) and the last frame's time tell.
    bool truncated = false;
    std::string why;
    if (timeline.known) {
      truncated = read < total;
      if (info.cut) {
        char at[96] = "inside a cluster";
        if (info.header_end && info.timescale > 0 && !timeline.times.empty()) {
          std::snprintf(at, sizeof at, "at %.2f s of the %.2f s its header gives",
                        timeline.times.back(),
                        static_cast<double>(*info.header_end) / info.timescale);
        }
        why = std::string("truncated: the file ends ") + at + "; " + std::to_string(read) +
              " frames could be read";
        truncated = true;
      } else if (timeline.complete < timeline.samples) {
        why = "truncated: the file ends inside the data of frame " +
              std::to_string(timeline.complete + 1) + " of " + std::to_string(timeline.samples) +
              "; only " + std::to_string(read) + " of the " + std::to_string(total) +
              " frames the container lists could be read";
        truncated = true;
      } else if (truncated) {
        why = "truncated or damaged: only " + std::to_string(read) + " of the " +
              std::to_string(total) + " frames the container lists could be decoded";
      }
    } else if (total > 0 && read < total) {
      const double expected_end = static_cast<double>(total) / rate;
      truncated = !last_time || *last_time + 1.5 / rate < expected_end;
      if (truncated) {
        why = "truncated or damaged: only " + std::to_string(read) + " of the " +
              std::to_string(total) + " frames the container lists could be read";
      }
    }
    // The container's count where it is one (MP4/MOV), or where a cut is reported; FFmpeg's
    // estimate for other containers (duration x rate) is no count for a variable rate.
    if (timeline.known || truncated) entry["frames_in_container"] = total;
    if (truncated) {
      entry["truncated"] = true;
      warnings.push_back(why);
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
