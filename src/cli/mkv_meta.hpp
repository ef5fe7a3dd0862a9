// What a Matroska or WebM file says about its first video track, in the form mp4_meta.hpp gives
// for MP4/MOV (mp4::Info): the frames (blocks) with their presentation times and where their
// data lies, the picture size of each (from the codec's private data and the parameter sets or
// VP8/VP9 key frames in the stream), the header's duration, and whether the file ends inside a
// cluster (a copy or download cut short). Screen recorders (OBS) and browsers (MediaRecorder)
// write these files with variable frame rates, live clusters of unknown size and no index, and
// WebRTC recordings change their frame size with the bandwidth: OpenCV's estimates (a frame
// count from the duration) and its first-size conversion cannot tell.
//
// Display rotation (the Projection element) is not read: FFmpeg's own muxer does not write it,
// and phones do not record Matroska.
//
// Header-only, bounded like mp4_meta.hpp: a malformed file gives ok == false.
#pragma once

#include <cmath>
#include <cstring>

#include "cli/mp4_meta.hpp"

namespace sapiens_seg::cli::mkv {

namespace detail {

using mp4::detail::Reader;

constexpr std::uint32_t kEbml = 0x1A45DFA3, kSegment = 0x18538067, kInfo = 0x1549A966,
                        kTracks = 0x1654AE6B, kCluster = 0x1F43B675, kTimestampScale = 0x2AD7B1,
                        kDuration = 0x4489, kTrackEntry = 0xAE, kTrackNumber = 0xD7,
                        kTrackType = 0x83, kCodecId = 0x86, kCodecPrivate = 0x63A2,
                        kDefaultDuration = 0x23E383, kVideo = 0xE0, kPixelWidth = 0xB0,
                        kPixelHeight = 0xBA, kTimestamp = 0xE7, kSimpleBlock = 0xA3,
                        kBlockGroup = 0xA0, kBlock = 0xA1, kBlockDuration = 0x9B,
                        kReferenceBlock = 0xFB, kCues = 0x1C53BB6B, kTags = 0x1254C367,
                        kChapters = 0x1043A770, kAttachments = 0x1941A469, kSeekHead = 0x114D9B74;
constexpr std::uint64_t kUnknown = ~std::uint64_t{0};

struct Element {
  std::uint32_t id = 0;
  std::uint64_t body = 0, size = 0;  // size kUnknown: to be ended by the next top-level element
  std::uint64_t end() const { return size == kUnknown ? kUnknown : body + size; }
};

// An EBML variable-size integer at `at` (1-8 bytes); `id` keeps the marker bits.
inline bool vint(const Reader& r, std::uint64_t at, std::uint64_t limit, bool id,
                 std::uint64_t& value, int& length) {
  std::uint8_t b[8];
  if (at >= limit || !r.read(at, b, 1)) return false;
  length = 1;
  while (length <= 8 && !(b[0] & (0x80 >> (length - 1)))) ++length;
  if (length > (id ? 4 : 8) || at + static_cast<std::uint64_t>(length) > limit) return false;
  if (length > 1 && !r.read(at + 1, b + 1, static_cast<std::size_t>(length) - 1)) return false;
  value = id ? b[0] : (b[0] & (0xff >> length));
  bool all_ones = value == (0xffu >> length);
  for (int i = 1; i < length; ++i) {
    value = (value << 8) | b[i];
    all_ones = all_ones && b[i] == 0xff;
  }
  if (!id && all_ones) value = kUnknown;
  return true;
}

inline bool element(const Reader& r, std::uint64_t at, std::uint64_t limit, Element& e) {
  std::uint64_t id = 0, size = 0;
  int n = 0, m = 0;
  if (!vint(r, at, limit, true, id, n) || !vint(r, at + n, limit, false, size, m)) return false;
  e.id = static_cast<std::uint32_t>(id);
  e.body = at + static_cast<std::uint64_t>(n + m);
  e.size = size;
  return true;
}

inline std::uint64_t uint_of(const Reader& r, const Element& e) {
  std::uint8_t b[8] = {};
  if (e.size == 0 || e.size > 8 || !r.read(e.body, b, static_cast<std::size_t>(e.size))) return 0;
  std::uint64_t v = 0;
  for (std::uint64_t i = 0; i < e.size; ++i) v = (v << 8) | b[i];
  return v;
}

inline double float_of(const Reader& r, const Element& e) {
  std::uint8_t b[8] = {};
  if ((e.size != 4 && e.size != 8) || !r.read(e.body, b, static_cast<std::size_t>(e.size))) return 0;
  if (e.size == 4) {
    const std::uint32_t u = mp4::detail::be32(b);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const std::uint64_t u = mp4::detail::be64(b);
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

inline bool top_level(std::uint32_t id) {
  return id == kCluster || id == kCues || id == kTags || id == kChapters || id == kAttachments ||
         id == kSeekHead || id == kInfo || id == kTracks || id == kSegment || id == kEbml;
}

class Parser {
 public:
  Parser(const Reader& r, mp4::Info& info) : r_(r), info_(info) {}

  void run() {
    Element head;
    if (!element(r_, 0, r_.size(), head) || head.id != kEbml) return;  // not Matroska
    info_.container = "matroska";
    Element seg;
    std::uint64_t at = head.end();
    if (head.size == kUnknown || !element(r_, at, r_.size(), seg) || seg.id != kSegment) {
      info_.problem = "the file has no segment";
      return;
    }
    const std::uint64_t seg_end = seg.size == kUnknown ? r_.size() : std::min(seg.end(), r_.size());
    if (seg.size != kUnknown && seg.end() > r_.size()) info_.cut = true;
    bool tracks_read = false;
    for (at = seg.body; at < seg_end;) {
      Element e;
      if (!element(r_, at, seg_end, e)) {
        info_.cut = true;  // a header cut short at the end of the file
        break;
      }
      if (e.id == kCluster) {
        if (!tracks_read) break;  // no track of ours yet: nothing to time
        at = cluster(e, seg_end);
        continue;
      }
      if (e.size == kUnknown) break;
      if (e.end() > seg_end) {
        info_.cut = true;
        break;
      }
      if (e.id == kInfo) read_info(e);
      if (e.id == kTracks) tracks_read = read_tracks(e);
      at = e.end();
    }
    if (!info_.has_video) {
      if (info_.problem.empty()) info_.problem = "the file has no video track";
      return;
    }
    finish();
    info_.ok = true;
  }

 private:
  template <typename F>
  void children(const Element& parent, F&& on) {
    const std::uint64_t end = std::min(parent.end(), r_.size());
    for (std::uint64_t at = parent.body; at < end;) {
      Element e;
      if (!element(r_, at, end, e) || e.size == kUnknown || e.end() > end) return;
      on(e);
      at = e.end();
    }
  }

  void read_info(const Element& info) {
    children(info, [&](const Element& e) {
      if (e.id == kTimestampScale) scale_ns_ = uint_of(r_, e);
      if (e.id == kDuration) duration_ticks_ = float_of(r_, e);
    });
    if (scale_ns_ == 0) scale_ns_ = 1000000;
  }

  bool read_tracks(const Element& tracks) {
    children(tracks, [&](const Element& entry) {
      if (entry.id != kTrackEntry || info_.has_video) return;
      std::uint64_t number = 0, type = 0, default_ns = 0;
      std::string codec;
      std::vector<std::uint8_t> priv;
      mp4::Size size;
      children(entry, [&](const Element& e) {
        if (e.id == kTrackNumber) number = uint_of(r_, e);
        if (e.id == kTrackType) type = uint_of(r_, e);
        if (e.id == kDefaultDuration) default_ns = uint_of(r_, e);
        if (e.id == kCodecId && e.size < 64) {
          std::vector<std::uint8_t> b;
          if (r_.bytes(e.body, static_cast<std::size_t>(e.size), b)) codec.assign(b.begin(), b.end());
          while (!codec.empty() && codec.back() == '\0') codec.pop_back();
        }
        if (e.id == kCodecPrivate && e.size < (1u << 20)) {
          r_.bytes(e.body, static_cast<std::size_t>(e.size), priv);
        }
        if (e.id == kVideo) {
          children(e, [&](const Element& v) {
            if (v.id == kPixelWidth) size.width = static_cast<int>(uint_of(r_, v));
            if (v.id == kPixelHeight) size.height = static_cast<int>(uint_of(r_, v));
          });
        }
      });
      if (type != 1) return;
      info_.has_video = true;
      track_ = number;
      default_ns_ = default_ns;
      mp4::SampleEntry entry_out;
      entry_out.size = size;
      entry_out.format = codec == "V_MPEG4/ISO/AVC"    ? "avc1"
                         : codec == "V_MPEGH/ISO/HEVC" ? "hvc1"
                         : codec == "V_VP8"            ? "vp08"
                         : codec == "V_VP9"            ? "vp09"
                                                       : codec;
      configuration(entry_out, priv);
      info_.entries.push_back(std::move(entry_out));
    });
    return true;
  }

  // avcC / hvcC in CodecPrivate: the NAL length size and the parameter sets.
  static void configuration(mp4::SampleEntry& e, const std::vector<std::uint8_t>& c) {
    using mp4::detail::be16;
    if (e.format == "avc1" && c.size() >= 6) {
      e.nal_length_size = (c[4] & 3) + 1;
      std::size_t at = 6;
      for (int k = 0; k < (c[5] & 0x1f) && at + 2 <= c.size(); ++k) {
        const std::size_t len = be16(c.data() + at);
        if (at + 2 + len > c.size()) break;
        e.sps.emplace_back(c.begin() + static_cast<std::ptrdiff_t>(at + 2),
                           c.begin() + static_cast<std::ptrdiff_t>(at + 2 + len));
        at += 2 + len;
      }
    } else if (e.format == "hvc1" && c.size() >= 23) {
      e.nal_length_size = (c[21] & 3) + 1;
      std::size_t at = 23;
      for (int arr = 0; arr < c[22] && at + 3 <= c.size(); ++arr) {
        const int type = c[at] & 0x3f;
        const std::size_t n = be16(c.data() + at + 1);
        at += 3;
        for (std::size_t k = 0; k < n && at + 2 <= c.size(); ++k) {
          const std::size_t len = be16(c.data() + at);
          if (at + 2 + len > c.size()) break;
          if (type == 33) {
            e.sps.emplace_back(c.begin() + static_cast<std::ptrdiff_t>(at + 2),
                               c.begin() + static_cast<std::ptrdiff_t>(at + 2 + len));
          }
          at += 2 + len;
        }
      }
    }
  }

  // A cluster's blocks of our track; returns where the next element starts. A cluster of
  // unknown size (live recordings) ends at the next top-level element.
  std::uint64_t cluster(const Element& c, std::uint64_t seg_end) {
    const bool sized = c.size != kUnknown;
    if (sized && c.end() > seg_end) info_.cut = true;
    const std::uint64_t end = sized ? std::min(c.end(), seg_end) : seg_end;
    std::uint64_t cluster_ts = 0;
    std::uint64_t at = c.body;
    while (at < end) {
      Element e;
      if (!element(r_, at, end, e)) {
        info_.cut = true;
        return end;
      }
      if (!sized && top_level(e.id)) return at;
      if (e.size == kUnknown) return end;
      if (e.end() > end) {
        info_.cut = true;  // the file ends inside this element
        if (e.id == kSimpleBlock || e.id == kBlockGroup) block_at(e, cluster_ts, e.id == kSimpleBlock);
        return end;
      }
      if (e.id == kTimestamp) cluster_ts = uint_of(r_, e);
      if (e.id == kSimpleBlock) block_at(e, cluster_ts, true);
      if (e.id == kBlockGroup) {
        bool keyframe = true;
        std::optional<Element> block;
        std::uint64_t duration = 0;
        children(e, [&](const Element& g) {
          if (g.id == kBlock) block = g;
          if (g.id == kReferenceBlock) keyframe = false;
          if (g.id == kBlockDuration) duration = uint_of(r_, g);
        });
        if (block) block_at(*block, cluster_ts, false, keyframe, duration);
      }
      at = e.end();
    }
    return end;
  }

  void block_at(const Element& b, std::uint64_t cluster_ts, bool simple, bool keyframe = true,
                std::uint64_t duration = 0) {
    std::uint64_t track = 0;
    int n = 0;
    if (!vint(r_, b.body, r_.size(), false, track, n) || track != track_) return;
    std::uint8_t h[3];
    if (!r_.read(b.body + n, h, 3)) return;
    const auto rel = static_cast<std::int16_t>((h[0] << 8) | h[1]);
    const std::uint8_t flags = h[2];
    mp4::Sample s;
    s.pts = s.dts = static_cast<std::int64_t>(cluster_ts) + rel;
    s.offset = b.body + static_cast<std::uint64_t>(n) + 3;
    const std::uint64_t stated_end = b.size == kUnknown ? r_.size() : b.body + b.size;
    s.size = static_cast<std::uint32_t>(std::min<std::uint64_t>(stated_end - s.offset, 1u << 31));
    s.sync = simple ? (flags & 0x80) != 0 : keyframe;
    s.shown = !(simple && (flags & 0x08));  // "invisible"
    s.duration = static_cast<std::uint32_t>(duration);
    const int lacing = (flags >> 1) & 3;
    if (lacing != 0) {  // laced video is rare: the first frame's data is not delimited here
      s.size = 0;
    }
    if (s.shown && s.size >= 1 && info_.entries.size() == 1 && info_.entries[0].format == "vp08") {
      std::uint8_t first = 0;
      if (r_.read(s.offset, &first, 1)) s.shown = mp4::detail::vp8_shown(&first, 1);
    }
    info_.samples.push_back(s);
  }

  void finish() {
    // Ticks of TimestampScale nanoseconds: the track's timescale in ticks a second.
    info_.timescale = static_cast<std::uint32_t>(
        std::clamp<std::uint64_t>(1000000000ull / std::max<std::uint64_t>(scale_ns_, 1), 1,
                                  1000000000ull));
    if (duration_ticks_ > 0) info_.header_end = static_cast<std::int64_t>(std::llround(duration_ticks_));
    // Durations: the block's, else the time to the next frame shown, else the default.
    auto shown = mp4::presented(info_);
    const std::int64_t default_ticks =
        static_cast<std::int64_t>(default_ns_ / std::max<std::uint64_t>(scale_ns_, 1));
    for (std::size_t i = 0; i < shown.size(); ++i) {
      auto* s = const_cast<mp4::Sample*>(shown[i]);
      if (s->duration != 0) continue;
      if (i + 1 < shown.size()) {
        s->duration = static_cast<std::uint32_t>(std::max<std::int64_t>(shown[i + 1]->pts - s->pts, 0));
      } else if (!info_.cut && info_.header_end && *info_.header_end > s->pts) {
        s->duration = static_cast<std::uint32_t>(*info_.header_end - s->pts);
      } else {
        s->duration = static_cast<std::uint32_t>(std::max<std::int64_t>(default_ticks, 0));
      }
    }
    mp4::detail::fill_picture_sizes(r_, info_);
  }

  const Reader& r_;
  mp4::Info& info_;
  std::uint64_t scale_ns_ = 1000000, default_ns_ = 0, track_ = 0;
  double duration_ticks_ = 0;
};

}  // namespace detail

// mp4::Info of a Matroska/WebM file (container "matroska"), or container "" when it is not one.
inline mp4::Info read_info(const std::string& path) {
  mp4::Info info;
  mp4::detail::Reader r(path);
  if (!r.ok()) return info;
  info.file_size = r.size();
  detail::Parser(r, info).run();
  return info;
}

}  // namespace sapiens_seg::cli::mkv
