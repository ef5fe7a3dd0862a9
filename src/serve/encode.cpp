#include "serve/encode.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cstring>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "formats/npy.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::serve {

namespace {

std::string png_bytes(const cv::Mat& image) {
  std::vector<std::uint8_t> buf;
  if (!cv::imencode(".png", image, buf)) {
    throw Error(ErrorCode::kInternal, "PNG encoding failed");
  }
  return {reinterpret_cast<const char*>(buf.data()), buf.size()};
}

void check_labels(const Result& r) {
  if (r.height <= 0 || r.width <= 0 ||
      r.labels.size() != static_cast<std::size_t>(r.height) * static_cast<std::size_t>(r.width)) {
    throw Error(ErrorCode::kInvalidInput, "the label map does not hold height x width labels");
  }
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// The class an item names: an index, the exact name, or the one name equal to it ignoring case.
std::size_t class_index(std::string_view raw, const std::vector<std::string>& names) {
  const std::string_view item = trim(raw);
  if (item.empty()) throw Error(ErrorCode::kInvalidInput, "classes: an empty item");
  std::size_t index = 0;
  const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), index);
  if (ec == std::errc() && end == item.data() + item.size()) {
    if (index < names.size()) return index;
    throw Error(ErrorCode::kInvalidInput, "classes: index " + std::string(item) +
                                              " is out of range (the model has " +
                                              std::to_string(names.size()) + " classes)");
  }
  for (std::size_t k = 0; k < names.size(); ++k) {
    if (names[k] == item) return k;
  }
  std::size_t found = 0, matches = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    if (iequal(names[k], item)) {
      found = k;
      ++matches;
    }
  }
  if (matches == 1) return found;  // two names equal but for case: neither is meant surely
  // The item may be anything a client sent: say which, but bounded and printable.
  std::string shown(item.substr(0, 64));
  for (char& c : shown) {
    if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
  }
  throw Error(ErrorCode::kInvalidInput,
              "classes: no class '" + shown + "' (see the model's classes in /v1/models)");
}

}  // namespace

std::string labels_png(const Result& result) {
  check_labels(result);
  const cv::Mat labels(result.height, result.width, CV_8UC1,
                       const_cast<std::uint8_t*>(result.labels.data()));
  return png_bytes(labels);
}

std::string labels_npy(const Result& result) {
  check_labels(result);
  return formats::labels_npy(result.labels.data(), result.height, result.width);
}

ClassSet parse_classes(std::string_view spec, const std::vector<std::string>& names) {
  if (trim(spec).empty()) return {};
  std::vector<std::string> items;
  for (std::size_t start = 0;;) {
    const std::size_t comma = spec.find(',', start);
    items.emplace_back(spec.substr(start, comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return parse_classes(items, names);
}

ClassSet parse_classes(const std::vector<std::string>& items,
                       const std::vector<std::string>& names) {
  if (items.empty()) return {};
  ClassSet shown(names.size(), false);
  for (const auto& item : items) shown[class_index(item, names)] = true;
  return shown;
}

std::string overlay_png(const Result& result, ImageView image, float opacity,
                        const ClassSet& shown) {
  check_labels(result);
  Image ov = overlay(result, image, opacity);
  if (!shown.empty()) {
    const std::size_t stride =
        image.stride != 0 ? image.stride : static_cast<std::size_t>(image.width) * 3;
    for (int y = 0; y < result.height; ++y) {
      const std::uint8_t* src = image.data + static_cast<std::size_t>(y) * stride;
      std::uint8_t* dst = ov.rgb.data() + static_cast<std::size_t>(y) * result.width * 3;
      const std::uint8_t* l = result.labels.data() + static_cast<std::size_t>(y) * result.width;
      for (int x = 0; x < result.width; ++x) {
        if (l[x] >= shown.size() || !shown[l[x]]) std::memcpy(dst + 3 * x, src + 3 * x, 3);
      }
    }
  }
  const cv::Mat rgb(ov.height, ov.width, CV_8UC3, ov.rgb.data());
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);  // the CLI writes the overlay with cv::imwrite
  ov.rgb = {};
  return png_bytes(bgr);
}

std::vector<std::vector<std::uint32_t>> rle_counts(const Result& result, const ClassSet& wanted) {
  check_labels(result);
  const std::size_t classes = wanted.size();
  std::vector<std::vector<std::uint32_t>> counts(classes);
  std::vector<std::uint32_t> start(classes, 0);  // where each class's current run began
  const auto h = static_cast<std::size_t>(result.height);
  const auto w = static_cast<std::size_t>(result.width);
  const std::uint8_t* labels = result.labels.data();
  // A run of class k ends where the label changes into or out of k, so only the two classes at
  // a change are touched: one pass serves every class.
  std::size_t prev = SIZE_MAX;
  std::uint32_t i = 0;
  for (std::size_t x = 0; x < w; ++x) {
    for (std::size_t y = 0; y < h; ++y, ++i) {
      const std::size_t l = labels[y * w + x];
      if (l == prev) continue;
      if (prev < classes && wanted[prev]) {
        counts[prev].push_back(i - start[prev]);
        start[prev] = i;
      }
      if (l < classes && wanted[l]) {
        counts[l].push_back(i - start[l]);
        start[l] = i;
      }
      prev = l;
    }
  }
  for (std::size_t k = 0; k < classes; ++k) {
    if (wanted[k]) counts[k].push_back(i - start[k]);
  }
  return counts;
}

std::string rle_string(const std::vector<std::uint32_t>& counts) {
  // pycocotools' text form: each count (from the third on, as the difference to the count two
  // before) in 5-bit groups, low first, as characters from '0'; 0x20 marks "more follows".
  std::string s;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    long long x = counts[i];
    if (i > 2) x -= static_cast<long long>(counts[i - 2]);
    for (bool more = true; more;) {
      long long c = x & 0x1f;
      x >>= 5;  // arithmetic: a negative difference ends at -1
      more = (c & 0x10) != 0 ? x != -1 : x != 0;
      if (more) c |= 0x20;
      s.push_back(static_cast<char>(c + 48));
    }
  }
  return s;
}

std::string summary_json(const Result& result, const SummaryOptions& options) {
  check_labels(result);
  const std::size_t classes = result.classes.size();
  std::vector<std::uint64_t> pixels(classes, 0);
  std::vector<int> x0(classes, INT_MAX), y0(classes, INT_MAX), x1(classes, -1), y1(classes, -1);
  for (int y = 0; y < result.height; ++y) {
    const std::uint8_t* row = result.labels.data() + static_cast<std::size_t>(y) * result.width;
    for (int x = 0; x < result.width; ++x) {
      const std::size_t l = row[x];
      if (l >= classes) {
        throw Error(ErrorCode::kInternal, "label " + std::to_string(l) + " but the model has " +
                                              std::to_string(classes) + " classes");
      }
      ++pixels[l];
      x0[l] = std::min(x0[l], x);
      x1[l] = std::max(x1[l], x);
      y0[l] = std::min(y0[l], y);
      y1[l] = std::max(y1[l], y);
    }
  }
  ClassSet reported(classes, false);
  for (std::size_t k = 0; k < classes; ++k) {
    reported[k] =
        pixels[k] > 0 && (options.shown.empty() || (k < options.shown.size() && options.shown[k]));
  }
  std::vector<std::vector<std::uint32_t>> rle;
  if (options.rle) rle = rle_counts(result, reported);

  using Json = nlohmann::ordered_json;
  const double area = static_cast<double>(result.width) * static_cast<double>(result.height);
  Json list = Json::array();
  for (std::size_t k = 0; k < classes; ++k) {
    if (!reported[k]) continue;
    Json c = {{"index", k},
              {"name", result.classes[k]},
              {"color",
               k < result.palette.size()
                   ? Json::array({result.palette[k][0], result.palette[k][1], result.palette[k][2]})
                   : Json::array({0, 0, 0})},
              {"pixels", pixels[k]},
              {"fraction", static_cast<double>(pixels[k]) / area},
              {"bbox", {x0[k], y0[k], x1[k] - x0[k] + 1, y1[k] - y0[k] + 1}}};
    if (options.rle) {
      c["rle"] = {{"size", {result.height, result.width}}, {"counts", rle_string(rle[k])}};
    }
    list.push_back(std::move(c));
  }
  const Timings& t = result.timings;
  const Json out = {{"model", options.model},
                    {"width", result.width},
                    {"height", result.height},
                    {"backend",
                     {{"mode", result.backend.mode},
                      {"device", result.backend.device},
                      {"dtype", result.backend.dtype}}},
                    {"classes", std::move(list)},
                    {"timings_ms",
                     {{"decode", t.decode},
                      {"preprocess", t.preprocess},
                      {"network", t.network},
                      {"postprocess", t.postprocess},
                      {"total", t.total},
                      {"queue", options.queue_ms}}},
                    {"warnings", result.warnings}};
  // Replace, not throw, on invalid UTF-8: a class name or a decoder warning is not the client's
  // fault and must not turn a result into an error.
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace sapiens_seg::serve
