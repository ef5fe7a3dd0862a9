#include "segment.hpp"

#include <unistd.h>

#include <csignal>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>
#include <opencv2/core/utils/logger.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>

#include "cli/files.hpp"
#include "cli/inputs.hpp"
#include "cli/json_paths.hpp"
#include "cli/naming.hpp"
#include "cli/outputs.hpp"
#include "cli/queue.hpp"
#include "cli/stop.hpp"
#include "sapiens_seg/sapiens_seg.hpp"

namespace sapiens_seg::cli {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Fails early (before loading gigabytes) when the output folder cannot be written.
void prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot create output folder " + dir + ": " + ec.message());
  const std::string probe = (fs::path(dir) / ".sapiens-seg-write-test").string();
  write_file(probe, "", 0);
  fs::remove(probe, ec);
}

// Everything that several threads report to: stdout lines, stderr errors, the progress bar, the
// summary, the exit status.
class Reporter {
 public:
  Reporter(std::size_t total, const SegmentArgs& args)
      : total_(total), args_(args), tty_(isatty(fileno(stderr)) != 0 && !args.quiet) {}

  void set_total(std::size_t total) {
    std::lock_guard<std::mutex> lock(mu_);
    total_ = total;
  }

  void ok(const std::string& input, nlohmann::json entry) {
    put_path(entry, "input", input);
    entry["status"] = "ok";
    std::lock_guard<std::mutex> lock(mu_);
    if (args_.json_lines) {
      out(dump_json(entry));
    } else if (!args_.quiet) {
      clear_bar();
      std::string line = plain_text(input) + " -> " + plain_text(first_output(entry)) + " (" +
                         std::to_string(entry.value("width", 0)) + "x" +
                         std::to_string(entry.value("height", 0)) + ")";
      if (entry.contains("warnings")) {
        for (const auto& w : entry["warnings"])
          line += " [warning: " + plain_text(w.get<std::string>()) + "]";
      }
      out(line);
    }
    summary_.push_back(dump_json(entry));
    ++done_;
    draw();
  }

  void failed(const std::string& input, const Error& e) {
    nlohmann::json entry = nlohmann::json::object();
    put_path(entry, "input", input);
    entry["status"] = "error";
    entry["error"] = std::string(to_string(e.code()));
    entry["message"] = display_text(e.what());  // the message names the path too
    std::lock_guard<std::mutex> lock(mu_);
    clear_bar();
    std::fprintf(stderr, "sapiens-seg: error [%s]: %s\n", std::string(to_string(e.code())).c_str(),
                 plain_text(e.what()).c_str());
    if (args_.json_lines) out(dump_json(entry));
    summary_.push_back(dump_json(entry));
    if (status_ == 0) status_ = exit_status(e.code());
    ++done_;
    ++failed_;
    draw();
  }

  void skipped(const std::string& input) {
    nlohmann::json entry = nlohmann::json::object();
    put_path(entry, "input", input);
    entry["status"] = "skipped";
    std::lock_guard<std::mutex> lock(mu_);
    if (args_.json_lines) out(dump_json(entry));
    skipped_.push_back(std::move(entry));
    ++done_;
    draw();
  }

  // A failure of the run itself (not of one input): reported once, sets the exit status.
  void run_failed(const Error& e) {
    std::lock_guard<std::mutex> lock(mu_);
    clear_bar();
    std::fprintf(stderr, "sapiens-seg: error [%s]: %s\n", std::string(to_string(e.code())).c_str(),
                 plain_text(e.what(), /*keep_newlines=*/true).c_str());
    if (status_ == 0) status_ = exit_status(e.code());
  }

  // Progress inside one video, in frames.
  void frames(const std::string& input, std::int64_t done, std::int64_t total) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!tty_) return;
    std::fprintf(stderr, "\r%s: frame %lld/%lld ",
                 plain_text(fs::path(input).filename().string()).c_str(),
                 static_cast<long long>(done), static_cast<long long>(total));
    std::fflush(stderr);
    bar_shown_ = true;
  }

  // A warning that belongs to the run (not to one input); errors only (--quiet) drops it.
  void warn(const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (args_.quiet) return;
    clear_bar();
    std::fprintf(stderr, "sapiens-seg: warning: %s\n", plain_text(message).c_str());
    bar_shown_ = false;
  }

  void finish() {
    std::lock_guard<std::mutex> lock(mu_);
    if (bar_shown_) std::fputc('\n', stderr);
    bar_shown_ = false;
  }

  int status() const { return status_; }
  std::size_t failed_count() const { return failed_; }
  // Entries of the inputs this run segmented or failed, in the order they finished, each as its
  // compact JSON text: a parsed nlohmann::json entry costs ~10x its text (a node per value), and
  // a folder run of millions of images must not grow by kilobytes per image.
  const std::vector<std::string>& summary() const { return summary_; }
  // {"input": ..., "status": "skipped"} of the inputs --skip-existing passed over.
  const nlohmann::json& skipped_entries() const { return skipped_; }

 private:
  // One line on stdout. A reader that has gone (`--json | head -1`) stops the run as a signal
  // does: SIGPIPE is ignored (stop.hpp), so the write fails with EPIPE instead of killing us.
  void out(const std::string& line) {
    if (!std::cout.good()) return;
    std::cout << line << "\n" << std::flush;
    if (!std::cout.good()) request_stop(SIGPIPE);
  }
  static std::string first_output(const nlohmann::json& e) {
    if (!e.contains("outputs")) return "(no outputs selected)";
    for (const OutputKind& k : output_kinds()) {
      if (e["outputs"].contains(k.key)) return e["outputs"][k.key].get<std::string>();
    }
    return "(no outputs selected)";
  }
  void clear_bar() {
    if (bar_shown_) std::fprintf(stderr, "\r%*s\r", 78, "");
  }
  void draw() {
    if (!tty_) return;
    const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
    const double rate = secs > 0 ? static_cast<double>(done_) / secs : 0;
    const double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : 0;
    const int filled = total_ ? static_cast<int>(24 * done_ / total_) : 24;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu inputs%s %5.1f/s ETA %d:%02d ",
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(24 - filled), '-').c_str(), done_, total_,
                 failed_ ? (" (" + std::to_string(failed_) + " failed)").c_str() : "", rate,
                 static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
    std::fflush(stderr);
    bar_shown_ = true;
  }

  std::mutex mu_;
  std::size_t total_, done_ = 0, failed_ = 0;
  const SegmentArgs& args_;
  bool tty_, bar_shown_ = false;
  int status_ = 0;
  std::vector<std::string> summary_;
  nlohmann::json skipped_ = nlohmann::json::array();
  Clock::time_point start_ = Clock::now();
};

struct Job {
  std::string path;
  OutputNames names;
};

// An input after Model::prepare (decoded, resized, normalised) or its error.
struct Decoded {
  const Job* job = nullptr;
  Prepared prepared;
  std::optional<Error> error;
};

struct Segmented {
  const Job* job = nullptr;
  Prepared prepared;  // holds the decoded pixels the overlay is drawn on
  Result result;
};

// Closes the queues and joins the pipeline's threads however run_images is left: a std::thread
// still joinable when it is destroyed calls std::terminate.
class ThreadGroup {
 public:
  explicit ThreadGroup(std::function<void()> close) : close_(std::move(close)) {}
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;
  ~ThreadGroup() { join(); }
  template <typename F>
  void start(F&& body) {
    threads_.emplace_back(std::forward<F>(body));
  }
  void join() noexcept {
    close_();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  std::function<void()> close_;
  std::vector<std::thread> threads_;
};

// Images: Model::prepare (decode, resize, normalise) on `workers` threads -> Model::run on
// batches here -> write on `workers` threads.
// Queues hold at most two batches per stage. Every input is reported exactly once (ok or
// error); no exception leaves a thread body, so nothing can terminate the process.
void run_images(const Model& model, const std::vector<Job>& jobs, const SegmentArgs& a,
                const SaveSet& save, OverlayStyle style, Reporter& report,
                const std::atomic<bool>& cancel) {
  if (jobs.empty()) return;
  const auto batch_size = static_cast<std::size_t>(a.run.batch_size);
  BoundedQueue<Decoded> decoded(2 * batch_size);
  BoundedQueue<Segmented> segmented(2 * batch_size);
  std::atomic<std::size_t> next{0};
  std::atomic<int> live_decoders{a.workers};
  std::atomic<bool> broken{false};  // the pipeline itself failed: nothing new starts
  std::mutex broken_mu;
  std::optional<Error> broken_error;
  const auto reported = std::make_unique<std::atomic<bool>[]>(jobs.size());

  auto failed = [&](const Job* job, const Error& e) {
    if (!reported[static_cast<std::size_t>(job - jobs.data())].exchange(true)) {
      report.failed(job->path, e);
    }
  };
  // Called in a catch block of a pipeline thread: the run stops; unprocessed inputs are
  // reported with this error at the end.
  auto pipeline_failed = [&](const std::string& where) noexcept {
    try {
      const Error e = as_error(std::current_exception(), where);
      std::lock_guard<std::mutex> lock(broken_mu);
      if (!broken_error) broken_error = e;
    } catch (...) {  // no memory left even for the message: the flag still stops the run
    }
    broken = true;
    decoded.close();
    segmented.close();
  };

  ThreadGroup threads([&] {
    decoded.close();
    segmented.close();
  });
  auto decoder = [&] {
    try {
      for (std::size_t i; !cancel && !broken && (i = next++) < jobs.size();) {
        Decoded d;
        d.job = &jobs[i];
        try {
          d.prepared = model.prepare(Input::file(jobs[i].path));
        } catch (...) {
          d.error = as_error(std::current_exception(), "reading " + jobs[i].path);
        }
        if (!decoded.push(std::move(d))) break;
      }
    } catch (...) {
      pipeline_failed("a decoding thread");
    }
    if (--live_decoders == 0) decoded.close();
  };
  auto writer = [&] {
    try {
      while (auto s = segmented.pop()) {
        try {
          nlohmann::json entry =
              write_outputs(s->result, s->prepared.image(), s->job->names, save, style, a.opacity);
          if (!reported[static_cast<std::size_t>(s->job - jobs.data())].exchange(true)) {
            report.ok(s->job->path, std::move(entry));
          }
        } catch (...) {
          failed(s->job,
                 as_error(std::current_exception(), "writing the outputs of " + s->job->path));
        }
      }
    } catch (...) {
      pipeline_failed("a writing thread");
    }
  };
  try {
    for (int w = 0; w < a.workers; ++w) threads.start(decoder);
    for (int w = 0; w < a.workers; ++w) threads.start(writer);
  } catch (...) {
    pipeline_failed("starting the pipeline's threads");
  }

  const SegmentOptions options = save.segment_options();
  try {
    while (!broken) {
      std::vector<Decoded> batch;
      while (batch.size() < batch_size) {
        auto d = decoded.pop();
        if (!d) break;
        if (d->error) {
          failed(d->job, *d->error);  // one bad file never stops the others
          continue;
        }
        batch.push_back(std::move(*d));
      }
      if (batch.empty()) break;
      try {
        std::vector<Prepared> prepared;
        prepared.reserve(batch.size());
        for (const auto& d : batch) prepared.push_back(d.prepared);
        std::vector<Result> results = model.run(prepared, options);
        for (std::size_t j = 0; j < batch.size(); ++j) {
          segmented.push(Segmented{batch[j].job, std::move(prepared[j]), std::move(results[j])});
        }
      } catch (...) {
        // Out of memory for this batch (or any other failure) fails its inputs, not the run.
        const Error e = as_error(std::current_exception(), "segmenting");
        for (const auto& d : batch) failed(d.job, e);
      }
      // Ctrl-C: the batch that was running is written; nothing new starts.
      if (cancel) break;
    }
  } catch (...) {
    pipeline_failed("the inference loop");
  }
  threads.join();
  if (broken_error) {
    report.run_failed(*broken_error);
    if (!cancel) {
      const Error why(broken_error->code(),
                      std::string("not processed: the run stopped: ") + broken_error->what());
      for (const auto& job : jobs) failed(&job, why);
    }
  }
}

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

// The summary.json a previous run left in the output folder: its entries (kept by a resumed
// run), the base name of each input it lists (kept by this run's names), and the names of all
// the files it lists (never taken as inputs, never written for another input).
struct PreviousSummary {
  nlohmann::json images = nlohmann::json::array();
  std::map<std::string, std::string> base_of;                // input -> base
  std::map<std::string, std::vector<std::string>> files_of;  // input -> output file names
  std::set<std::string> files;
};

// An unreadable previous summary is left out with a warning (and replaced when json is saved).
PreviousSummary read_previous_summary(const fs::path& file, Reporter& report) {
  PreviousSummary prev;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return prev;
  try {
    std::ifstream in(file);
    nlohmann::json old = nlohmann::json::parse(in);
    if (!old.is_object() || !old.contains("images") || !old["images"].is_array()) {
      throw std::runtime_error("no \"images\" list");
    }
    prev.images = std::move(old["images"]);
  } catch (const std::exception& e) {
    report.warn("the previous " + file.string() + " cannot be read (" + e.what() +
                "); it is replaced by this run's summary");
    return PreviousSummary{};
  }
  for (const auto& e : prev.images) {
    const std::string input = get_path(e, "input");
    if (input.empty() || !e.contains("outputs") || !e["outputs"].is_object()) continue;
    std::string base;
    // The side-by-side overlay's name (<base> + the input's extension) says least of the base:
    // every other kind is asked first.
    std::vector<const OutputKind*> kinds;
    for (const OutputKind& k : output_kinds()) {
      if (std::string_view(k.key) != "overlay") kinds.push_back(&k);
    }
    for (const OutputKind& k : output_kinds()) {
      if (std::string_view(k.key) == "overlay") kinds.push_back(&k);
    }
    for (const OutputKind* k : kinds) {
      const std::string f = fs::path(get_path(e["outputs"], k->key)).filename().string();
      if (f.empty()) continue;
      prev.files.insert(f);
      prev.files_of[input].push_back(f);
      if (base.empty()) base = base_of_output(k->key, f);
    }
    if (!base.empty()) prev.base_of[input] = base;
  }
  return prev;
}

// --skip-existing resumes a run in the same folder: the entries of the previous summary.json
// stay, those of inputs segmented again are replaced (same place), new ones are appended, and a
// skipped input without a previous entry is listed as "skipped".
nlohmann::json merge_summaries(nlohmann::json previous,
                               const std::vector<std::string>& current_text,
                               const nlohmann::json& skipped) {
  nlohmann::json current = nlohmann::json::array();
  for (const auto& t : current_text) current.push_back(nlohmann::json::parse(t));
  std::map<std::string, const nlohmann::json*> fresh;
  for (const auto& e : current) fresh.emplace(get_path(e, "input"), &e);
  std::set<std::string> placed;
  nlohmann::json merged = nlohmann::json::array();
  for (auto& e : previous) {
    const std::string key = get_path(e, "input");
    if (placed.count(key)) continue;  // one entry per input
    const auto it = fresh.find(key);
    merged.push_back(it != fresh.end() ? *it->second : e);
    placed.insert(key);
  }
  for (const auto& e : current) {
    if (placed.insert(get_path(e, "input")).second) merged.push_back(e);
  }
  for (const auto& e : skipped) {
    if (placed.insert(get_path(e, "input")).second) merged.push_back(e);
  }
  return merged;
}

bool can_write_ext(const std::string& ext) {
  return cv::haveImageWriter("x" + ext);
}

}  // namespace

int run_segment(const SegmentArgs& a, const LoadOptions& load_options) {
  const std::atomic<bool>& cancel = stop_flag();
  const SaveSet save = parse_save(a.save);
  const OverlayStyle style =
      a.overlay_style == "side-by-side" ? OverlayStyle::kSideBySide : OverlayStyle::kBlend;
  const fs::path summary_file = fs::path(a.out_dir) / "summary.json";
  // The counts are known only once the inputs are: the reporter starts with none.
  Reporter report(0, a);
  const PreviousSummary prev = read_previous_summary(summary_file, report);

  InputRules rules;
  const std::string extensions = a.extensions.empty() ? extension_list(image_extensions()) + "," +
                                                            extension_list(video_extensions())
                                                      : a.extensions;
  rules.exts = parse_extensions(extensions);
  rules.recursive = a.recursive;
  rules.out_dir = a.out_dir;
  rules.previous_outputs = prev.files;
  const ExpandedInputs in = expand_inputs(a.inputs, rules);
  if (in.items.empty() && in.problems.empty()) {
    throw Error(ErrorCode::kInvalidInput,
                "no inputs (folders are searched for the extensions " + extensions +
                    "; use --recursive for sub-folders" +
                    (in.excluded ? "; " + std::to_string(in.excluded) +
                                       " files of the output folder are outputs, not inputs"
                                 : std::string()) +
                    ")");
  }
  // A checkpoint must be a regular file: a FIFO would block the load, a folder is not one.
  if (const std::string kind = special_file_kind(a.model); !kind.empty()) {
    throw Error(ErrorCode::kInvalidInput,
                "--model " + a.model + " is " + kind +
                    ", not a checkpoint file (a .pt2 TorchScript archive or a .safetensors file) "
                    "or a card id");
  }
  prepare_out_dir(a.out_dir);
  report.set_total(in.items.size() + in.problems.size());
  for (const auto& note : in.notes) report.warn(note);
  if (in.excluded > 0) {
    report.warn(std::to_string(in.excluded) + " files in the output folder " + a.out_dir +
                " are outputs of sapiens-seg (named in its summary.json, or *_seg.png, "
                "*_overlay.png, *_overlay.mp4, *.tmp<N>): not taken as inputs");
  }
  for (const auto& p : in.problems) report.failed(p.path, Error(p.code, p.message));
  if (in.items.empty()) return report.status();

  // Every output name of the run, decided before anything is written (naming.hpp).
  std::vector<NameRequest> requests;
  std::set<std::string> inputs_here;
  requests.reserve(in.items.size());
  for (const auto& item : in.items) {
    NameRequest r;
    r.path = item.path;
    r.identity = path_identity(item.path);
    r.video = item.video;
    if (const auto it = prev.base_of.find(item.path); it != prev.base_of.end()) {
      r.pinned_base = it->second;
    }
    inputs_here.insert(item.path);
    requests.push_back(std::move(r));
  }
  std::set<std::string> taken = reserved_names(requests, a.out_dir);
  for (const auto& [input, files] : prev.files_of) {
    if (!inputs_here.count(input)) taken.insert(files.begin(), files.end());
  }
  const std::vector<std::string> bases = assign_bases(requests, taken, style, can_write_ext);
  {
    std::vector<std::string> paths;
    paths.reserve(in.items.size());
    for (const auto& item : in.items) paths.push_back(item.path);
    protect_inputs(paths);
  }

  const Model model = load(a.model, load_options);

  std::vector<Job> jobs;
  std::vector<std::pair<std::string, OutputNames>> videos;
  for (std::size_t i = 0; i < in.items.size(); ++i) {
    const auto& item = in.items[i];
    const std::string name = fs::path(item.path).filename().string();
    OutputNames names = output_names(a.out_dir, bases[i], name, item.video, style, can_write_ext);
    if (item.video) {
      videos.emplace_back(item.path, std::move(names));
      continue;
    }
    Job job{item.path, std::move(names)};
    if (a.skip_existing && outputs_exist(job.names, save)) {
      report.skipped(item.path);
      continue;
    }
    jobs.push_back(std::move(job));
  }
  run_images(model, jobs, a, save, style, report, cancel);
  for (const auto& [path, names] : videos) {
    if (cancel) break;
    run_video(model, path, names, a, save, style, report, cancel);
  }
  report.finish();

  if (save.json) {
    nlohmann::json summary = {{"model", model.info().id},
                              {"sha256", model.info().sha256},
                              {"version", version()},
                              {"backend",
                               {{"mode", model.info().backend.mode},
                                {"device", model.info().backend.device},
                                {"dtype", model.info().backend.dtype}}},
                              {"cancelled", cancel.load()}};
    if (cancel) summary["cancelled_by"] = stop_reason();
    if (in.excluded > 0) summary["outputs_not_taken_as_inputs"] = in.excluded;
    put_path(summary, "checkpoint", model.info().path);
    // The entries are written from their texts, one line each, so the file costs no parsed
    // tree (a resumed run merges with the previous file's entries, and parses them).
    std::vector<std::string> merged;
    if (a.skip_existing) {
      for (const auto& e :
           merge_summaries(prev.images, report.summary(), report.skipped_entries())) {
        merged.push_back(dump_json(e));
      }
    }
    const std::vector<std::string>& images = a.skip_existing ? merged : report.summary();
    std::string text = dump_json(summary, 2);
    text.erase(text.find_last_of('}'));  // reopen the object for the "images" list
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    text += ",\n  \"images\": [";
    for (std::size_t i = 0; i < images.size(); ++i) {
      text += i ? ",\n    " : "\n    ";
      text += images[i];
    }
    text += images.empty() ? "]\n}\n" : "\n  ]\n}\n";
    write_file(summary_file.string(), text.data(), text.size());
  }
  if (cancel) {
    const int sig = stop_signal() ? stop_signal() : SIGINT;
    std::fprintf(stderr,
                 "sapiens-seg: interrupted by %s; finished outputs are complete, run again with "
                 "--skip-existing to continue\n",
                 stop_reason().c_str());
    return 128 + sig;
  }
  if (report.failed_count() > 0 && !a.quiet) {
    std::fprintf(stderr, "sapiens-seg: %zu of %zu inputs failed\n", report.failed_count(),
                 in.items.size() + in.problems.size());
  }
  return report.status();
}

}  // namespace sapiens_seg::cli
