#include "cli/video_reader.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <type_traits>
#include <utility>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avutil.h>
#include <libavutil/dict.h>
#include <libavutil/display.h>
#include <libavutil/error.h>
#include <libavutil/frame.h>
#include <libavutil/log.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include "sapiens_seg/error.hpp"

// The FFmpeg releases this file is written for: 5.0 (Debian 12 has 5.1) to 7.x. Where the API
// moved, both spellings are here, chosen by the libraries' version macros.
#if LIBAVFORMAT_VERSION_MAJOR < 59 || LIBAVCODEC_VERSION_MAJOR < 59
#error "the video reader needs FFmpeg 5.0 or newer (libavformat 59, libavcodec 59)"
#endif
// FFmpeg 6.1 (libavcodec 60.31) keeps a stream's display matrix in its codec parameters' coded
// side data; before, in the stream's own side data (removed in 7.0).
#define SAPIENS_SEG_CODECPAR_SIDE_DATA (LIBAVCODEC_VERSION_INT >= AV_VERSION_INT(60, 31, 100))
// libavutil 57.30 (FFmpeg 6.0) named a frame's duration AVFrame.duration (pkt_duration before,
// removed in 7.0).
#define SAPIENS_SEG_FRAME_DURATION (LIBAVUTIL_VERSION_INT >= AV_VERSION_INT(57, 30, 100))

namespace sapiens_seg::cli {
namespace {

// The demuxers a video file is read with. Playlists and reference files (HLS, DASH, concat,
// ...) that would open other files or URLs are not among them, and only the local file
// protocol is allowed: a file named .mp4 that holds a playlist is refused, not followed.
constexpr const char* kDemuxers =
    "mov,matroska,webm,avi,mpegts,mpeg,mpegvideo,flv,asf,ogg,nut,mxf,ivf,h264,hevc,m4v,obu,dv,"
    "yuv4mpegpipe,rm,wtv,gif,apng";

// Pixels of the largest frame converted: the library's own limit for images (2^28).
constexpr std::int64_t kMaxPixels = std::int64_t{1} << 28;

// The frame rates taken from a stream's header. Under one frame in about 17 minutes is no
// video's, and rounded to thousandths for the reports such a rate can be 0, which durations and
// the output's timeline divide by; over 1000 a second is no camera's.
constexpr double kMinRate = 0.001, kMaxRate = 1000;

// Packets that failed to decode wait (by presentation time) for the decoder's reordering to
// show where they fall; at most this many are held, then the oldest is placed at once.
constexpr std::size_t kMaxPendingFailures = 32;

std::string av_text(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  if (av_strerror(err, buf, sizeof buf) < 0) {
    return "FFmpeg error " + std::to_string(err);
  }
  return buf;
}

ErrorCode code_of(int err) {
  if (err == AVERROR(ENOMEM)) return ErrorCode::kOutOfMemory;
  if (err == AVERROR(EIO) || err == AVERROR(EACCES) || err == AVERROR(EPERM) ||
      err == AVERROR(EISDIR) || err == AVERROR(ENOENT)) {
    return ErrorCode::kIo;
  }
  return ErrorCode::kInvalidInput;
}

// ---- FFmpeg's log ----------------------------------------------------------------------------
// FFmpeg says why something failed in its log, not in its return codes ("moov atom not found").
// A reader collects the lines its own contexts (and its thread) log, to say what failed in its
// messages, instead of letting them run onto stderr. Lines of other users of FFmpeg in the
// process (OpenCV's video writer) go to FFmpeg's own printer, errors only, as OpenCV sets it.

class LogLines {
 public:
  void add(int level, std::string line) {
    while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
    if (line.empty()) return;
    const std::lock_guard<std::mutex> lock(mu_);
    if (level <= AV_LOG_ERROR && first_error_.empty()) first_error_ = line;
    lines_.push_back(std::move(line));
    if (lines_.size() > 8) lines_.pop_front();
  }
  std::string first_error() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }
  bool contains(const char* text) const {
    const std::lock_guard<std::mutex> lock(mu_);
    return std::any_of(lines_.begin(), lines_.end(),
                       [&](const std::string& l) { return l.find(text) != std::string::npos; });
  }
  std::string last() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return lines_.empty() ? std::string() : lines_.back();
  }
  void clear() {
    const std::lock_guard<std::mutex> lock(mu_);
    lines_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::deque<std::string> lines_;
  std::string first_error_;
};

std::mutex g_log_mu;
std::vector<std::pair<const void*, LogLines*>> g_log_owners;  // FFmpeg context -> its reader
thread_local LogLines* t_log = nullptr;                       // the reader working here

void log_callback(void* avcl, int level, const char* fmt, va_list vl) {
  LogLines* sink = nullptr;
  if (avcl != nullptr) {
    const std::lock_guard<std::mutex> lock(g_log_mu);
    for (const auto& [ctx, lines] : g_log_owners) {
      if (ctx == avcl) sink = lines;
    }
  }
  if (sink == nullptr) sink = t_log;
  if (sink == nullptr) {
    if (level <= AV_LOG_ERROR) av_log_default_callback(avcl, level, fmt, vl);
    return;
  }
  if (level > AV_LOG_WARNING) return;
  char line[1024];
  int print_prefix = 0;
  va_list copy;
  va_copy(copy, vl);
  av_log_format_line2(avcl, level, fmt, copy, line, sizeof line, &print_prefix);
  va_end(copy);
  sink->add(level, line);
}

void install_log_callback() {
  static std::once_flag once;
  std::call_once(once, [] { av_log_set_callback(log_callback); });
}

// Routes the lines of FFmpeg contexts (and of this thread) to `lines` while it lives.
class LogScope {
 public:
  explicit LogScope(LogLines* lines) : previous_(t_log) { t_log = lines; }
  ~LogScope() { t_log = previous_; }
  LogScope(const LogScope&) = delete;
  LogScope& operator=(const LogScope&) = delete;

 private:
  LogLines* previous_;
};

void own_log(const void* ctx, LogLines* lines) {
  const std::lock_guard<std::mutex> lock(g_log_mu);
  g_log_owners.emplace_back(ctx, lines);
}

void disown_log(const LogLines* lines) {
  const std::lock_guard<std::mutex> lock(g_log_mu);
  g_log_owners.erase(std::remove_if(g_log_owners.begin(), g_log_owners.end(),
                                    [&](const auto& p) { return p.second == lines; }),
                     g_log_owners.end());
}

// ---- the display matrix ----------------------------------------------------------------------

const std::int32_t* display_matrix(const AVStream* st) {
#if SAPIENS_SEG_CODECPAR_SIDE_DATA
  const AVPacketSideData* sd = av_packet_side_data_get(
      st->codecpar->coded_side_data, st->codecpar->nb_coded_side_data, AV_PKT_DATA_DISPLAYMATRIX);
  if (sd == nullptr || sd->size < 9 * sizeof(std::int32_t)) return nullptr;
  return reinterpret_cast<const std::int32_t*>(sd->data);
#else
  std::size_t size = 0;
  const std::uint8_t* data = av_stream_get_side_data(st, AV_PKT_DATA_DISPLAYMATRIX, &size);
  if (data == nullptr || size < 9 * sizeof(std::int32_t)) return nullptr;
  return reinterpret_cast<const std::int32_t*>(data);
#endif
}

// -v, where INT32_MIN (a file's matrix element can be any 32-bit value) becomes INT32_MAX: its
// negative is no int32, and one 65536th in a 16.16 element does not move the angle.
std::int32_t negated(std::int32_t v) {
  return v == std::numeric_limits<std::int32_t>::min() ? std::numeric_limits<std::int32_t>::max()
                                                       : -v;
}

// The matrix maps a stored pixel (x, y) to (a x + c y, b x + d y) (a, b, c, d = m[0], m[1],
// m[3], m[4]), in picture coordinates, y downwards. One with a negative determinant mirrors:
// it is a left-right mirror (x -> -x, which negates a and b) followed by a turn.
// av_display_rotation_get gives the turn's angle counter-clockwise; players turn clockwise by
// its negative.
void apply_matrix(const std::int32_t* m, VideoStreamInfo& info) {
  if (m == nullptr) return;
  std::int32_t turn[9];
  std::copy(m, m + 9, turn);
  const double det = static_cast<double>(m[0]) * m[4] - static_cast<double>(m[1]) * m[3];
  const bool mirrored = det < 0;
  if (mirrored) {
    turn[0] = negated(turn[0]);
    turn[1] = negated(turn[1]);
  }
  const double ccw = av_display_rotation_get(turn);
  if (std::isnan(ccw)) {
    info.odd_matrix = true;
    return;
  }
  double cw = std::fmod(-ccw, 360.0);
  if (cw < 0) cw += 360.0;
  const double quarter = std::round(cw / 90.0) * 90.0;
  if (std::abs(cw - quarter) > 1.0) {
    info.odd_matrix = true;
    info.odd_angle = cw;
    return;
  }
  info.rotation = static_cast<int>(quarter) % 360;
  info.mirrored = mirrored;
}

double q2d_or(AVRational r, double fallback) {
  return r.num > 0 && r.den > 0 ? av_q2d(r) : fallback;
}

bool is_mov(const AVFormatContext* fmt) {
  return fmt->iformat != nullptr && std::strncmp(fmt->iformat->name, "mov,", 4) == 0;
}

// The frames an MP4/MOV index shows (an edit list's hidden samples left out), and the first
// sample, in index order, whose data is not all in the file (-1: all are).
struct IndexCount {
  std::int64_t entries = 0, shown = 0, first_incomplete = -1;
};

IndexCount count_index(AVStream* st, std::int64_t file_size) {
  IndexCount c;
  c.entries = avformat_index_get_entries_count(st);
  for (std::int64_t i = 0; i < c.entries; ++i) {
    const AVIndexEntry* e = avformat_index_get_entry(st, static_cast<int>(i));
    if (e == nullptr) continue;
    if (!(e->flags & AVINDEX_DISCARD_FRAME)) ++c.shown;
    if (c.first_incomplete < 0 && file_size > 0 && e->pos + e->size > file_size) {
      c.first_incomplete = i;
    }
  }
  return c;
}

std::int64_t frame_duration(const AVFrame* f) {
#if SAPIENS_SEG_FRAME_DURATION
  return f->duration;
#else
  return f->pkt_duration;
#endif
}

// The int an FFmpeg enum field holds. FFmpeg's C decoders store a stream's raw codes there (an
// MPEG-2 header's 8-bit matrix_coefficients goes into AVFrame.colorspace as it is: 65, say); a
// C++ load of such a value as the enum type, outside its enumerators' range, is undefined.
template <typename Enum>
int stored_int(const Enum& field) {
  static_assert(std::is_enum_v<Enum> && sizeof(Enum) == sizeof(int));
  int v = 0;
  std::memcpy(&v, &field, sizeof v);
  return v;
}

// b - a in time-base ticks. A damaged file's timestamps can be anywhere in the 64-bit range, where
// the integer difference overflows; in doubles it cannot, and it is exact while both are within
// 2^52 ticks of 0 (at MPEG's 90 kHz, over a thousand years).
double ticks_between(std::int64_t a, std::int64_t b) {
  return static_cast<double>(b) - static_cast<double>(a);
}

std::int64_t timestamp_of(const AVFrame* f) {
  return f->best_effort_timestamp != AV_NOPTS_VALUE ? f->best_effort_timestamp : f->pts;
}

}  // namespace

struct VideoReader::Impl {
  const std::atomic<bool>& cancel;
  std::string path;
  LogLines log;
  AVFormatContext* fmt = nullptr;
  AVCodecContext* dec = nullptr;
  AVStream* st = nullptr;
  AVPacket* pkt = nullptr;
  AVFrame* pending = nullptr;  // decoded, not yet given out
  AVFrame* current = nullptr;  // the frame given out last
  bool have_pending = false, current_decoded = false, converted = false;
  SwsContext* sws = nullptr;
  int sws_space = -1, sws_range = -1;
  cv::Mat stored, shown;
  VideoStreamInfo info;
  std::int64_t file_size = 0;

  bool draining = false, decoder_done = false;
  std::string demux_error;
  std::deque<std::int64_t> failures;  // presentation times of packets that failed to decode
  std::int64_t last_sent_ts = AV_NOPTS_VALUE;
  int receive_errors = 0;

  std::int64_t next_index = 0, packets = 0, not_decoded = 0, damaged = 0;
  std::string decode_error;
  std::optional<std::int64_t> first_ts;
  std::optional<double> last_seconds;
  double min_step = 0, max_step = 0, last_end = 0;
  bool timed = false;

  Impl(const std::string& p, const std::atomic<bool>& c) : cancel(c), path(p) {}

  ~Impl() {
    disown_log(&log);
    sws_freeContext(sws);
    av_frame_free(&pending);
    av_frame_free(&current);
    av_packet_free(&pkt);
    avcodec_free_context(&dec);
    avformat_close_input(&fmt);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  [[noreturn]] void fail(int err, const std::string& what) const {
    std::string msg = what + " " + path + ": " + av_text(err);
    const std::string said = log.first_error();
    if (!said.empty() && said != av_text(err)) msg += " (FFmpeg: " + said + ")";
    throw Error(code_of(err), msg);
  }

  static int interrupted(void* opaque) {
    return static_cast<const Impl*>(opaque)->cancel.load() ? 1 : 0;
  }

  void open() {
    install_log_callback();
    const LogScope scope(&log);
    fmt = avformat_alloc_context();
    if (fmt == nullptr) throw Error(ErrorCode::kOutOfMemory, "cannot read " + path + ": no memory");
    own_log(fmt, &log);
    fmt->interrupt_callback.callback = &Impl::interrupted;
    fmt->interrupt_callback.opaque = this;
    AVDictionary* opts = nullptr;
    av_dict_set(&opts, "format_whitelist", kDemuxers, 0);
    av_dict_set(&opts, "protocol_whitelist", "file", 0);
    // "file:" keeps a name with a colon ("clip:1.mp4") from being read as a protocol.
    int r = avformat_open_input(&fmt, ("file:" + path).c_str(), nullptr, &opts);
    av_dict_free(&opts);
    if (r < 0) {  // fmt is freed
      fmt = nullptr;
      if (r == AVERROR_EXIT && cancel) throw Error(ErrorCode::kIo, "cancelled");
      if (log.contains("moov atom not found")) {
        throw Error(ErrorCode::kInvalidInput,
                    "cannot open video " + path +
                        ": the file has no index (moov box) (a copy or download that stopped "
                        "early, or a recording that was not finished)");
      }
      if (log.contains("not on whitelist")) {
        throw Error(ErrorCode::kInvalidInput,
                    "cannot open video " + path + ": " + log.last() +
                        " (a playlist or a container this tool does not read as a video)");
      }
      fail(r, "cannot open video");
    }
    r = avformat_find_stream_info(fmt, nullptr);
    if (r < 0) fail(r, "cannot read the streams of video");
    info.container = fmt->iformat->name;
    if (fmt->pb != nullptr) file_size = avio_size(fmt->pb);

    // The best video stream (FFmpeg's choice), never a cover picture.
    const AVCodec* codec = nullptr;
    int index = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
    if (index >= 0 && (fmt->streams[index]->disposition & AV_DISPOSITION_ATTACHED_PIC)) {
      index = -1;
      for (unsigned i = 0; i < fmt->nb_streams; ++i) {
        const AVStream* s = fmt->streams[i];
        if (s->codecpar->codec_type == AVMEDIA_TYPE_VIDEO &&
            !(s->disposition & AV_DISPOSITION_ATTACHED_PIC)) {
          index = static_cast<int>(i);
          codec = avcodec_find_decoder(s->codecpar->codec_id);
          break;
        }
      }
    }
    if (index == AVERROR_DECODER_NOT_FOUND || (index >= 0 && codec == nullptr)) {
      const AVStream* s = index >= 0 ? fmt->streams[index] : nullptr;
      const char* name = s ? avcodec_get_name(s->codecpar->codec_id) : "its codec";
      throw Error(ErrorCode::kInvalidInput, "cannot decode video " + path + ": this FFmpeg (" +
                                                av_version_info() + ") has no decoder for " + name);
    }
    if (index < 0) {
      throw Error(ErrorCode::kInvalidInput, path + " has no video stream");
    }
    st = fmt->streams[index];
    for (unsigned i = 0; i < fmt->nb_streams; ++i) {
      if (static_cast<int>(i) != index) fmt->streams[i]->discard = AVDISCARD_ALL;
    }
    info.codec = avcodec_get_name(st->codecpar->codec_id);
    info.width = st->codecpar->width;
    info.height = st->codecpar->height;
    apply_matrix(display_matrix(st), info);

    dec = avcodec_alloc_context3(codec);
    if (dec == nullptr)
      throw Error(ErrorCode::kOutOfMemory, "cannot decode " + path + ": no memory");
    own_log(dec, &log);
    r = avcodec_parameters_to_context(dec, st->codecpar);
    if (r < 0) fail(r, "cannot decode video");
    dec->pkt_timebase = st->time_base;
    // Slice threads only: a frame's decoding error is then reported with its own packet (frame
    // threads report it with a later one), so it is placed on the right frame.
    dec->thread_count = 0;
    dec->thread_type = FF_THREAD_SLICE;
    r = avcodec_open2(dec, codec, nullptr);
    if (r < 0) fail(r, "cannot open the decoder of video");
    pkt = av_packet_alloc();
    pending = av_frame_alloc();
    current = av_frame_alloc();
    if (pkt == nullptr || pending == nullptr || current == nullptr) {
      throw Error(ErrorCode::kOutOfMemory, "cannot decode " + path + ": no memory");
    }

    // The rate of the timeline: a constant rate as it is; a variable one (FFmpeg's base rate
    // well above the mean) at its base rate, up to 60 frames a second.
    const double mean = q2d_or(st->avg_frame_rate, 0);
    const double base = q2d_or(st->r_frame_rate, 0);
    const auto usable = [](double r) { return r >= kMinRate && r <= kMaxRate; };
    double rate = usable(base) ? base : usable(mean) ? mean : 25.0;
    if (mean > 0 && rate > 1.5 * mean) rate = std::max(mean, std::min(rate, 60.0));
    info.rate = std::round(rate * 1000) / 1000;

    // What the container says it holds.
    if (is_mov(fmt)) {
      const IndexCount c = count_index(st, file_size);
      if (c.shown > 0) info.frames_listed = c.shown;
    } else if (st->nb_frames > 0) {
      info.frames_listed = st->nb_frames;
    }
    if (st->duration != AV_NOPTS_VALUE && st->duration > 0) {
      info.header_duration = static_cast<double>(st->duration) * av_q2d(st->time_base);
    } else if (fmt->duration != AV_NOPTS_VALUE && fmt->duration > 0 &&
               fmt->duration_estimation_method != AVFMT_DURATION_FROM_BITRATE) {
      info.header_duration = static_cast<double>(fmt->duration) / AV_TIME_BASE;
    }
  }

  // ---- decoding ------------------------------------------------------------------------------

  void note_failure(std::int64_t ts, int err) {
    if (decode_error.empty()) {
      const std::string said = log.last();
      decode_error = said.empty() ? av_text(err) : said;
    }
    // In presentation order among the pending ones (no time, AV_NOPTS_VALUE, sorts first and
    // is given out at once).
    failures.insert(std::upper_bound(failures.begin(), failures.end(), ts), ts);
  }

  // One packet of the stream into the decoder (or the end of the stream).
  void feed() {
    for (;;) {
      if (cancel) return;
      const int r = av_read_frame(fmt, pkt);
      if (r < 0) {
        if (r == AVERROR_EXIT && cancel) return;
        if (r != AVERROR_EOF && demux_error.empty()) {
          const std::string said = log.last();
          demux_error = av_text(r) + (said.empty() ? std::string() : " (FFmpeg: " + said + ")");
        }
        avcodec_send_packet(dec, nullptr);
        draining = true;
        return;
      }
      if (pkt->stream_index != st->index) {
        av_packet_unref(pkt);
        continue;
      }
      const bool hidden = (pkt->flags & AV_PKT_FLAG_DISCARD) != 0;
      if (!hidden) ++packets;
      const std::int64_t ts = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;
      const int s = avcodec_send_packet(dec, pkt);
      av_packet_unref(pkt);
      if (s == AVERROR(ENOMEM)) fail(s, "cannot decode video");
      if (s >= 0) {
        last_sent_ts = ts;
      } else if (!hidden) {
        note_failure(ts, s);
      }
      return;
    }
  }

  // Moves the decoder on by one step: a frame, a failure, or the end.
  void pull() {
    const int r = avcodec_receive_frame(dec, pending);
    if (r >= 0) {
      receive_errors = 0;
      if (pending->flags & AV_FRAME_FLAG_DISCARD) {
        av_frame_unref(pending);
        return;
      }
      have_pending = true;
      return;
    }
    if (r == AVERROR_EOF) {
      decoder_done = true;
      return;
    }
    if (r == AVERROR(EAGAIN)) {
      if (draining) {
        decoder_done = true;  // a decoder that wants more after the end: there is none
      } else {
        feed();
      }
      return;
    }
    if (r == AVERROR(ENOMEM)) fail(r, "cannot decode video");
    // A decoding error given with the output: the frame of the packet sent last.
    note_failure(last_sent_ts, r);
    if (++receive_errors > 64) decoder_done = true;
  }

  std::optional<double> seconds_of(std::int64_t ts) {
    if (ts == AV_NOPTS_VALUE) return std::nullopt;
    if (!first_ts) first_ts = ts;
    return ticks_between(*first_ts, ts) * av_q2d(st->time_base);
  }

  void time(const std::optional<double>& s, double duration) {
    if (!s) return;
    if (last_seconds && *s > *last_seconds) {
      const double step = *s - *last_seconds;
      min_step = min_step == 0 ? step : std::min(min_step, step);
      max_step = std::max(max_step, step);
    }
    if (!last_seconds || *s > *last_seconds) last_seconds = s;
    last_end = std::max(last_end, *s + duration);
    timed = true;
  }

  void give_failure(VideoFrame& out) {
    const std::int64_t ts = failures.front();
    failures.pop_front();
    av_frame_unref(current);
    current_decoded = false;
    out = VideoFrame{};
    out.index = next_index++;
    out.seconds = seconds_of(ts);
    out.decoded = false;
    ++not_decoded;
    time(out.seconds, 0);
  }

  void give_frame(VideoFrame& out) {
    av_frame_unref(current);
    av_frame_move_ref(current, pending);
    have_pending = false;
    current_decoded = true;
    converted = false;
    out = VideoFrame{};
    out.index = next_index++;
    out.seconds = seconds_of(timestamp_of(current));
    out.decoded = true;
    out.damaged = current->decode_error_flags != 0 || (current->flags & AV_FRAME_FLAG_CORRUPT);
    out.width = current->width;
    out.height = current->height;
    if (out.damaged) ++damaged;
    const std::int64_t d = frame_duration(current);
    time(out.seconds, d > 0 ? static_cast<double>(d) * av_q2d(st->time_base) : 0);
  }

  bool next(VideoFrame& out) {
    const LogScope scope(&log);
    for (;;) {
      if (cancel) return false;
      if (!failures.empty()) {
        const std::int64_t f = failures.front();
        const std::int64_t t = have_pending ? timestamp_of(pending) : AV_NOPTS_VALUE;
        if (decoder_done || f == AV_NOPTS_VALUE || (t != AV_NOPTS_VALUE && f < t) ||
            failures.size() > kMaxPendingFailures) {
          give_failure(out);
          return true;
        }
      }
      if (have_pending) {
        give_frame(out);
        return true;
      }
      if (decoder_done) return false;
      pull();
    }
  }

  // ---- conversion ----------------------------------------------------------------------------

  const cv::Mat& rgb() {
    if (!current_decoded) {
      throw Error(ErrorCode::kInvalidInput, "a frame of " + path + " could not be decoded");
    }
    if (converted) return shown;
    const LogScope scope(&log);
    const int w = current->width, h = current->height;
    const auto format = static_cast<AVPixelFormat>(current->format);
    if (w <= 0 || h <= 0 || static_cast<std::int64_t>(w) * h > kMaxPixels) {
      throw Error(ErrorCode::kInvalidInput, "a frame of " + path + " is " + std::to_string(w) +
                                                "x" + std::to_string(h) +
                                                " pixels, more than this tool converts (2^28)");
    }
    if (sws_isSupportedInput(format) <= 0) {
      const char* name = av_get_pix_fmt_name(format);
      throw Error(ErrorCode::kInvalidInput,
                  "cannot convert the frames of " + path + " to RGB: their pixel format (" +
                      (name ? name : "unknown") + ") is not one libswscale reads");
    }
    // A context for this frame's own size and format (the one before is reused while they
    // stay the same; a stream whose size changes gets a new one at the change).
    sws = sws_getCachedContext(sws, w, h, format, w, h, AV_PIX_FMT_RGB24, SWS_BICUBIC, nullptr,
                               nullptr, nullptr);
    if (sws == nullptr) {
      throw Error(ErrorCode::kInternal, "cannot convert a " + std::to_string(w) + "x" +
                                            std::to_string(h) + " frame of " + path +
                                            " to RGB (libswscale refused)");
    }
    // The frame's own colour matrix and range, as FFmpeg's scale filter takes them (BT.601
    // where the stream does not say).
    const int space = stored_int(current->colorspace);
    const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(format);
    const bool yuv =
        desc != nullptr && !(desc->flags & AV_PIX_FMT_FLAG_RGB) && desc->nb_components >= 3;
    const int full = stored_int(current->color_range) == AVCOL_RANGE_JPEG ||
                             format == AV_PIX_FMT_YUVJ420P || format == AV_PIX_FMT_YUVJ422P ||
                             format == AV_PIX_FMT_YUVJ444P || format == AV_PIX_FMT_YUVJ440P ||
                             format == AV_PIX_FMT_YUVJ411P
                         ? 1
                         : 0;
    if (yuv && (space != sws_space || full != sws_range)) {
      sws_setColorspaceDetails(sws, sws_getCoefficients(space), full,
                               sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16);
      sws_space = space;
      sws_range = full;
    }
    stored.create(h, w, CV_8UC3);
    std::uint8_t* dst[4] = {stored.data, nullptr, nullptr, nullptr};
    const int dst_stride[4] = {static_cast<int>(stored.step), 0, 0, 0};
    const int lines = sws_scale(sws, current->data, current->linesize, 0, h, dst, dst_stride);
    if (lines != h) {
      throw Error(ErrorCode::kInternal, "cannot convert a frame of " + path + " to RGB");
    }
    const cv::Mat* src = &stored;
    cv::Mat mirrored;
    if (info.mirrored) {
      cv::flip(stored, mirrored, 1);
      src = &mirrored;
    }
    switch (info.rotation) {
      case 90:
        cv::rotate(*src, shown, cv::ROTATE_90_CLOCKWISE);
        break;
      case 180:
        cv::rotate(*src, shown, cv::ROTATE_180);
        break;
      case 270:
        cv::rotate(*src, shown, cv::ROTATE_90_COUNTERCLOCKWISE);
        break;
      default:
        shown = *src;  // shares the buffer (the caller copies the picture before next())
        break;
    }
    converted = true;
    return shown;
  }

  // ---- the end -------------------------------------------------------------------------------

  VideoEnd end() {
    VideoEnd e;
    e.frames = next_index;
    e.packets = packets;
    e.not_decoded = not_decoded;
    e.damaged = damaged;
    e.decode_error = decode_error;
    e.duration = timed ? last_end : 0;
    if (timed && min_step > 0 && last_end <= *last_seconds) e.duration = *last_seconds + min_step;
    if (timed && min_step == 0 && last_end <= *last_seconds) {
      e.duration = *last_seconds + 1.0 / info.rate;
    }
    e.variable_rate = min_step > 0 && max_step > 1.5 * min_step;
    const std::string read = std::to_string(e.frames);
    if (is_mov(fmt)) {
      // The index lists every sample, with where its data lies: a file that ends inside the
      // data is cut; fewer frames than it shows is damage.
      const IndexCount c = count_index(st, file_size);
      if (c.shown > 0) {
        e.frames_in_container = c.shown;
        const std::string n = std::to_string(c.shown);
        if (c.first_incomplete >= 0) {
          e.truncated = true;
          e.why = "truncated: the file ends inside the data of frame " +
                  std::to_string(c.first_incomplete + 1) + " of " + std::to_string(c.entries) +
                  "; only " + read + " of the " + n + " frames the container lists could be read";
        } else if (e.frames < c.shown) {
          e.truncated = true;
          e.why = "truncated or damaged: only " + read + " of the " + n +
                  " frames the container lists could be decoded";
        }
      }
    } else if (info.frames_listed) {
      // A count in the header (AVI): fewer frames read, the last well before the count's time.
      const std::int64_t n = *info.frames_listed;
      if (e.frames < n) {
        const double expected_end = static_cast<double>(n) / info.rate;
        const double got = last_seconds.value_or(0);
        if (!timed || got + 1.5 / info.rate < expected_end) {
          e.truncated = true;
          e.why = "truncated or damaged: only " + read + " of the " + std::to_string(n) +
                  " frames the container lists could be read";
        }
      }
      e.frames_in_container = n;
    } else if (info.header_duration) {
      // A duration in the header (Matroska/WebM, ...): the stream must reach it.
      const double expected = *info.header_duration;
      if (e.duration + 1.5 / info.rate < expected - first_offset()) {
        char at[128];
        std::snprintf(at, sizeof at, "at %.2f s of the %.2f s its header gives", e.duration,
                      expected);
        e.truncated = true;
        e.why =
            std::string("truncated: the stream ends ") + at + "; " + read + " frames could be read";
      }
    }
    if (!demux_error.empty() && !e.truncated) {
      e.truncated = true;
      e.why =
          "truncated or damaged: reading stopped after " + read + " frames (" + demux_error + ")";
    }
    if (!e.frames_in_container && !e.truncated) e.frames_in_container = e.frames;
    return e;
  }

  // Seconds from the stream's start to its first frame (a stream whose first frame is shown
  // after its start: B-frame delays, a trimmed head).
  double first_offset() const {
    if (!first_ts || st->start_time == AV_NOPTS_VALUE) return 0;
    return std::max(0.0, ticks_between(st->start_time, *first_ts) * av_q2d(st->time_base));
  }
};

VideoReader::VideoReader(const std::string& path, const std::atomic<bool>& cancel)
    : impl_(std::make_unique<Impl>(path, cancel)) {
  impl_->open();
}

VideoReader::~VideoReader() = default;

const VideoStreamInfo& VideoReader::info() const {
  return impl_->info;
}

bool VideoReader::next(VideoFrame& frame) {
  return impl_->next(frame);
}

const cv::Mat& VideoReader::rgb() {
  return impl_->rgb();
}

VideoEnd VideoReader::end() const {
  return impl_->end();
}

std::int64_t count_decodable_frames(const std::string& path) {
  const std::atomic<bool> never{false};
  try {
    VideoReader reader(path, never);
    VideoFrame f;
    std::int64_t n = 0;
    while (reader.next(f)) n += f.decoded ? 1 : 0;
    return n;
  } catch (const Error&) {
    return -1;
  }
}

}  // namespace sapiens_seg::cli
