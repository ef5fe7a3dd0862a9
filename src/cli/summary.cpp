#include "cli/summary.hpp"

#include <fstream>
#include <stdexcept>
#include <string_view>

#include "cli/files.hpp"
#include "cli/json_paths.hpp"
#include "cli/naming.hpp"

namespace sapiens_seg::cli {
namespace fs = std::filesystem;

PreviousSummary read_previous_summary(const fs::path& file, Reporter& report) {
  PreviousSummary prev;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return prev;
  try {
    std::ifstream in(file);
    nlohmann::json old = nlohmann::json::parse(in);
    if (!old.is_object() || !old.contains("images") || !old["images"].is_array()) {
      throw std::runtime_error("no \"images\" list");
    }
    prev.images = std::move(old["images"]);
  } catch (const std::exception& e) {
    report.warn("the previous " + file.string() + " cannot be read (" + e.what() +
                "); it is replaced by this run's summary");
    return PreviousSummary{};
  }
  for (const auto& e : prev.images) {
    const std::string input = get_path(e, "input");
    if (input.empty() || !e.contains("outputs") || !e["outputs"].is_object()) continue;
    std::string base;
    // The side-by-side overlay's name (<base> + the input's extension) says least of the base:
    // every other kind is asked first.
    std::vector<const OutputKind*> kinds;
    for (const OutputKind& k : output_kinds()) {
      if (std::string_view(k.key) != "overlay") kinds.push_back(&k);
    }
    for (const OutputKind& k : output_kinds()) {
      if (std::string_view(k.key) == "overlay") kinds.push_back(&k);
    }
    for (const OutputKind* k : kinds) {
      const std::string f = fs::path(get_path(e["outputs"], k->key)).filename().string();
      if (f.empty()) continue;
      prev.files.insert(f);
      prev.files_of[input].push_back(f);
      if (base.empty()) base = base_of_output(k->key, f);
    }
    if (!base.empty()) prev.base_of[input] = base;
  }
  return prev;
}

nlohmann::json merge_summaries(nlohmann::json previous,
                               const std::vector<std::string>& current_text,
                               const nlohmann::json& skipped) {
  nlohmann::json current = nlohmann::json::array();
  for (const auto& t : current_text) current.push_back(nlohmann::json::parse(t));
  std::map<std::string, const nlohmann::json*> fresh;
  for (const auto& e : current) fresh.emplace(get_path(e, "input"), &e);
  std::set<std::string> placed;
  nlohmann::json merged = nlohmann::json::array();
  for (auto& e : previous) {
    const std::string key = get_path(e, "input");
    if (placed.count(key)) continue;  // one entry per input
    const auto it = fresh.find(key);
    merged.push_back(it != fresh.end() ? *it->second : e);
    placed.insert(key);
  }
  for (const auto& e : current) {
    if (placed.insert(get_path(e, "input")).second) merged.push_back(e);
  }
  for (const auto& e : skipped) {
    if (placed.insert(get_path(e, "input")).second) merged.push_back(e);
  }
  return merged;
}

void write_summary(const std::string& path, const nlohmann::json& head,
                   const std::vector<std::string>& entries) {
  std::string text = dump_json(head, 2);
  text.erase(text.find_last_of('}'));  // reopen the object for the "images" list
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  text += ",\n  \"images\": [";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    text += i ? ",\n    " : "\n    ";
    text += entries[i];
  }
  text += entries.empty() ? "]\n}\n" : "\n  ]\n}\n";
  write_file(path, text.data(), text.size());
}

}  // namespace sapiens_seg::cli
