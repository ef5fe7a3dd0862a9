// Model cards (cards/*.json) and where they are looked up.
#include "sapiens_seg/cards.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include <mutex>
#include <set>

#include "../core/families.hpp"
#include "cards_parse.hpp"
#include "log.hpp"
#include "paths.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

template <typename T>
T field(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key)) {
    throw Error(ErrorCode::kFormatError, "card " + file + ": missing field '" + key + "'");
  }
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kFormatError,
                "card " + file + ": field '" + key + "' has the wrong type (" + e.what() + ")");
  }
}

// Numbers are range-checked before conversion: a JSON number outside the C++ type's range
// would otherwise convert with undefined behaviour (found by fuzzing).
int int_field(const json& j, const char* key, const std::string& file) {
  const auto v = field<json>(j, key, file);
  if (!v.is_number_integer() || v.get<std::int64_t>() < -(1LL << 31) ||
      v.get<std::int64_t>() >= (1LL << 31)) {
    throw Error(ErrorCode::kFormatError,
                "card " + file + ": field '" + key + "' must be an integer of a sensible size");
  }
  return static_cast<int>(v.get<std::int64_t>());
}

std::string opt_string(const json& j, const char* key) {
  return j.contains(key) && j.at(key).is_string() ? j.at(key).get<std::string>() : std::string();
}

std::array<float, 3> triple(const json& j, const char* key, const std::string& file) {
  const auto v = field<json>(j, key, file);
  if (!v.is_array() || v.size() != 3) {
    throw Error(ErrorCode::kFormatError, "card " + file + ": '" + key + "' needs 3 values");
  }
  std::array<float, 3> out{};
  for (std::size_t i = 0; i < 3; ++i) {
    const double d = v[i].is_number() ? v[i].get<double>() : std::nan("");
    if (!(std::abs(d) < 1e6)) {
      throw Error(ErrorCode::kFormatError,
                  "card " + file + ": '" + key + "' values must be numbers below 1e6");
    }
    out[i] = static_cast<float>(d);
  }
  return out;
}

}  // namespace

Card read_card(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw Error(ErrorCode::kFormatError, "card " + path + " is a directory, not a file");
  }
  std::ifstream in(path);
  if (!in) {
    throw Error(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                "cannot open card " + path + ": " + std::strerror(errno));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return io::parse_card(text, path);
}

namespace io {

Card parse_card(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kFormatError, "card " + path + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(ErrorCode::kFormatError, "card " + path + " is not an object");
  if (int_field(j, "schema", path) != 1) {
    throw Error(ErrorCode::kFormatError, "card " + path + ": unsupported schema version");
  }
  Card c;
  c.source = path;
  c.id = field<std::string>(j, "id", path);
  c.family = field<std::string>(j, "family", path);
  c.description = opt_string(j, "description");
  c.repo = opt_string(j, "repo");
  c.revision = opt_string(j, "revision");
  c.url = opt_string(j, "url");
  c.file = field<std::string>(j, "file", path);
  if (c.file.empty() || c.file.find('/') != std::string::npos || c.file == "." || c.file == "..") {
    throw Error(ErrorCode::kFormatError, "card " + path + ": 'file' must be a plain file name");
  }
  c.path_in_repo = opt_string(j, "path_in_repo");
  if (c.path_in_repo.empty()) c.path_in_repo = c.file;
  if (j.contains("size") && j["size"].is_number_unsigned()) c.size = j["size"].get<std::uint64_t>();
  if (j.contains("sha256") && !j["sha256"].is_null()) {
    std::string h = field<std::string>(j, "sha256", path);
    const bool hex = h.size() == 64 && std::all_of(h.begin(), h.end(), [](char ch) {
                       return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
                     });
    if (!hex) {
      throw Error(ErrorCode::kFormatError,
                  "card " + path + ": sha256 must be 64 lower-case hex digits or null");
    }
    c.sha256 = h;
  }
  const auto lic = field<json>(j, "license", path);
  c.license_id = field<std::string>(lic, "id", path);
  c.license_url = opt_string(lic, "url");
  c.commercial_use = field<bool>(lic, "commercial_use", path);
  c.license_notice = opt_string(lic, "notice");
  c.format = field<std::string>(j, "format", path);
  const core::FamilyTraits* family = core::family_named(c.family);
  if (family == nullptr) {
    std::string known;
    for (const auto& t : core::kFamilies)
      known += (known.empty() ? "" : " or ") + std::string(t.name);
    throw Error(ErrorCode::kFormatError,
                "card " + path + ": unknown family '" + c.family + "' (" + known + ")");
  }
  if (c.format != family->format) {
    throw Error(ErrorCode::kFormatError,
                "card " + path + ": format '" + c.format + "' does not fit family " + c.family);
  }
  const auto input = field<json>(j, "input", path);
  c.input_height = int_field(input, "height", path);
  c.input_width = int_field(input, "width", path);
  const auto pre = field<json>(j, "preprocess", path);
  c.resize = opt_string(pre, "resize");
  if (c.resize.empty()) c.resize = "linear";
  if (c.resize != "linear" && c.resize != "area_or_cubic") {
    throw Error(ErrorCode::kFormatError, "card " + path +
                                             ": preprocess.resize must be 'linear' "
                                             "or 'area_or_cubic'");
  }
  c.mean = triple(pre, "mean", path);
  c.std = triple(pre, "std", path);
  c.mean_train = triple(pre, "mean_train", path);
  c.std_train = triple(pre, "std_train", path);
  const auto arch = field<json>(j, "arch", path);
  c.patch = int_field(arch, "patch", path);
  c.embed_dim = int_field(arch, "embed_dim", path);
  c.depth = int_field(arch, "depth", path);
  c.heads = int_field(arch, "heads", path);
  c.mlp = int_field(arch, "mlp", path);
  c.head_channels = int_field(arch, "head_channels", path);
  c.num_classes = int_field(arch, "num_classes", path);
  if (arch.contains("kv_heads")) c.kv_heads = int_field(arch, "kv_heads", path);
  const auto labels = field<json>(j, "labels", path);
  c.label_set = field<std::string>(labels, "name", path);
  c.classes = field<std::vector<std::string>>(labels, "classes", path);
  const auto palette = field<json>(labels, "palette", path);
  if (!palette.is_array()) {
    throw Error(ErrorCode::kFormatError, "card " + path + ": palette must be a list");
  }
  for (const auto& entry : palette) {
    std::vector<int> rgb;
    if (entry.is_array()) {
      for (const auto& v : entry) {
        rgb.push_back(v.is_number_integer() && v.get<std::int64_t>() >= 0 &&
                              v.get<std::int64_t>() <= 255
                          ? static_cast<int>(v.get<std::int64_t>())
                          : -1);
      }
    }
    if (rgb.size() != 3 ||
        std::any_of(rgb.begin(), rgb.end(), [](int v) { return v < 0 || v > 255; })) {
      throw Error(ErrorCode::kFormatError, "card " + path + ": palette entries are [r,g,b] 0-255");
    }
    c.palette.push_back({static_cast<std::uint8_t>(rgb[0]), static_cast<std::uint8_t>(rgb[1]),
                         static_cast<std::uint8_t>(rgb[2])});
  }
  if (static_cast<int>(c.classes.size()) != c.num_classes ||
      static_cast<int>(c.palette.size()) != c.num_classes) {
    throw Error(ErrorCode::kFormatError,
                "card " + path + ": classes and palette must have num_classes entries");
  }
  if (c.input_height <= 0 || c.input_width <= 0 || c.patch <= 0 || c.heads <= 0) {
    throw Error(ErrorCode::kFormatError, "card " + path + ": sizes must be positive");
  }
  return c;
}

}  // namespace io

namespace {

struct Scan {
  std::vector<Card> cards;
  std::vector<BrokenCard> broken;
};

// Every card file of every card folder. A card that cannot be read (not JSON, a missing or
// mistyped field, an empty file, a folder named x.json, no permission) is set aside with the
// reason, so that one bad file in SAPIENS_SEG_CARDS does not take every command down with it.
Scan scan_cards() {
  Scan out;
  // Earlier folders win: SAPIENS_SEG_CARDS overrides the bundled cards.
  std::map<std::string, Card> by_id;
  for (const auto& dir : io::card_dirs()) {
    std::error_code ec;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".json") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::error_code fec;
      if (fs::is_directory(f, fec)) {
        out.broken.push_back({f.string(), "card " + f.string() + " is a directory, not a file"});
        continue;
      }
      try {
        Card c = read_card(f.string());
        by_id.emplace(c.id, std::move(c));
      } catch (const Error& e) {
        out.broken.push_back({f.string(), e.what()});
      }
    }
  }
  out.cards.reserve(by_id.size());
  for (auto& [id, c] : by_id) out.cards.push_back(std::move(c));
  // One warning per broken file and reason in a process, however often the cards are listed.
  static std::mutex mutex;
  static std::set<std::string> warned;
  for (const auto& b : out.broken) {
    std::lock_guard<std::mutex> lock(mutex);
    if (warned.insert(b.path + "\n" + b.error).second) {
      io::log(io::Level::kWarn, "skipping a broken model card: " + b.error);
    }
  }
  return out;
}

}  // namespace

std::vector<Card> list_cards() {
  return scan_cards().cards;
}

std::vector<BrokenCard> broken_cards() {
  return scan_cards().broken;
}

Card find_card(const std::string& id_with_rev) {
  const auto at = id_with_rev.find('@');
  const std::string id = id_with_rev.substr(0, at);
  const std::string rev = at == std::string::npos ? "" : id_with_rev.substr(at + 1);
  const Scan scan = scan_cards();
  const auto& cards = scan.cards;
  for (const auto& c : cards) {
    if (c.id != id) continue;
    if (!rev.empty() && c.revision.rfind(rev, 0) != 0) {
      throw Error(ErrorCode::kNotFound, "model '" + id + "' has revision " +
                                            (c.revision.empty() ? "(none)" : c.revision) +
                                            ", not '" + rev + "'");
    }
    return c;
  }
  std::ostringstream os;
  os << "unknown model '" << id << "'. Known models:";
  for (const auto& c : cards) os << ' ' << c.id;
  os << ". Add card folders with SAPIENS_SEG_CARDS, or pass a checkpoint path.";
  for (const auto& b : scan.broken) os << "\n  skipped broken card: " << b.error;
  throw Error(ErrorCode::kNotFound, os.str());
}

}  // namespace sapiens_seg
