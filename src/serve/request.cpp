#include "serve/request.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>

namespace sapiens_seg::serve {

namespace {

[[noreturn]] void bad(const std::string& message) {
  throw HttpError(400, ErrorCode::kInvalidInput, message);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A client's text in an error message: bounded and printable.
std::string printable(std::string_view s) {
  std::string out(s.substr(0, 64));
  for (char& c : out) {
    if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
  }
  return "'" + out + (s.size() > 64 ? "...'" : "'");
}

Output parse_output(std::string_view v) {
  if (v == "png") return Output::kPng;
  if (v == "json") return Output::kJson;
  if (v == "npy") return Output::kNpy;
  if (v == "overlay") return Output::kOverlay;
  bad("output: " + printable(v) + " is not one of png, json, npy, overlay");
}

bool parse_bool(std::string_view name, std::string_view v) {
  const std::string l = lower(v);
  if (l == "true" || l == "1") return true;
  if (l == "false" || l == "0") return false;
  bad(std::string(name) + ": " + printable(v) + " is not true or false");
}

float check_opacity(double v, std::string_view text) {
  if (!(v >= 0.0 && v <= 1.0)) bad("opacity: " + printable(text) + " is not a number in [0, 1]");
  return static_cast<float>(v);
}

float parse_opacity(std::string_view v) {
  double d = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (ec != std::errc() || end != v.data() + v.size()) {
    bad("opacity: " + printable(v) + " is not a number in [0, 1]");
  }
  return check_opacity(d, v);
}

std::vector<std::string> split_list(std::string_view v) {
  std::vector<std::string> items;
  if (v.empty()) return items;
  for (std::size_t start = 0;;) {
    const std::size_t comma = v.find(',', start);
    items.emplace_back(v.substr(start, comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return items;
}

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%') {
      if (i + 2 >= s.size()) bad("query: a truncated %-escape");
      const int a = hex(s[i + 1]), b = hex(s[i + 2]);
      if (a < 0 || b < 0) bad("query: a malformed %-escape");
      out.push_back(static_cast<char>(a * 16 + b));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The media type (lower case) and its parameters (names lower case, values unquoted).
struct MediaType {
  std::string type;
  std::map<std::string, std::string> params;
};

MediaType parse_media_type(std::string_view header) {
  MediaType m;
  const std::size_t semi = header.find(';');
  m.type = lower(trim(header.substr(0, semi)));
  std::string_view rest = semi == std::string_view::npos ? "" : header.substr(semi + 1);
  while (!rest.empty()) {
    std::size_t end = 0;
    const std::size_t eq = rest.find('=');
    if (eq == std::string_view::npos) break;
    const std::string name = lower(trim(rest.substr(0, eq)));
    std::string_view value = rest.substr(eq + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    std::string v;
    if (!value.empty() && value.front() == '"') {
      std::size_t i = 1;
      for (; i < value.size() && value[i] != '"'; ++i) {
        if (value[i] == '\\' && i + 1 < value.size()) ++i;
        v.push_back(value[i]);
      }
      end = value.find(';', i);
    } else {
      end = value.find(';');
      v = std::string(trim(value.substr(0, end)));
    }
    m.params[name] = v;
    if (end == std::string_view::npos) break;
    rest = value.substr(end + 1);
  }
  return m;
}

// The body of the one part named "image" of a multipart/form-data body (RFC 7578).
std::string multipart_image(const MediaType& type, std::string_view body) {
  const auto it = type.params.find("boundary");
  if (it == type.params.end() || it->second.empty() || it->second.size() > 70) {
    bad("multipart/form-data: no valid boundary parameter");
  }
  const std::string delimiter = "--" + it->second;
  std::size_t at = body.find(delimiter);
  if (at == std::string_view::npos) bad("multipart/form-data: the boundary never occurs");
  std::optional<std::string_view> image;
  for (;;) {
    at += delimiter.size();
    if (body.substr(at, 2) == "--") break;  // the closing delimiter
    if (body.substr(at, 2) != "\r\n") bad("multipart/form-data: a malformed delimiter line");
    at += 2;
    const std::size_t head_end = body.find("\r\n\r\n", at);
    if (head_end == std::string_view::npos) bad("multipart/form-data: a part without headers' end");
    const std::string_view headers = body.substr(at, head_end - at);
    const std::size_t data = head_end + 4;
    const std::size_t next = body.find("\r\n" + delimiter, data);
    if (next == std::string_view::npos) bad("multipart/form-data: a part is not closed");
    std::string name;
    for (std::size_t line = 0; line <= headers.size();) {
      std::size_t eol = headers.find("\r\n", line);
      if (eol == std::string_view::npos) eol = headers.size();
      const std::string_view h = headers.substr(line, eol - line);
      const std::size_t colon = h.find(':');
      if (colon != std::string_view::npos &&
          lower(trim(h.substr(0, colon))) == "content-disposition") {
        const MediaType d = parse_media_type(h.substr(colon + 1));
        if (const auto n = d.params.find("name"); n != d.params.end()) name = n->second;
      }
      line = eol + 2;
    }
    if (name == "image") {
      if (image) bad("multipart/form-data: more than one part named image");
      image = body.substr(data, next - data);
    }
    at = next + 2;
  }
  if (!image) bad("multipart/form-data: no part named image");
  return std::string(*image);
}

void read_json(std::string_view body, SegmentRequest& r) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("the JSON body does not parse: ") + e.what());
  }
  if (!j.is_object()) bad("the JSON body must be an object with an \"image\" field");
  const auto image = j.find("image");
  if (image == j.end() || !image->is_string()) {
    bad("the JSON body needs \"image\": the base64 of the encoded image");
  }
  auto decoded = base64_decode(image->get_ref<const std::string&>());
  if (!decoded) bad("\"image\" is not valid base64");
  r.image = std::move(*decoded);
  for (auto& [key, value] : j.items()) {
    if (key == "model") {
      if (!value.is_string()) bad("\"model\" must be a string");
      r.model = value.get<std::string>();
    } else if (key == "output") {
      if (!value.is_string()) bad("\"output\" must be a string");
      r.output = parse_output(value.get_ref<const std::string&>());
    } else if (key == "classes") {
      if (value.is_string()) {
        r.classes = split_list(value.get_ref<const std::string&>());
      } else if (value.is_array()) {
        r.classes.clear();
        for (const auto& item : value) {
          if (item.is_string()) {
            r.classes.push_back(item.get<std::string>());
          } else if (item.is_number_unsigned()) {
            r.classes.push_back(std::to_string(item.get<std::uint64_t>()));
          } else {
            bad("\"classes\" items must be class names or indices");
          }
        }
      } else {
        bad("\"classes\" must be a string or a list");
      }
    } else if (key == "rle") {
      if (!value.is_boolean()) bad("\"rle\" must be true or false");
      r.rle = value.get<bool>();
    } else if (key == "opacity") {
      if (!value.is_number()) bad("\"opacity\" must be a number in [0, 1]");
      r.opacity = check_opacity(value.get<double>(), value.dump());
    }
  }
}

}  // namespace

std::string_view to_string(Output o) {
  switch (o) {
    case Output::kPng:
      return "png";
    case Output::kJson:
      return "json";
    case Output::kNpy:
      return "npy";
    case Output::kOverlay:
      return "overlay";
  }
  return "png";
}

std::map<std::string, std::string> parse_query(std::string_view query) {
  std::map<std::string, std::string> out;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    if (!pair.empty()) {
      const std::size_t eq = pair.find('=');
      out[percent_decode(pair.substr(0, eq))] =
          eq == std::string_view::npos ? std::string() : percent_decode(pair.substr(eq + 1));
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return out;
}

void apply_query(const std::map<std::string, std::string>& q, SegmentRequest& r) {
  if (const auto it = q.find("model"); it != q.end()) r.model = it->second;
  if (const auto it = q.find("output"); it != q.end()) r.output = parse_output(it->second);
  if (const auto it = q.find("classes"); it != q.end()) r.classes = split_list(it->second);
  if (const auto it = q.find("rle"); it != q.end()) r.rle = parse_bool("rle", it->second);
  if (const auto it = q.find("opacity"); it != q.end()) r.opacity = parse_opacity(it->second);
}

void read_body(std::string_view content_type, std::string body, SegmentRequest& r) {
  const MediaType type = parse_media_type(content_type);
  // No Content-Type at all: RFC 9110 lets a recipient take the body as octet-stream.
  if (type.type.empty() || type.type == "application/octet-stream" ||
      type.type.rfind("image/", 0) == 0) {
    r.image = std::move(body);
  } else if (type.type == "multipart/form-data") {
    r.image = multipart_image(type, body);
  } else if (type.type == "application/json") {
    read_json(body, r);
  } else {
    throw HttpError(415, ErrorCode::kInvalidInput,
                    "Content-Type " + printable(type.type) +
                        ": send the image's bytes as image/* or application/octet-stream, "
                        "multipart/form-data with an image part, or application/json",
                    "unsupported_media_type");
  }
  if (r.image.empty()) bad("the request carries no image bytes");
}

std::optional<std::string> base64_decode(std::string_view text) {
  static const std::array<int, 256> kValue = [] {
    std::array<int, 256> v{};
    v.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int k = 0; k < 64; ++k) v[static_cast<unsigned char>(alphabet[k])] = k;
    return v;
  }();
  std::string out;
  out.reserve(text.size() / 4 * 3 + 3);
  std::uint32_t acc = 0;
  int bits = 0, pad = 0;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      ++pad;
      continue;
    }
    if (pad > 0 || kValue[c] < 0) return std::nullopt;  // data after padding, or not base64
    acc = (acc << 6) | static_cast<std::uint32_t>(kValue[c]);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  // 6 leftover bits cannot end a quantum; padding, when present, must complete the last one.
  if (bits >= 6 || pad > 2 || (pad > 0 && (bits / 2) != pad)) return std::nullopt;
  return out;
}

std::string sniff_format(std::string_view b) {
  auto starts = [&](std::string_view magic) { return b.substr(0, magic.size()) == magic; };
  if (starts("\xff\xd8\xff")) return "JPEG";
  if (starts("\x89PNG\r\n\x1a\n")) return "PNG";
  if (starts("RIFF") && b.size() >= 12 && b.substr(8, 4) == "WEBP") return "WebP";
  if (starts(std::string_view("II*\0", 4)) || starts(std::string_view("MM\0*", 4))) return "TIFF";
  if (starts("BM")) return "BMP";
  if (b.size() >= 2 && b[0] == 'P' && b[1] >= '1' && b[1] <= '6') return "PNM";
  return "";
}

}  // namespace sapiens_seg::serve
