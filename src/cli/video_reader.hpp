// The CLI's video reader, on FFmpeg's libraries: libavformat opens the container and picks its
// best video stream, libavcodec decodes every frame, libswscale converts each one at its own size
// to 8-bit RGB, and the stream's display matrix (libavutil) turns and mirrors it as players show
// it. Whatever the container (MP4/MOV/M4V/3GP, Matroska/WebM, AVI, MPEG-TS, ...), the frames come
// out in presentation order with their presentation times, and the reader tells a healthy
// variable-frame-rate or edit-list-trimmed file from a damaged or cut one.
//
// Bounded: it holds one packet, one decoded frame, the codec's own reference frames, one
// conversion context and the two RGB pictures of the current frame; nothing is queued per
// frame except the numbers of packets that failed to decode while the decoder reorders (a few).
// Every FFmpeg failure is a sapiens_seg::Error with a code; nothing aborts. The cancel flag
// interrupts FFmpeg's reads (a slow or stalled file system) as well as the frame loop.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace sapiens_seg::cli {

// What the file says of its video stream, known once it is open.
struct VideoStreamInfo {
  std::string container;      // FFmpeg's demuxer: "mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", ...
  std::string codec;          // "h264", "hevc", "vp9", ...
  int width = 0, height = 0;  // the stored frame size the stream's header gives (0 when none)
  // The display matrix as applied to every frame: a left-right mirror first (`mirrored`), then
  // a clockwise turn of 0, 90, 180 or 270 degrees. A matrix that is no quarter turn
  // (`odd_matrix`, with its angle) is not applied.
  int rotation = 0;
  bool mirrored = false;
  bool odd_matrix = false;
  double odd_angle = 0;
  // Frames per second for laying the frames on a constant-rate timeline: the stream's frame
  // rate; for a variable rate, its base rate (FFmpeg's r_frame_rate) up to 60 frames a second.
  double rate = 25;
  // The frames the container says it holds, where it says so before they are read: its index
  // (MP4/MOV: the samples an edit list shows) or its header (AVI). nullopt elsewhere.
  std::optional<std::int64_t> frames_listed;
  // The stream's duration as the container's header gives it, in seconds, where it does.
  std::optional<double> header_duration;
};

// One frame, in presentation order.
struct VideoFrame {
  std::int64_t index = 0;         // 0, 1, 2, ... in presentation order
  std::optional<double> seconds;  // presentation time after the first frame's (none: unknown)
  bool decoded = false;           // false: its data could not be decoded (no picture)
  bool damaged = false;           // decoded, but the decoder concealed errors in it
  int width = 0, height = 0;      // the decoded picture's size as stored (before any turn)
};

// How the stream ended, known once next() has returned false (not cancelled).
struct VideoEnd {
  std::int64_t frames = 0;   // frames read, decoded or not
  std::int64_t packets = 0;  // packets of the stream read (an edit list's hidden ones left out)
  std::int64_t not_decoded = 0, damaged = 0;
  std::string decode_error;  // the decoder's first complaint, for messages
  // The frames the container holds: its index or header count, or, for containers without one,
  // the frames read from a file that was read to its end. nullopt when unknown (a cut file
  // without an index or count).
  std::optional<std::int64_t> frames_in_container;
  bool truncated = false;      // the stream ends before its index or header says
  std::string why;             // the reason in words ("" when not truncated)
  double duration = 0;         // seconds, first frame to the end of the last one
  bool variable_rate = false;  // frame steps differ beyond rounding
};

class VideoReader {
 public:
  // Opens `path` (a local file; FFmpeg's network protocols and playlists are refused) and its
  // decoder. Error(kInvalidInput) for a file that is no video or has no video stream,
  // kIo for one that cannot be read, kOutOfMemory, ...
  VideoReader(const std::string& path, const std::atomic<bool>& cancel);
  ~VideoReader();
  VideoReader(const VideoReader&) = delete;
  VideoReader& operator=(const VideoReader&) = delete;

  const VideoStreamInfo& info() const;

  // The next frame; false at the end of the stream (see end()) or when `cancel` is set.
  bool next(VideoFrame& frame);

  // The current frame's picture as players show it (turned and mirrored), 8-bit RGB, converted
  // at the frame's own size; valid until the next call of next(). Error(kInvalidInput) for a
  // frame that was not decoded or whose pixel format cannot be converted.
  const cv::Mat& rgb();

  VideoEnd end() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The frames of a video file that FFmpeg decodes (no conversion), for checking a written file;
// -1 when it cannot be opened.
std::int64_t count_decodable_frames(const std::string& path);

}  // namespace sapiens_seg::cli
