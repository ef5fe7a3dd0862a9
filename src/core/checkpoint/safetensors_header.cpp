#include "safetensors_header.hpp"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core {
namespace {

using nlohmann::json;

// The deepest valid nesting: the top object (0), a tensor entry or "__metadata__" (1), and a
// "shape" or "data_offsets" array (2). Anything deeper is refused while parsing, so that a hostile
// header cannot build (and later recursively destroy) a deeply nested document.
constexpr int kMaxDepth = 2;

// Names come from the file: keep messages readable when one is huge.
std::string in_quotes(std::string_view name) {
  constexpr std::size_t kMax = 200;
  std::string out;
  out.reserve(std::min(name.size(), kMax) + 5);
  out += '\'';
  out.append(name.substr(0, kMax));
  if (name.size() > kMax) out += "...";
  out += '\'';
  return out;
}

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw Error(ErrorCode::kFormatError, source + ": malformed safetensors file: " + what);
}

[[noreturn]] void fail_tensor(const std::string& source, std::string_view name,
                              const std::string& what) {
  fail(source, "tensor " + in_quotes(name) + ": " + what);
}

bool parse_dtype(std::string_view s, SafetensorsDtype& out) {
  static constexpr std::pair<std::string_view, SafetensorsDtype> kNames[] = {
      {"F64", SafetensorsDtype::kF64}, {"F32", SafetensorsDtype::kF32},
      {"F16", SafetensorsDtype::kF16}, {"BF16", SafetensorsDtype::kBF16},
      {"I64", SafetensorsDtype::kI64}, {"I32", SafetensorsDtype::kI32},
      {"I16", SafetensorsDtype::kI16}, {"I8", SafetensorsDtype::kI8},
      {"U8", SafetensorsDtype::kU8},   {"BOOL", SafetensorsDtype::kBool},
  };
  for (const auto& [n, d] : kNames) {
    if (n == s) {
      out = d;
      return true;
    }
  }
  return false;
}

// A JSON integer >= 0 that fits in uint64 (nlohmann stores non-negative literals as unsigned,
// negative ones as signed, and anything too large for 64 bits as a float, which is refused).
bool non_negative_integer(const json& j, std::uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<std::uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<std::int64_t>() >= 0) {
    out = static_cast<std::uint64_t>(j.get<std::int64_t>());
    return true;
  }
  return false;
}

// Parses the JSON text, refusing duplicate keys (nlohmann would silently keep the last one, so a
// file could show one tensor to us and another to a different reader) and excessive nesting.
json parse_json(const char* first, const char* last, const std::string& source) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth > kMaxDepth) fail(source, "header JSON is nested too deeply");
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get_ref<const std::string&>()).second) {
          const std::string& k = parsed.get_ref<const std::string&>();
          if (depth <= 1) fail(source, "duplicate tensor name " + in_quotes(k) + " in the header");
          fail(source, "duplicate key " + in_quotes(k) + " in a header entry");
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(first, last, check);
  } catch (const json::exception& e) {
    // Includes invalid UTF-8 in strings, which nlohmann's lexer rejects. Its message quotes the
    // offending bytes: keep only printable ASCII so that the message itself stays valid UTF-8
    // (it may end up in a JSON summary).
    std::string detail(e.what());
    if (detail.size() > 300) detail.resize(300);
    for (char& c : detail) {
      const auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u >= 0x7f) c = '?';
    }
    fail(source, "header is not valid JSON (" + detail + ")");
  }
}

SafetensorsTensorInfo parse_entry(const std::string& name, const json& entry,
                                  std::uint64_t data_size, const std::string& source) {
  if (!entry.is_object()) fail_tensor(source, name, "entry is not a JSON object");
  SafetensorsTensorInfo info;
  info.name = name;

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) fail_tensor(source, name, "no \"dtype\"");
  if (!dtype_it->is_string()) fail_tensor(source, name, "\"dtype\" is not a string");
  const auto& dtype = dtype_it->get_ref<const std::string&>();
  if (!parse_dtype(dtype, info.dtype)) {
    fail_tensor(source, name, "unsupported dtype " + in_quotes(dtype));
  }

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) fail_tensor(source, name, "no \"shape\"");
  if (!shape_it->is_array()) fail_tensor(source, name, "\"shape\" is not an array");
  std::int64_t numel = 1;
  for (const json& d : *shape_it) {
    std::uint64_t dim = 0;
    if (!non_negative_integer(d, dim)) {
      const std::string what = d.is_number() ? d.dump() : std::string("a ") + d.type_name();
      fail_tensor(source, name, "\"shape\" holds " + what + ", not a non-negative integer");
    }
    if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail_tensor(source, name, "shape dimension " + std::to_string(dim) + " is too large");
    }
    const auto sdim = static_cast<std::int64_t>(dim);
    info.shape.push_back(sdim);
    // The product must fit even when a later dimension is 0: a shape like [2^62, 4, 0] is still
    // nonsense, and checking each step keeps the arithmetic defined.
    if (__builtin_mul_overflow(numel, sdim == 0 ? 1 : sdim, &numel)) {
      fail_tensor(source, name, "the product of the shape overflows 64 bits");
    }
  }
  for (const std::int64_t d : info.shape) {
    if (d == 0) numel = 0;
  }
  info.numel = numel;

  const auto off_it = entry.find("data_offsets");
  if (off_it == entry.end()) fail_tensor(source, name, "no \"data_offsets\"");
  if (!off_it->is_array() || off_it->size() != 2 ||
      !non_negative_integer((*off_it)[0], info.begin) ||
      !non_negative_integer((*off_it)[1], info.end)) {
    fail_tensor(source, name, "\"data_offsets\" is not two non-negative integers");
  }
  if (info.begin > info.end) {
    fail_tensor(source, name,
                "data_offsets begin " + std::to_string(info.begin) + " is after its end " +
                    std::to_string(info.end));
  }
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(numel), element_size(info.dtype), &bytes)) {
    fail_tensor(source, name, "the byte size of the shape overflows 64 bits");
  }
  if (info.end - info.begin != bytes) {
    fail_tensor(source, name,
                "data_offsets span " + std::to_string(info.end - info.begin) + " bytes but " +
                    std::string(to_string(info.dtype)) + " of this shape needs " +
                    std::to_string(bytes));
  }
  if (info.end > data_size) {
    fail_tensor(source, name,
                "data_offsets end " + std::to_string(info.end) +
                    " is past the end of the data section (" + std::to_string(data_size) +
                    " bytes)");
  }
  // Other keys in an entry are ignored, as the reference reader does.
  return info;
}

}  // namespace

std::string_view to_string(SafetensorsDtype dtype) noexcept {
  switch (dtype) {
    case SafetensorsDtype::kF64:
      return "F64";
    case SafetensorsDtype::kF32:
      return "F32";
    case SafetensorsDtype::kF16:
      return "F16";
    case SafetensorsDtype::kBF16:
      return "BF16";
    case SafetensorsDtype::kI64:
      return "I64";
    case SafetensorsDtype::kI32:
      return "I32";
    case SafetensorsDtype::kI16:
      return "I16";
    case SafetensorsDtype::kI8:
      return "I8";
    case SafetensorsDtype::kU8:
      return "U8";
    case SafetensorsDtype::kBool:
      return "BOOL";
  }
  return "?";
}

std::size_t element_size(SafetensorsDtype dtype) noexcept {
  switch (dtype) {
    case SafetensorsDtype::kF64:
    case SafetensorsDtype::kI64:
      return 8;
    case SafetensorsDtype::kF32:
    case SafetensorsDtype::kI32:
      return 4;
    case SafetensorsDtype::kF16:
    case SafetensorsDtype::kBF16:
    case SafetensorsDtype::kI16:
      return 2;
    case SafetensorsDtype::kI8:
    case SafetensorsDtype::kU8:
    case SafetensorsDtype::kBool:
      return 1;
  }
  return 1;
}

SafetensorsHeader parse_safetensors_header(const std::uint8_t* file, std::size_t size,
                                           const std::string& source) {
  if (size < 8) {
    fail(source,
         "the file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[i];  // little-endian on any host
  if (n > kMaxSafetensorsHeaderBytes) {
    fail(source, "the header length " + std::to_string(n) + " is absurdly large (limit " +
                     std::to_string(kMaxSafetensorsHeaderBytes) + " bytes)");
  }
  if (n > size - 8) {
    fail(source, "the header length " + std::to_string(n) + " runs past the end of the file (" +
                     std::to_string(size) + " bytes)");
  }

  SafetensorsHeader header;
  header.data_offset = 8 + n;
  header.data_size = size - header.data_offset;

  const auto* text = reinterpret_cast<const char*>(file + 8);
  const json doc = parse_json(text, text + n, source);
  if (!doc.is_object()) fail(source, "the header is not a JSON object");

  for (const auto& [key, value] : doc.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail(source, "\"__metadata__\" is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail(source, "metadata " + in_quotes(mk) + " is not a string");
        header.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    header.tensors.push_back(parse_entry(key, value, header.data_size, source));
  }

  std::sort(header.tensors.begin(), header.tensors.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  // Overlaps are refused: two tensors sharing bytes is how a crafted file would alias weights.
  // Gaps between tensors (or after the last) are accepted although the format says the data
  // section is dense: they are harmless to a reader, and strictness there would only reject files
  // other readers load. Empty tensors occupy no bytes and so overlap nothing.
  const SafetensorsTensorInfo* prev = nullptr;
  for (const auto& t : header.tensors) {
    if (t.begin == t.end) continue;
    if (prev != nullptr && t.begin < prev->end) {
      fail(source, "tensors " + in_quotes(prev->name) + " and " + in_quotes(t.name) +
                       " overlap in the data section");
    }
    prev = &t;
  }
  for (std::size_t i = 0; i < header.tensors.size(); ++i) {
    header.by_name.emplace(header.tensors[i].name, i);
  }
  return header;
}

}  // namespace sapiens_seg::core
