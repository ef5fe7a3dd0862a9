#include "json_paths.hpp"

#include <cstdint>
#include <cstdio>

namespace sapiens_seg::cli {
namespace {

// Length of the valid UTF-8 sequence (RFC 3629: no overlong forms, no surrogates, at most
// U+10FFFF) that starts at s[i], or 0.
std::size_t sequence_length(std::string_view s, std::size_t i) noexcept {
  const auto byte = [&](std::size_t k) -> unsigned {
    return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0x100u;
  };
  const auto cont = [&](std::size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return byte(k) >= lo && byte(k) <= hi;
  };
  const unsigned c = byte(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
  if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool is_valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string display_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = sequence_length(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      char esc[5];
      std::snprintf(esc, sizeof esc, "\\x%02X", static_cast<unsigned char>(s[i]));
      out += esc;
      ++i;
    }
  }
  return out;
}

std::string plain_text(std::string_view s, bool keep_newlines) {
  std::string out;
  out.reserve(s.size());
  auto escape = [&](std::string_view bytes) {
    for (const char c : bytes) {
      char esc[5];
      std::snprintf(esc, sizeof esc, "\\x%02X", static_cast<unsigned char>(c));
      out += esc;
    }
  };
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = sequence_length(s, i);
    const std::string_view seq = s.substr(i, n == 0 ? 1 : n);
    const auto b0 = static_cast<unsigned char>(seq[0]);
    const auto b1 = seq.size() > 1 ? static_cast<unsigned char>(seq[1]) : 0u;
    const auto b2 = seq.size() > 2 ? static_cast<unsigned char>(seq[2]) : 0u;
    const bool control =
        n == 0 || (n == 1 && (b0 < 0x20 || b0 == 0x7F) && !(keep_newlines && b0 == '\n')) ||
        (n == 2 && b0 == 0xC2 && b1 < 0xA0) ||  // C1: U+0080..U+009F
        // U+2028/2029 (line/paragraph separators), U+202A..202E and U+2066..2069 (bidi).
        (n == 3 && b0 == 0xE2 && b1 == 0x80 && b2 >= 0xA8 && b2 <= 0xAE) ||
        (n == 3 && b0 == 0xE2 && b1 == 0x81 && b2 >= 0xA6 && b2 <= 0xA9);
    if (control) {
      escape(seq);
    } else {
      out.append(seq);
    }
    i += seq.size();
  }
  return out;
}

void put_path(nlohmann::json& obj, const std::string& key, const std::string& path) {
  if (is_valid_utf8(path)) {
    obj[key] = path;
    return;
  }
  obj[key] = display_text(path);
  static const char* digits = "0123456789abcdef";
  std::string hex;
  hex.reserve(path.size() * 2);
  for (const unsigned char c : path) {
    hex += digits[c >> 4];
    hex += digits[c & 15];
  }
  obj[key + "_hex"] = hex;
}

std::string get_path(const nlohmann::json& obj, const std::string& key) {
  if (!obj.is_object()) return "";
  const auto hex = obj.find(key + "_hex");
  if (hex != obj.end() && hex->is_string()) {
    const std::string& h = hex->get_ref<const std::string&>();
    std::string out;
    for (std::size_t i = 0; i + 1 < h.size(); i += 2) {
      const int hi = hex_value(h[i]), lo = hex_value(h[i + 1]);
      if (hi < 0 || lo < 0) return "";
      out += static_cast<char>(hi * 16 + lo);
    }
    return out;
  }
  const auto text = obj.find(key);
  return text != obj.end() && text->is_string() ? text->get<std::string>() : "";
}

std::string dump_json(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace sapiens_seg::cli
