// What an MP4/MOV (ISO base media file) says about its first video track, read from the file
// itself rather than through the linked OpenCV: the display matrix (how players turn the
// picture: phones record portrait video as landscape frames with a 90 or 270 degree matrix), the
// samples with their presentation times and where their data lies, the edit list (a trim made
// with `ffmpeg -ss ... -c copy` keeps the samples before the cut and tells players to skip them),
// and the picture size of each sample (from its sample description and from H.264/HEVC sequence
// parameter sets carried in the stream, where a screen recording or a stream switch changes
// size).
//
// Why not OpenCV: its FFmpeg capture turns 90/270-degree videos the wrong way in some releases
// (4.6 turns them 180 degrees from what players show, newer ones report the angle with the
// opposite sign), estimates a variable-frame-rate file's frame count from its duration, counts
// the samples an edit list hides, and keeps converting frames at the first frame's size when
// the size changes (a stale or scrambled picture). The CLI reads the frames with OpenCV with
// its rotation off and uses these facts to turn, count, time and check them.
//
// Header-only (used by video.cpp and the unit tests). Every size and count read from the file
// is bounded by the file's size; a malformed file gives `ok == false` and a reason, never a
// crash or an unbounded allocation.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sapiens_seg::cli::mp4 {

// How the stored picture is shown: displayed (x', y') = (a x + c y, b x + d y) (ISO 14496-12
// track header matrix, reduced to the eight turns and mirrors; anything else is treated as
// identity and `exotic` is set).
struct Transform {
  int a = 1, b = 0, c = 0, d = 1;
  bool exotic = false;
  bool identity() const { return a == 1 && b == 0 && c == 0 && d == 1; }
  bool swaps_sides() const { return a == 0; }
  // Clockwise quarter turns (0-3) players apply, with a mirror first when `mirrored`.
  int clockwise_degrees() const {
    const int det = a * d - b * c;
    // Mirrored matrices are a turn of the horizontally mirrored picture: undo the mirror.
    const int ra = det < 0 ? -a : a, rb = det < 0 ? -b : b;
    if (ra == 1 && rb == 0) return 0;
    if (ra == 0 && rb == 1) return 90;
    if (ra == -1 && rb == 0) return 180;
    return 270;
  }
  bool mirrored() const { return a * d - b * c < 0; }
};

struct Size {
  int width = 0, height = 0;
  bool operator==(const Size& o) const { return width == o.width && height == o.height; }
  bool operator!=(const Size& o) const { return !(*this == o); }
};

struct Sample {
  std::int64_t dts = 0, pts = 0;  // in the track's timescale
  std::uint32_t duration = 0;
  std::uint64_t offset = 0;  // of its data in the file
  std::uint32_t size = 0;
  std::uint32_t description = 1;  // 1-based sample description index
  bool sync = true;
  bool shown = true;  // false for a frame the decoder does not output (VP8's alternate reference)
  Size picture;       // the decoded picture's size, where known (else 0x0)
};

struct SampleEntry {
  std::string format;  // "avc1", "hvc1", "mp4v", ...
  Size size;           // as the entry says
  int nal_length_size = 0;                  // H.264/HEVC: bytes of each NAL unit's length
  std::vector<std::vector<std::uint8_t>> sps;  // the configuration's sequence parameter sets
};

struct Info {
  std::string container;   // "mp4" (ISO: MP4, MOV, M4V, 3GP) or "matroska" (MKV, WebM)
  bool ok = false;         // a file of that container whose index (or blocks) was read
  std::string problem;     // why not ("" when ok, or when the file is not an ISO file at all)
  bool iso = false;        // it has the ISO box structure (ftyp/moov/mdat ...)
  bool has_moov = false;   // the index is there (a cut download of a file whose index comes
                           // last has none)
  bool has_video = false;  // a video track
  std::uint64_t file_size = 0;
  std::uint32_t timescale = 0;  // the video track's
  Transform display;
  std::vector<SampleEntry> entries;
  std::vector<Sample> samples;  // decode order
  bool fragmented = false;
  // The edit list, as one presented range of media time [edit_start, edit_end); no list: all.
  std::optional<std::int64_t> edit_start, edit_end;
  // Matroska: the duration its header gives (in the timescale), and whether the file ends
  // inside a block or a cluster (a copy or download cut short).
  std::optional<std::int64_t> header_end;
  bool cut = false;
};

namespace detail {

class Reader {
 public:
  explicit Reader(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ >= 0) {
      const off_t end = ::lseek(fd_, 0, SEEK_END);
      size_ = end > 0 ? static_cast<std::uint64_t>(end) : 0;
    }
  }
  ~Reader() {
    if (fd_ >= 0) ::close(fd_);
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  bool ok() const { return fd_ >= 0; }
  std::uint64_t size() const { return size_; }
  // Exactly n bytes at `at`, or false.
  bool read(std::uint64_t at, void* out, std::size_t n) const {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(at));
      if (got <= 0) return false;
      p += got;
      at += static_cast<std::uint64_t>(got);
      n -= static_cast<std::size_t>(got);
    }
    return true;
  }
  bool bytes(std::uint64_t at, std::size_t n, std::vector<std::uint8_t>& out) const {
    if (at > size_ || n > size_ - at) return false;
    out.resize(n);
    return n == 0 || read(at, out.data(), n);
  }

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

inline std::uint32_t be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         p[3];
}
inline std::uint64_t be64(const std::uint8_t* p) {
  return (std::uint64_t{be32(p)} << 32) | be32(p + 4);
}
inline std::uint16_t be16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>((p[0] << 8) | p[1]);
}

struct Box {
  std::string type;
  std::uint64_t start = 0, body = 0, end = 0;  // body: after the header
};

// The boxes in [from, to), or false when one is malformed (a size past `to`, below its header).
inline bool boxes(const Reader& r, std::uint64_t from, std::uint64_t to, std::vector<Box>& out) {
  out.clear();
  std::uint64_t at = from;
  for (int guard = 0; at + 8 <= to; ++guard) {
    if (guard > 1000000) return false;
    std::uint8_t h[16];
    if (!r.read(at, h, 8)) return false;
    std::uint64_t size = be32(h);
    std::uint64_t header = 8;
    if (size == 1) {
      if (at + 16 > to || !r.read(at + 8, h + 8, 8)) return false;
      size = be64(h + 8);
      header = 16;
    } else if (size == 0) {
      size = to - at;  // to the end
    }
    if (size < header || size > to - at) {
      out.push_back({std::string(reinterpret_cast<char*>(h + 4), 4), at, at + header, to});
      return false;  // cut short: the caller decides what a cut box means
    }
    out.push_back({std::string(reinterpret_cast<char*>(h + 4), 4), at, at + header, at + size});
    at += size;
  }
  return true;
}

inline const Box* find(const std::vector<Box>& bs, const char* type) {
  for (const auto& b : bs) {
    if (b.type == type) return &b;
  }
  return nullptr;
}

// Emulation-prevention bytes (00 00 03) removed: the RBSP of a NAL unit.
inline std::vector<std::uint8_t> rbsp(const std::uint8_t* p, std::size_t n) {
  std::vector<std::uint8_t> out;
  out.reserve(n);
  int zeros = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (zeros >= 2 && p[i] == 3) {
      zeros = 0;
      continue;
    }
    zeros = p[i] == 0 ? zeros + 1 : 0;
    out.push_back(p[i]);
  }
  return out;
}

class Bits {
 public:
  Bits(const std::vector<std::uint8_t>& d, std::size_t start_byte) : d_(d), pos_(start_byte * 8) {}
  bool failed() const { return failed_; }
  std::uint32_t u(int n) {
    std::uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (pos_ >= d_.size() * 8) {
        failed_ = true;
        return 0;
      }
      v = (v << 1) | ((d_[pos_ / 8] >> (7 - pos_ % 8)) & 1u);
      ++pos_;
    }
    return v;
  }
  void skip(std::size_t n) {
    pos_ += n;
    if (pos_ > d_.size() * 8) failed_ = true;
  }
  std::uint32_t ue() {
    int zeros = 0;
    while (!failed_ && u(1) == 0) {
      if (++zeros > 31) {
        failed_ = true;
        return 0;
      }
    }
    if (zeros == 0) return 0;
    return static_cast<std::uint32_t>((1ull << zeros) - 1 + u(zeros));
  }
  std::int32_t se() {
    const std::uint32_t k = ue();
    return (k & 1) ? static_cast<std::int32_t>((k + 1) / 2) : -static_cast<std::int32_t>(k / 2);
  }

 private:
  const std::vector<std::uint8_t>& d_;
  std::size_t pos_;
  bool failed_ = false;
};

// The cropped picture size an H.264 sequence parameter set describes (the NAL unit with its
// one-byte header), or nullopt.
inline std::optional<Size> h264_sps_size(const std::uint8_t* nal, std::size_t n) {
  if (n < 4 || (nal[0] & 0x1f) != 7) return std::nullopt;
  const std::vector<std::uint8_t> d = rbsp(nal + 1, n - 1);
  Bits b(d, 0);
  const std::uint32_t profile = b.u(8);
  b.u(16);  // constraint flags, level
  b.ue();   // seq_parameter_set_id
  std::uint32_t chroma = 1;
  bool separate_planes = false;
  static constexpr std::array<std::uint32_t, 13> kHigh = {100, 110, 122, 244, 44, 83, 86,
                                                          118, 128, 138, 139, 134, 135};
  if (std::find(kHigh.begin(), kHigh.end(), profile) != kHigh.end()) {
    chroma = b.ue();
    if (chroma == 3) separate_planes = b.u(1) != 0;
    b.ue();  // bit depths
    b.ue();
    b.u(1);
    if (b.u(1)) {  // scaling matrices
      for (int i = 0; i < (chroma != 3 ? 8 : 12) && !b.failed(); ++i) {
        if (!b.u(1)) continue;
        const int count = i < 6 ? 16 : 64;
        int last = 8, next = 8;
        for (int j = 0; j < count && !b.failed(); ++j) {
          if (next != 0) next = (last + b.se() + 256) % 256;
          last = next == 0 ? last : next;
        }
      }
    }
  }
  b.ue();  // log2_max_frame_num_minus4
  const std::uint32_t poc_type = b.ue();
  if (poc_type == 0) {
    b.ue();
  } else if (poc_type == 1) {
    b.u(1);
    b.se();
    b.se();
    const std::uint32_t cycle = b.ue();
    if (cycle > 255) return std::nullopt;
    for (std::uint32_t i = 0; i < cycle; ++i) b.se();
  }
  b.ue();   // max_num_ref_frames
  b.u(1);   // gaps_in_frame_num_value_allowed_flag
  const std::uint32_t w_mbs = b.ue() + 1;
  const std::uint32_t h_units = b.ue() + 1;
  const std::uint32_t frame_mbs_only = b.u(1);
  if (!frame_mbs_only) b.u(1);
  b.u(1);  // direct_8x8_inference_flag
  std::uint32_t left = 0, right = 0, top = 0, bottom = 0;
  if (b.u(1)) {
    left = b.ue();
    right = b.ue();
    top = b.ue();
    bottom = b.ue();
  }
  if (b.failed() || w_mbs > 4096 || h_units > 4096) return std::nullopt;
  const std::uint32_t sub_w = (chroma == 1 || chroma == 2) ? 2 : 1;
  const std::uint32_t sub_h = chroma == 1 ? 2 : 1;
  const std::uint32_t crop_x = (chroma == 0 || separate_planes) ? 1 : sub_w;
  const std::uint32_t crop_y =
      ((chroma == 0 || separate_planes) ? 1 : sub_h) * (2 - frame_mbs_only);
  const std::int64_t w = std::int64_t{w_mbs} * 16 - std::int64_t{crop_x} * (left + right);
  const std::int64_t h =
      std::int64_t{h_units} * 16 * (2 - frame_mbs_only) - std::int64_t{crop_y} * (top + bottom);
  if (w <= 0 || h <= 0) return std::nullopt;
  return Size{static_cast<int>(w), static_cast<int>(h)};
}

// The same for an HEVC sequence parameter set (two-byte NAL header, type 33).
inline std::optional<Size> hevc_sps_size(const std::uint8_t* nal, std::size_t n) {
  if (n < 6 || ((nal[0] >> 1) & 0x3f) != 33) return std::nullopt;
  const std::vector<std::uint8_t> d = rbsp(nal + 2, n - 2);
  Bits b(d, 0);
  b.u(4);  // sps_video_parameter_set_id
  const std::uint32_t sub_layers = b.u(3);
  b.u(1);
  b.skip(96);  // general profile, tier and level
  std::array<bool, 8> profile_present{}, level_present{};
  for (std::uint32_t i = 0; i < sub_layers; ++i) {
    profile_present[i] = b.u(1) != 0;
    level_present[i] = b.u(1) != 0;
  }
  if (sub_layers > 0) {
    for (std::uint32_t i = sub_layers; i < 8; ++i) b.u(2);
  }
  for (std::uint32_t i = 0; i < sub_layers; ++i) {
    if (profile_present[i]) b.skip(88);
    if (level_present[i]) b.skip(8);
  }
  b.ue();  // sps_seq_parameter_set_id
  const std::uint32_t chroma = b.ue();
  if (chroma == 3) b.u(1);
  const std::uint32_t w = b.ue(), h = b.ue();
  std::uint32_t left = 0, right = 0, top = 0, bottom = 0;
  if (b.u(1)) {
    left = b.ue();
    right = b.ue();
    top = b.ue();
    bottom = b.ue();
  }
  if (b.failed() || w == 0 || h == 0 || w > 65536 || h > 65536) return std::nullopt;
  const std::uint32_t sub_w = (chroma == 1 || chroma == 2) ? 2 : 1;
  const std::uint32_t sub_h = chroma == 1 ? 2 : 1;
  const std::int64_t cw = std::int64_t{w} - std::int64_t{sub_w} * (left + right);
  const std::int64_t ch = std::int64_t{h} - std::int64_t{sub_h} * (top + bottom);
  if (cw <= 0 || ch <= 0) return std::nullopt;
  return Size{static_cast<int>(cw), static_cast<int>(ch)};
}

inline bool is_h264(const std::string& f) { return f == "avc1" || f == "avc3"; }
inline bool is_hevc(const std::string& f) { return f == "hvc1" || f == "hev1"; }

inline std::optional<Size> sps_size(const std::string& format, const std::vector<std::uint8_t>& s) {
  if (is_h264(format)) return h264_sps_size(s.data(), s.size());
  if (is_hevc(format)) return hevc_sps_size(s.data(), s.size());
  return std::nullopt;
}

// The 2x2 part of a 3x3 matrix of 16.16 fixed-point values (a, b, u, c, d, v, x, y, w), rounded
// to -1/0/1 where it is a turn or mirror.
inline Transform matrix_transform(const std::uint8_t* m) {
  const double a = static_cast<std::int32_t>(be32(m)) / 65536.0;
  const double b = static_cast<std::int32_t>(be32(m + 4)) / 65536.0;
  const double c = static_cast<std::int32_t>(be32(m + 12)) / 65536.0;
  const double d = static_cast<std::int32_t>(be32(m + 16)) / 65536.0;
  auto unit = [](double v, int& out) {
    if (v > 0.5) out = 1;
    else if (v < -0.5) out = -1;
    else out = 0;
    return std::abs(std::abs(v) - std::abs(static_cast<double>(out))) < 0.01;
  };
  Transform t;
  const bool exact = unit(a, t.a) & unit(b, t.b) & unit(c, t.c) & unit(d, t.d);
  const int det = t.a * t.d - t.b * t.c;
  if (!exact || (det != 1 && det != -1)) return Transform{1, 0, 0, 1, true};
  return t;
}

inline Transform compose(const Transform& first, const Transform& then) {
  // Row vectors: (x y) * first * then.
  Transform t;
  t.a = first.a * then.a + first.b * then.c;
  t.b = first.a * then.b + first.b * then.d;
  t.c = first.c * then.a + first.d * then.c;
  t.d = first.c * then.b + first.d * then.d;
  t.exotic = first.exotic || then.exotic;
  return t;
}

// VP8: the frame tag and, for a key frame, the start code and the 14-bit sizes.
inline std::optional<Size> vp8_key_frame_size(const std::uint8_t* p, std::size_t n) {
  if (n < 10 || (p[0] & 1) != 0 || p[3] != 0x9d || p[4] != 0x01 || p[5] != 0x2a) return std::nullopt;
  const int w = (p[6] | (p[7] << 8)) & 0x3fff, h = (p[8] | (p[9] << 8)) & 0x3fff;
  if (w == 0 || h == 0) return std::nullopt;
  return Size{w, h};
}

// VP8's show_frame bit: a frame the decoder does not output (an alternate reference).
inline bool vp8_shown(const std::uint8_t* p, std::size_t n) {
  return n < 1 || (p[0] & 0x10) != 0;
}

// VP9: the uncompressed header of a key frame (the first frame of a superframe).
inline std::optional<Size> vp9_key_frame_size(const std::uint8_t* p, std::size_t n) {
  const std::vector<std::uint8_t> d(p, p + std::min<std::size_t>(n, 32));
  Bits b(d, 0);
  if (b.u(2) != 2) return std::nullopt;  // frame marker
  const std::uint32_t profile = b.u(1) | (b.u(1) << 1);
  if (profile == 3) b.u(1);
  if (b.u(1)) return std::nullopt;  // show_existing_frame
  if (b.u(1) != 0) return std::nullopt;  // not a key frame
  b.u(1);                                // show_frame
  b.u(1);                                // error_resilient_mode
  if (b.u(24) != 0x498342) return std::nullopt;
  if (profile >= 2) b.u(1);
  const std::uint32_t color_space = b.u(3);
  if (color_space != 7) {
    b.u(1);
    if (profile == 1 || profile == 3) b.u(3);
  } else if (profile == 1 || profile == 3) {
    b.u(1);
  }
  const std::uint32_t w = b.u(16) + 1, h = b.u(16) + 1;
  if (b.failed()) return std::nullopt;
  return Size{static_cast<int>(w), static_cast<int>(h)};
}

// A sequence parameter set among the NAL units (length-prefixed) before the first slice of a
// sample, or a VP8/VP9 key frame's size.
inline std::optional<Size> in_band_size(const Reader& r, const Sample& s, const SampleEntry& e,
                                        std::vector<std::uint8_t>& buf) {
  const std::uint64_t end = s.offset + s.size;
  if (s.offset > r.size() || s.size > r.size() - s.offset) return std::nullopt;
  if (e.format == "vp08" || e.format == "vp09") {
    if (!r.bytes(s.offset, std::min<std::size_t>(s.size, 32), buf)) return std::nullopt;
    return e.format == "vp08" ? vp8_key_frame_size(buf.data(), buf.size())
                              : vp9_key_frame_size(buf.data(), buf.size());
  }
  if (!(is_h264(e.format) || is_hevc(e.format)) || e.nal_length_size <= 0) return std::nullopt;
  std::uint64_t at = s.offset;
  for (int k = 0; k < 16 && at + static_cast<std::uint64_t>(e.nal_length_size) < end; ++k) {
    std::uint8_t h[6] = {};
    if (!r.read(at, h, static_cast<std::size_t>(e.nal_length_size) + 2)) return std::nullopt;
    std::uint64_t len = 0;
    for (int i = 0; i < e.nal_length_size; ++i) len = (len << 8) | h[i];
    const std::uint64_t nal_at = at + static_cast<std::uint64_t>(e.nal_length_size);
    if (len == 0 || len > end - nal_at) return std::nullopt;
    const std::uint8_t head = h[e.nal_length_size];
    const bool h264 = is_h264(e.format);
    const int type = h264 ? (head & 0x1f) : ((head >> 1) & 0x3f);
    const bool sps = h264 ? type == 7 : type == 33;
    const bool slice = h264 ? (type >= 1 && type <= 5) : type < 32;
    if (slice) return std::nullopt;
    if (sps && len < 4096 && r.bytes(nal_at, static_cast<std::size_t>(len), buf)) {
      return sps_size(e.format, buf);
    }
    at = nal_at + len;
  }
  return std::nullopt;
}

// The picture size of each sample: its sample description's, changed by the sequence parameter
// sets that sync samples carry in the stream (H.264/HEVC), or by VP8/VP9 key frames.
inline void fill_picture_sizes(const Reader& r, Info& info) {
  auto entry_size = [&](std::uint32_t desc) -> Size {
    if (desc == 0 || desc > info.entries.size()) return {};
    const SampleEntry& e = info.entries[desc - 1];
    for (const auto& sps : e.sps) {
      if (auto s = sps_size(e.format, sps)) return *s;
    }
    return e.size;
  };
  Size current;
  std::uint32_t current_desc = 0;
  std::vector<std::uint8_t> buf;
  for (auto& s : info.samples) {
    if (s.description != current_desc) {
      current_desc = s.description;
      current = entry_size(s.description);
    }
    if (s.sync && s.description >= 1 && s.description <= info.entries.size()) {
      if (auto found = in_band_size(r, s, info.entries[s.description - 1], buf)) current = *found;
    }
    s.picture = current;
  }
}

class Parser {
 public:
  Parser(const Reader& r, Info& info) : r_(r), info_(info) {}

  void run() {
    std::vector<Box> top;
    const bool whole = boxes(r_, 0, r_.size(), top);
    static const std::array<const char*, 10> known = {"ftyp", "moov", "mdat", "free", "skip",
                                                      "wide", "moof", "styp", "pnot", "uuid"};
    if (top.empty() || std::none_of(known.begin(), known.end(),
                                    [&](const char* k) { return top.front().type == k; })) {
      return;  // not an ISO file: Matroska, WebM, AVI, ...
    }
    info_.iso = true;
    info_.container = "mp4";
    const Box* moov = find(top, "moov");
    if (moov == nullptr || (!whole && moov == &top.back())) {
      info_.problem = moov == nullptr ? "the file has no index (moov box)"
                                      : "the file's index (moov box) is cut short";
      return;
    }
    info_.has_moov = true;
    if (!read_moov(*moov) || !info_.problem.empty()) return;
    if (!info_.has_video) {
      info_.problem = "the file has no video track";
      return;
    }
    if (info_.fragmented) read_fragments(top);
    fill_picture_sizes(r_, info_);
    info_.ok = true;
  }

 private:
  bool fail(const std::string& why) {
    info_.problem = why;
    return false;
  }

  bool body(const Box& b, std::vector<std::uint8_t>& out, std::size_t min_size) {
    if (b.end - b.body > (std::uint64_t{64} << 20)) return fail("a " + b.type + " box is too big");
    if (!r_.bytes(b.body, static_cast<std::size_t>(b.end - b.body), out) || out.size() < min_size) {
      return fail("a " + b.type + " box is malformed");
    }
    return true;
  }

  // A box whose damage only loses what it holds (a decoder configuration): no problem set.
  bool quiet_body(const Box& b, std::vector<std::uint8_t>& out, std::size_t min_size) {
    return b.end - b.body <= (std::uint64_t{1} << 20) &&
           r_.bytes(b.body, static_cast<std::size_t>(b.end - b.body), out) &&
           out.size() >= min_size;
  }

  bool read_moov(const Box& moov) {
    std::vector<Box> kids;
    if (!boxes(r_, moov.body, moov.end, kids)) return fail("the index (moov box) is malformed");
    Transform movie;
    if (const Box* mvhd = find(kids, "mvhd")) {
      std::vector<std::uint8_t> d;
      if (!body(*mvhd, d, 4)) return false;
      // After version and flags: times (32-bit in version 0, 64-bit in 1) with the timescale,
      // then rate (4), volume (2), reserved (10), the matrix (36).
      const std::size_t ts = d[0] == 1 ? 4 + 16 : 4 + 8;
      const std::size_t matrix = d[0] == 1 ? 4 + 28 + 16 : 4 + 16 + 16;
      if (d.size() >= ts + 4) movie_timescale_ = be32(d.data() + ts);
      if (d.size() >= matrix + 36) movie = matrix_transform(d.data() + matrix);
    }
    info_.fragmented = find(kids, "mvex") != nullptr;
    for (const auto& k : kids) {
      if (k.type != "trak") continue;
      if (read_trak(k, movie)) return true;
      if (!info_.problem.empty()) return false;
    }
    return true;
  }

  // True when this is the first video track (read whole).
  bool read_trak(const Box& trak, const Transform& movie) {
    std::vector<Box> kids;
    if (!boxes(r_, trak.body, trak.end, kids)) return false;
    const Box* mdia = find(kids, "mdia");
    const Box* tkhd = find(kids, "tkhd");
    if (mdia == nullptr || tkhd == nullptr) return false;
    std::vector<Box> mkids;
    if (!boxes(r_, mdia->body, mdia->end, mkids)) return false;
    const Box* hdlr = find(mkids, "hdlr");
    const Box* mdhd = find(mkids, "mdhd");
    const Box* minf = find(mkids, "minf");
    if (!hdlr || !mdhd || !minf) return false;
    std::vector<std::uint8_t> d;
    if (!body(*hdlr, d, 12)) return false;
    if (std::string(reinterpret_cast<char*>(d.data() + 8), 4) != "vide") return false;
    info_.has_video = true;
    if (!body(*tkhd, d, 4)) return false;
    track_id_ = d[0] == 1 ? be32(d.data() + 4 + 16) : be32(d.data() + 4 + 8);
    const std::size_t matrix = d[0] == 1 ? 4 + 8 + 8 + 4 + 4 + 8 + 8 + 2 + 2 + 2 + 2
                                         : 4 + 4 + 4 + 4 + 4 + 4 + 8 + 2 + 2 + 2 + 2;
    if (d.size() < matrix + 36) return fail("the video track's header (tkhd) is malformed");
    info_.display = compose(matrix_transform(d.data() + matrix), movie);
    if (!body(*mdhd, d, 4)) return false;
    info_.timescale = d[0] == 1 ? (d.size() >= 24 ? be32(d.data() + 20) : 0)
                                : (d.size() >= 16 ? be32(d.data() + 12) : 0);
    if (info_.timescale == 0) return fail("the video track has no timescale");
    if (const Box* edts = find(kids, "edts")) read_edits(*edts);
    std::vector<Box> ikids;
    if (!boxes(r_, minf->body, minf->end, ikids)) return fail("the video track is malformed");
    const Box* stbl = find(ikids, "stbl");
    if (stbl == nullptr) return fail("the video track has no sample table");
    read_stbl(*stbl);  // a malformed table sets the problem
    return true;
  }

  void read_edits(const Box& edts) {
    std::vector<Box> kids;
    if (!boxes(r_, edts.body, edts.end, kids)) return;
    const Box* elst = find(kids, "elst");
    std::vector<std::uint8_t> d;
    if (elst == nullptr || !body(*elst, d, 8)) return;
    const bool v1 = d[0] == 1;
    const std::uint32_t n = be32(d.data() + 4);
    const std::size_t each = v1 ? 20 : 12;
    if (n > (d.size() - 8) / each) return;
    // The presented media range: the first and last non-empty edits (players show those; empty
    // edits are a delay before the first frame).
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint8_t* e = d.data() + 8 + i * each;
      const std::uint64_t duration = v1 ? be64(e) : be32(e);
      const std::int64_t media_time =
          v1 ? static_cast<std::int64_t>(be64(e + 8)) : static_cast<std::int32_t>(be32(e + 4));
      if (media_time < 0) continue;  // an empty edit
      edits_.push_back({media_time, duration});
    }
  }

  bool read_stbl(const Box& stbl) {
    std::vector<Box> kids;
    if (!boxes(r_, stbl.body, stbl.end, kids)) return fail("the sample table is malformed");
    std::vector<std::uint8_t> d;
    if (const Box* stsd = find(kids, "stsd")) {
      if (!body(*stsd, d, 8)) return false;
      read_entries(*stsd);
    }
    const Box* stsz = find(kids, "stsz");
    const Box* stco = find(kids, "stco");
    const Box* co64 = find(kids, "co64");
    const Box* stsc = find(kids, "stsc");
    const Box* stts = find(kids, "stts");
    if (!stsz || !stsc || !stts || !(stco || co64)) {
      if (info_.fragmented) return true;  // samples come in fragments
      return fail("the video track's sample table is incomplete");
    }
    // Sizes.
    if (!body(*stsz, d, 12)) return false;
    const std::uint32_t fixed = be32(d.data() + 4);
    const std::uint32_t count = be32(d.data() + 8);
    if (count > r_.size()) return fail("the sample table lists more samples than the file has bytes");
    if (fixed == 0 && count > (d.size() - 12) / 4) return fail("the sample sizes are cut short");
    std::vector<Sample> s(count);
    for (std::uint32_t i = 0; i < count; ++i) s[i].size = fixed ? fixed : be32(d.data() + 12 + 4 * i);
    // Offsets: chunks, and samples per chunk.
    std::vector<std::uint64_t> chunks;
    if (stco) {
      if (!body(*stco, d, 8)) return false;
      const std::uint32_t n = be32(d.data() + 4);
      if (n > (d.size() - 8) / 4) return fail("the chunk offsets are cut short");
      for (std::uint32_t i = 0; i < n; ++i) chunks.push_back(be32(d.data() + 8 + 4 * i));
    } else {
      if (!body(*co64, d, 8)) return false;
      const std::uint32_t n = be32(d.data() + 4);
      if (n > (d.size() - 8) / 8) return fail("the chunk offsets are cut short");
      for (std::uint32_t i = 0; i < n; ++i) chunks.push_back(be64(d.data() + 8 + 8 * i));
    }
    if (!body(*stsc, d, 8)) return false;
    const std::uint32_t runs = be32(d.data() + 4);
    if (runs > (d.size() - 8) / 12) return fail("the sample-to-chunk table is cut short");
    std::size_t next = 0;
    for (std::uint32_t i = 0; i < runs && next < count; ++i) {
      const std::uint8_t* e = d.data() + 8 + 12 * i;
      const std::uint32_t first = be32(e), per = be32(e + 4), desc = be32(e + 8);
      const std::uint32_t last = i + 1 < runs ? be32(e + 12) : static_cast<std::uint32_t>(chunks.size() + 1);
      if (first == 0 || last < first) return fail("the sample-to-chunk table is malformed");
      for (std::uint32_t c = first; c < last && c <= chunks.size() && next < count; ++c) {
        std::uint64_t at = chunks[c - 1];
        for (std::uint32_t k = 0; k < per && next < count; ++k) {
          s[next].offset = at;
          s[next].description = desc;
          at += s[next].size;
          ++next;
        }
      }
    }
    if (next < count) return fail("the sample table places only " + std::to_string(next) + " of " +
                                  std::to_string(count) + " samples");
    // Times.
    if (!body(*stts, d, 8)) return false;
    const std::uint32_t deltas = be32(d.data() + 4);
    if (deltas > (d.size() - 8) / 8) return fail("the sample times are cut short");
    std::size_t i = 0;
    std::int64_t t = 0;
    for (std::uint32_t k = 0; k < deltas && i < count; ++k) {
      const std::uint32_t n = be32(d.data() + 8 + 8 * k), delta = be32(d.data() + 12 + 8 * k);
      for (std::uint32_t j = 0; j < n && i < count; ++j, ++i) {
        s[i].dts = t;
        s[i].pts = t;
        s[i].duration = delta;
        t += delta;
      }
    }
    for (; i < count; ++i) s[i].dts = s[i].pts = t;
    if (const Box* ctts = find(kids, "ctts")) {
      if (!body(*ctts, d, 8)) return false;
      const std::uint32_t n = be32(d.data() + 4);
      if (n > (d.size() - 8) / 8) return fail("the composition offsets are cut short");
      std::size_t at = 0;
      for (std::uint32_t k = 0; k < n && at < count; ++k) {
        const std::uint32_t run = be32(d.data() + 8 + 8 * k);
        // Version 1 offsets are signed; version 0 ones are too in practice (FFmpeg reads them so).
        const auto off = static_cast<std::int32_t>(be32(d.data() + 12 + 8 * k));
        for (std::uint32_t j = 0; j < run && at < count; ++j, ++at) s[at].pts = s[at].dts + off;
      }
    }
    if (const Box* stss = find(kids, "stss")) {
      if (!body(*stss, d, 8)) return false;
      const std::uint32_t n = be32(d.data() + 4);
      if (n > (d.size() - 8) / 4) return fail("the sync sample table is cut short");
      for (auto& x : s) x.sync = false;
      for (std::uint32_t k = 0; k < n; ++k) {
        const std::uint32_t idx = be32(d.data() + 8 + 4 * k);
        if (idx >= 1 && idx <= count) s[idx - 1].sync = true;
      }
    }
    info_.samples = std::move(s);
    apply_edits();
    return true;
  }

  // The presented media range: from the first non-empty edit's start to the last one's end
  // (an empty edit is a delay before the first frame, not a cut).
  void apply_edits() {
    if (edits_.empty()) return;
    info_.edit_start = edits_.front().media_time;
    const Edit& last = edits_.back();
    if (movie_timescale_ > 0 && last.duration > 0) {
      const long double media = static_cast<long double>(last.duration) * info_.timescale /
                                movie_timescale_;
      info_.edit_end = last.media_time + static_cast<std::int64_t>(media + 0.5L);
    }
  }

  void read_entries(const Box& stsd) {
    std::vector<Box> list;
    boxes(r_, stsd.body + 8, stsd.end, list);
    for (const auto& e : list) {
      SampleEntry entry;
      entry.format = e.type;
      std::vector<std::uint8_t> d;
      // VisualSampleEntry: 6 reserved, data_reference_index, 16 bytes, width, height, ... (70
      // bytes after the box header), then its own boxes.
      if (e.end - e.body >= 78 && e.end - e.body < (std::uint64_t{1} << 20) &&
          r_.bytes(e.body, static_cast<std::size_t>(e.end - e.body), d)) {
        entry.size = {be16(d.data() + 24), be16(d.data() + 26)};
        std::vector<Box> kids;
        boxes(r_, e.body + 78, e.end, kids);
        std::vector<std::uint8_t> c;
        if (const Box* avcc = find(kids, "avcC"); avcc && is_h264(entry.format) &&
                                                  quiet_body(*avcc, c, 6)) {
          entry.nal_length_size = (c[4] & 3) + 1;
          std::size_t at = 6;
          const int n = c[5] & 0x1f;
          for (int k = 0; k < n && at + 2 <= c.size(); ++k) {
            const std::size_t len = be16(c.data() + at);
            if (at + 2 + len > c.size()) break;
            entry.sps.emplace_back(c.begin() + static_cast<std::ptrdiff_t>(at + 2),
                                   c.begin() + static_cast<std::ptrdiff_t>(at + 2 + len));
            at += 2 + len;
          }
        } else if (const Box* hvcc = find(kids, "hvcC"); hvcc && is_hevc(entry.format) &&
                                                         quiet_body(*hvcc, c, 23)) {
          entry.nal_length_size = (c[21] & 3) + 1;
          std::size_t at = 23;
          for (int arr = 0; arr < c[22] && at + 3 <= c.size(); ++arr) {
            const int type = c[at] & 0x3f;
            const std::size_t n = be16(c.data() + at + 1);
            at += 3;
            for (std::size_t k = 0; k < n && at + 2 <= c.size(); ++k) {
              const std::size_t len = be16(c.data() + at);
              if (at + 2 + len > c.size()) break;
              if (type == 33) {
                entry.sps.emplace_back(c.begin() + static_cast<std::ptrdiff_t>(at + 2),
                                       c.begin() + static_cast<std::ptrdiff_t>(at + 2 + len));
              }
              at += 2 + len;
            }
          }
        }
      }
      info_.entries.push_back(std::move(entry));
    }
  }

  // Fragmented files (moof/traf/trun after the moov): the video track's samples, with the
  // defaults of its trex and tfhd.
  void read_fragments(const std::vector<Box>& top) {
    std::uint32_t def_duration = 0, def_size = 0, def_desc = 1;
    std::int64_t t = 0;
    for (const auto& b : top) {
      if (b.type != "moof") continue;
      std::vector<Box> trafs;
      if (!boxes(r_, b.body, b.end, trafs)) break;
      for (const auto& traf : trafs) {
        if (traf.type != "traf") continue;
        std::vector<Box> kids;
        if (!boxes(r_, traf.body, traf.end, kids)) break;
        const Box* tfhd = find(kids, "tfhd");
        std::vector<std::uint8_t> d;
        if (tfhd == nullptr || !quiet_body(*tfhd, d, 8) || be32(d.data() + 4) != track_id_) {
          continue;
        }
        const std::uint32_t flags = be32(d.data()) & 0xffffff;
        std::size_t at = 8;
        std::uint64_t base = b.start;  // default-base-is-moof (and what FFmpeg assumes)
        auto take = [&](std::uint32_t& v) {
          if (at + 4 <= d.size()) v = be32(d.data() + at);
          at += 4;
        };
        if (flags & 0x1) {
          if (at + 8 <= d.size()) base = be64(d.data() + at);
          at += 8;
        }
        std::uint32_t desc = def_desc, dur = def_duration, size = def_size, sflags = 0;
        if (flags & 0x2) take(desc);
        if (flags & 0x8) take(dur);
        if (flags & 0x10) take(size);
        if (flags & 0x20) take(sflags);
        if (const Box* tfdt = find(kids, "tfdt"); tfdt && quiet_body(*tfdt, d, 8)) {
          t = d[0] == 1 && d.size() >= 12 ? static_cast<std::int64_t>(be64(d.data() + 4))
                                          : static_cast<std::int64_t>(be32(d.data() + 4));
        }
        for (const auto& k : kids) {
          if (k.type != "trun" || !quiet_body(k, d, 8)) continue;
          const std::uint32_t tf = be32(d.data()) & 0xffffff;
          const std::uint32_t n = be32(d.data() + 4);
          std::size_t p = 8;
          std::int32_t data_offset = 0;
          if (tf & 0x1) {
            if (p + 4 <= d.size()) data_offset = static_cast<std::int32_t>(be32(d.data() + p));
            p += 4;
          }
          if (tf & 0x4) p += 4;
          const std::size_t each = 4 * (((tf >> 8) & 1) + ((tf >> 9) & 1) + ((tf >> 10) & 1) +
                                        ((tf >> 11) & 1));
          if (each && n > (d.size() - std::min(p, d.size())) / each) break;
          if (n > r_.size()) break;
          std::uint64_t off = base + static_cast<std::uint64_t>(static_cast<std::int64_t>(data_offset));
          for (std::uint32_t j = 0; j < n; ++j) {
            Sample s;
            s.description = desc;
            s.duration = dur;
            s.size = size;
            std::int32_t cto = 0;
            if (tf & 0x100) { s.duration = be32(d.data() + p); p += 4; }
            if (tf & 0x200) { s.size = be32(d.data() + p); p += 4; }
            if (tf & 0x400) p += 4;
            if (tf & 0x800) { cto = static_cast<std::int32_t>(be32(d.data() + p)); p += 4; }
            s.dts = t;
            s.pts = t + cto;
            s.offset = off;
            off += s.size;
            t += s.duration;
            info_.samples.push_back(s);
          }
        }
      }
    }
  }

  struct Edit {
    std::int64_t media_time;
    std::uint64_t duration;  // movie timescale
  };
  const Reader& r_;
  Info& info_;
  std::uint32_t track_id_ = 0;
  std::uint32_t movie_timescale_ = 0;
  std::vector<Edit> edits_;
};

}  // namespace detail

inline Info read_info(const std::string& path) {
  Info info;
  detail::Reader r(path);
  if (!r.ok()) return info;
  info.file_size = r.size();
  detail::Parser(r, info).run();
  return info;
}

// The frames a player shows: the samples at or after the edit list's start, in presentation
// order (what FFmpeg decodes and outputs, the hidden head of a `-ss ... -c copy` trim left out).
inline std::vector<const Sample*> presented(const Info& info) {
  std::vector<const Sample*> out;
  out.reserve(info.samples.size());
  for (const auto& s : info.samples) {
    if (s.shown && (!info.edit_start || s.pts >= *info.edit_start) &&
        (!info.edit_end || s.pts < *info.edit_end)) {
      out.push_back(&s);
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Sample* x, const Sample* y) { return x->pts < y->pts; });
  return out;
}

// How many samples (decode order) have all their data inside the file: fewer than
// info.samples.size() for a copy or download cut short.
inline std::size_t complete_samples(const Info& info) {
  std::size_t n = 0;
  for (const auto& s : info.samples) {
    if (s.offset > info.file_size || s.size > info.file_size - s.offset) break;
    ++n;
  }
  return n;
}

}  // namespace sapiens_seg::cli::mp4
