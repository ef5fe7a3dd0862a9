// libFuzzer target for the CLI's video reader (cli::VideoReader on FFmpeg's libraries). FFmpeg's
// demuxers and decoders are fuzzed upstream; what this target checks is the project's code
// around them on whatever they hand back from hostile bytes: the display matrix, frames whose
// size changes mid-stream, pixel-format conversion, the end-of-stream judgement and the mapping
// of FFmpeg's failures to sapiens_seg::Error codes. Any input either opens and yields frames
// that satisfy the invariants below, or throws sapiens_seg::Error with one of the reader's codes;
// anything else (a crash, another exception, a sanitizer report, a broken invariant) is a bug.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <opencv2/core.hpp>

extern "C" {
#include <libavutil/log.h>
}

#include "cli/video_reader.hpp"
#include "sapiens_seg/error.hpp"

namespace {

// Enough frames to pass a size change, the decoder's reordering delay and the pending-failure
// queue (32) of the reader; more only slows each execution.
constexpr int kMaxFrames = 64;

// The reader opens paths, not memory: each input goes to one file of this process (libFuzzer's
// -fork/-jobs workers are processes, so the pid keeps them apart).
std::string g_path;

bool reader_code(sapiens_seg::ErrorCode c) {
  using sapiens_seg::ErrorCode;
  return c == ErrorCode::kInvalidInput || c == ErrorCode::kIo || c == ErrorCode::kOutOfMemory ||
         c == ErrorCode::kInternal;
}

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_video: %s\n", what);
  std::abort();
}

void check_frame(sapiens_seg::cli::VideoReader& reader, const sapiens_seg::cli::VideoFrame& f) {
  using namespace sapiens_seg;
  if (!f.decoded) {
    // A frame without a picture must say so, never hand out the previous picture.
    try {
      (void)reader.rgb();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidInput) finding("rgb() of an undecoded frame: wrong code");
      return;
    }
    finding("rgb() of an undecoded frame returned a picture");
  }
  const cv::Mat* rgb = nullptr;
  try {
    rgb = &reader.rgb();
  } catch (const Error& e) {
    if (!reader_code(e.code())) finding("rgb(): an error code the reader does not give");
    return;
  }
  if (rgb->empty() || rgb->type() != CV_8UC3) finding("rgb() is not a non-empty 8-bit RGB image");
  const int turn = reader.info().rotation;
  const bool quarter = turn == 90 || turn == 270;
  const int w = quarter ? f.height : f.width, h = quarter ? f.width : f.height;
  if (rgb->cols != w || rgb->rows != h) finding("rgb()'s size is not the frame's, turned");
}

void check_info(const sapiens_seg::cli::VideoStreamInfo& info) {
  if (info.rotation != 0 && info.rotation != 90 && info.rotation != 180 && info.rotation != 270) {
    finding("rotation is not a quarter turn");
  }
  if (info.odd_matrix && (info.rotation != 0 || info.mirrored)) {
    finding("an odd display matrix was applied");
  }
  // The rate lays frames on the output's timeline and divides durations: it must be usable.
  if (!(info.rate > 0) || !std::isfinite(info.rate)) {
    finding("the frame rate is not a positive number");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cv::setNumThreads(0);  // one thread: reproducible, and no pool to start per run
  g_path = (std::filesystem::temp_directory_path() /
            ("sapiens_seg_fuzz_video_" + std::to_string(::getpid()) + ".bin"))
               .string();
  // The reader's log callback already keeps every line of its own contexts and its thread for
  // its messages (without this line the seeds and a 20 s run printed nothing); a line of a
  // context it does not own, on another thread, would reach FFmpeg's printer, which this level
  // silences. FFmpeg calls the callback at any level, so the reader's messages are unchanged.
  av_log_set_level(AV_LOG_QUIET);
  std::atexit([] { std::remove(g_path.c_str()); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sapiens_seg;
  using namespace sapiens_seg::cli;
  {
    std::FILE* f = std::fopen(g_path.c_str(), "wb");
    if (f == nullptr) finding("cannot write the input's temporary file");
    const bool written = std::fwrite(data, 1, size, f) == size;
    if (std::fclose(f) != 0 || !written) finding("cannot write the input's temporary file");
  }
  static const std::atomic<bool> never{false};
  try {
    VideoReader reader(g_path, never);
    // The reader reads through the descriptor it holds: gone from /tmp now, the file is not
    // left behind when a later frame crashes the process.
    std::remove(g_path.c_str());
    check_info(reader.info());
    VideoFrame f;
    std::int64_t count = 0, undecoded = 0;
    bool ended = false;
    while (count < kMaxFrames) {
      if (!reader.next(f)) {
        ended = true;
        break;
      }
      if (f.index != count) finding("frame indices do not go up by one");
      ++count;
      if (!f.decoded) ++undecoded;
      check_frame(reader, f);
    }
    const VideoEnd e = reader.end();
    if (e.frames != count || e.not_decoded != undecoded) finding("end() miscounts the frames");
    if (e.not_decoded > e.frames || e.damaged > e.frames - e.not_decoded) {
      finding("end() counts more undecoded or damaged frames than frames");
    }
    if (!(e.duration >= 0) || !std::isfinite(e.duration)) finding("end()'s duration is unusable");
    if (ended) {
      if (e.truncated == e.why.empty()) finding("end(): truncated without a reason, or reverse");
      if (!e.truncated && !e.frames_in_container) finding("end(): a whole stream without a count");
    }
  } catch (const Error& e) {
    if (!reader_code(e.code())) finding("an error code the reader does not give");
  }
  std::remove(g_path.c_str());
  return 0;
}
