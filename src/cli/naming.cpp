#include "naming.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <sstream>
#include <string_view>
#include <unordered_set>
#include <utility>

namespace sapiens_seg::cli {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string side_by_side_ext(const std::string& input_name, const CanWriteExt& can_write) {
  const std::string ext = fs::path(input_name).extension().string();
  return ext.empty() || !can_write(ext) ? ".png" : ext;
}

std::string base_at(const NameRequest& r, int level) {
  const fs::path name = fs::path(r.path).filename();
  std::string stem = name.stem().string();
  if (level == 0) return stem;
  const std::string ext = name.extension().string();
  std::string with_ext = ext.size() > 1 ? stem + "_" + ext.substr(1) : stem;
  if (level == 1 && with_ext != stem) return with_ext;
  char hash[16];
  std::snprintf(hash, sizeof hash, "_%08x", static_cast<unsigned>(fnv1a64(r.identity) >> 32));
  const std::string hashed = with_ext + hash;
  return level <= 2 ? hashed : hashed + "_" + std::to_string(level - 1);
}

}  // namespace

std::uint64_t fnv1a64(const std::string& s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

const std::vector<OutputKind>& output_kinds() {
  // The demo's own names for its .npy files: <name>_seg.npy (labels) and <name>.npy (mask).
  static const std::vector<OutputKind> kinds = {
      {"labels", "labels_png", "_seg.png", &OutputNames::labels_png, false},
      {"overlay", "overlay", "_overlay.png", &OutputNames::overlay, false},
      {"mask", "mask_npy", ".npy", &OutputNames::mask_npy, false},
      {"npy", "labels_npy", "_seg.npy", &OutputNames::labels_npy, false},
      {"logits", "logits_npy", "_logits.npy", &OutputNames::logits_npy, false},
      {"raw_logits", "raw_logits_npy", "_raw_logits.npy", &OutputNames::raw_logits_npy, false},
      {"overlay", "overlay_video", "_overlay.mp4", &OutputNames::overlay_video, true},
      {nullptr, "overlay_video_partial", "_overlay.partial.mp4",
       &OutputNames::overlay_video_partial, true},
      {"labels", "frames_dir", "_frames", &OutputNames::frames_dir, true},
  };
  return kinds;
}

std::vector<std::string> save_items() {
  std::vector<std::string> items;
  for (const auto& k : output_kinds()) {
    if (k.save && std::find(items.begin(), items.end(), k.save) == items.end()) {
      items.emplace_back(k.save);
    }
  }
  items.emplace_back("json");
  return items;
}

OutputNames output_names(const std::string& dir, const std::string& base,
                         const std::string& input_name, bool video, OverlayStyle style,
                         const CanWriteExt& can_write) {
  const std::string b = (fs::path(dir) / base).string();
  OutputNames n;
  n.base = base;
  for (const auto& k : output_kinds()) {
    if (k.video == video) n.*k.field = b + k.suffix;
  }
  if (!video && style == OverlayStyle::kSideBySide) {
    n.overlay = b + side_by_side_ext(input_name, can_write);
  }
  return n;
}

std::vector<std::string> claimed_names(const std::string& base, const std::string& input_name,
                                       bool video, OverlayStyle style,
                                       const CanWriteExt& can_write) {
  const OutputNames n = output_names("", base, input_name, video, style, can_write);
  std::vector<std::string> names;
  for (const auto& k : output_kinds()) {
    if (k.video == video) names.push_back(n.*k.field);
  }
  return names;
}

std::vector<std::string> assign_bases(const std::vector<NameRequest>& requests,
                                      const std::set<std::string>& taken, OverlayStyle style,
                                      const CanWriteExt& can_write) {
  const std::size_t n = requests.size();
  constexpr int kPinned = -1;
  std::vector<int> level(n, 0);
  std::vector<std::string> base(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!requests[i].pinned_base.empty()) {
      level[i] = kPinned;
      base[i] = requests[i].pinned_base;
    } else {
      base[i] = base_at(requests[i], 0);
    }
  }
  auto names_of = [&](std::size_t i, const std::string& b) {
    return claimed_names(b, fs::path(requests[i].path).filename().string(), requests[i].video,
                         style, can_write);
  };
  // Claims are compared by 64-bit hashes of the names (a run may have millions of inputs): a
  // hash collision can only rename an input further, never let two outputs share a file.
  constexpr std::size_t kTaken = static_cast<std::size_t>(-1);
  std::vector<std::uint64_t> taken_hashes;
  taken_hashes.reserve(taken.size());
  for (const auto& t : taken) taken_hashes.push_back(fnv1a64(t));
  auto colliding = [&] {
    std::vector<std::pair<std::uint64_t, std::size_t>> claims;
    claims.reserve(n * 5 + taken_hashes.size());
    for (const auto h : taken_hashes) claims.emplace_back(h, kTaken);
    for (std::size_t i = 0; i < n; ++i) {
      const auto own = names_of(i, base[i]);
      for (const auto& name : own) claims.emplace_back(fnv1a64(name), i);
      // A kept base still holds its stem's names against newcomers: a.bmp added beside a.jpg and
      // a.png (kept as a_jpg, a_png) is a_bmp, as a fresh run of all three would name it.
      if (level[i] == kPinned) {
        for (const auto& name : names_of(i, base_at(requests[i], 0))) {
          if (std::find(own.begin(), own.end(), name) == own.end()) {
            claims.emplace_back(fnv1a64(name), kTaken);
          }
        }
      }
    }
    std::sort(claims.begin(), claims.end());
    std::vector<bool> bad(n, false);
    for (std::size_t a = 0; a < claims.size();) {
      std::size_t b = a + 1;
      while (b < claims.size() && claims[b].first == claims[a].first) ++b;
      if (b - a > 1) {
        for (std::size_t k = a; k < b; ++k) {
          if (claims[k].second != kTaken) bad[claims[k].second] = true;
        }
      }
      a = b;
    }
    return bad;
  };
  // Every input in a collision moves one level on, until none collides or all that do are at
  // level 2. A pinned base that collides is given up (level 0).
  for (;;) {
    const std::vector<bool> bad = colliding();
    bool changed = false;
    for (std::size_t i = 0; i < n; ++i) {
      if (!bad[i] || level[i] >= 2) continue;
      level[i] = level[i] == kPinned ? 0 : level[i] + 1;
      const std::string next = base_at(requests[i], level[i]);
      changed = changed || next != base[i] || level[i] == 0;
      base[i] = next;
    }
    if (!changed) break;
  }
  // Left: equal hashes of different paths (or a hostile folder). Settled one at a time, in path
  // order, with the first free counter.
  const std::vector<bool> bad = colliding();
  if (std::find(bad.begin(), bad.end(), true) == bad.end()) return base;
  std::unordered_multiset<std::uint64_t> claimed(taken_hashes.begin(), taken_hashes.end());
  for (std::size_t i = 0; i < n; ++i) {
    for (const auto& name : names_of(i, base[i])) claimed.insert(fnv1a64(name));
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return requests[a].identity < requests[b].identity;
  });
  for (const std::size_t i : order) {
    if (!bad[i]) continue;
    for (const auto& name : names_of(i, base[i])) claimed.erase(claimed.find(fnv1a64(name)));
    for (int l = level[i];; ++l) {
      const std::string candidate = base_at(requests[i], std::max(l, 2));
      const auto names = names_of(i, candidate);
      if (std::none_of(names.begin(), names.end(),
                       [&](const std::string& s) { return claimed.count(fnv1a64(s)) > 0; })) {
        base[i] = candidate;
        for (const auto& name : names) claimed.insert(fnv1a64(name));
        break;
      }
    }
  }
  return base;
}

std::string path_identity(const std::string& path) {
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(path, ec);
  return ec ? fs::absolute(path, ec).lexically_normal().string() : c.string();
}

std::set<std::string> reserved_names(const std::vector<NameRequest>& requests,
                                     const std::string& out_dir) {
  std::set<std::string> reserved = {"summary.json", ".sapiens-seg-write-test"};
  const std::string out_key = path_identity(out_dir);
  for (const auto& r : requests) {
    if (fs::path(r.identity).parent_path().string() == out_key) {
      reserved.insert(fs::path(r.identity).filename().string());
    }
  }
  return reserved;
}

std::vector<std::string> run_bases(const std::vector<std::string>& paths,
                                   const std::string& out_dir) {
  std::vector<NameRequest> requests(paths.size());
  for (std::size_t i = 0; i < paths.size(); ++i) {
    requests[i].path = paths[i];
    requests[i].identity =
        paths[i].find("://") != std::string::npos ? paths[i] : path_identity(paths[i]);
  }
  // The Ray driver writes label PNGs only; the claims of the other outputs are the CLI's all
  // the same, so both drivers give an input the same base.
  return assign_bases(requests, reserved_names(requests, out_dir), OverlayStyle::kBlend,
                      [](const std::string&) { return true; });
}

std::string base_of_output(const std::string& kind, const std::string& file_name) {
  for (const auto& k : output_kinds()) {
    const std::string sfx(k.suffix);
    if (kind == k.key && ends_with(file_name, sfx) && file_name.size() > sfx.size()) {
      return file_name.substr(0, file_name.size() - sfx.size());
    }
  }
  // The side-by-side picture: <base> + the input's extension.
  if (kind == "overlay") return fs::path(file_name).stem().string();
  return "";
}

bool looks_like_output_name(const std::string& name) {
  for (const char* suffix : {"_seg.png", "_overlay.png", "_overlay.mp4", "_overlay.partial.mp4"}) {
    if (ends_with(name, suffix)) return true;
  }
  // Temporary files: <output>.tmp<pid><ext>, left only by a process that was killed (SIGKILL).
  const std::size_t at = name.rfind(".tmp");
  return at != std::string::npos && at + 4 < name.size() &&
         std::isdigit(static_cast<unsigned char>(name[at + 4]));
}

namespace {
// The SaveSet field of each --save item (save_items()); nullptr for another word.
bool SaveSet::*save_field(std::string_view item) {
  static const std::pair<std::string_view, bool SaveSet::*> kFields[] = {
      {"labels", &SaveSet::labels}, {"overlay", &SaveSet::overlay},
      {"mask", &SaveSet::mask},     {"npy", &SaveSet::npy},
      {"logits", &SaveSet::logits}, {"raw_logits", &SaveSet::raw_logits},
      {"json", &SaveSet::json}};
  for (const auto& [name, field] : kFields) {
    if (item == name) return field;
  }
  return nullptr;
}

bool selected(const SaveSet& s, const OutputKind& k) {
  return k.save != nullptr && s.*save_field(k.save);
}
}  // namespace

SaveSet parse_save(const std::string& list) {
  SaveSet s{false, false, false, false, false, false, false};
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    bool SaveSet::*field = save_field(item);
    if (field == nullptr) {
      std::string items;
      for (const auto& i : save_items()) items += (items.empty() ? "" : ", ") + i;
      throw Error(ErrorCode::kInvalidInput,
                  "--save: unknown output '" + item + "' (" + items + ")");
    }
    s.*field = true;
  }
  return s;
}

bool outputs_exist(const OutputNames& n, const SaveSet& s) {
  std::error_code ec;
  for (const auto& k : output_kinds()) {
    if (!k.video && selected(s, k) && !fs::exists(n.*k.field, ec)) return false;
  }
  return true;
}

}  // namespace sapiens_seg::cli
