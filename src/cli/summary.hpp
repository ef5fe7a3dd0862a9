// The run's summary.json: the previous run's (kept by --skip-existing, and whose files no output
// may replace) and this run's.
#pragma once

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/report.hpp"

namespace sapiens_seg::cli {

// The summary.json a previous run left in the output folder: its entries (kept by a resumed
// run), the base name of each input it lists (kept by this run's names), and the names of all
// the files it lists (never taken as inputs, never written for another input).
struct PreviousSummary {
  nlohmann::json images = nlohmann::json::array();
  std::map<std::string, std::string> base_of;                // input -> base
  std::map<std::string, std::vector<std::string>> files_of;  // input -> output file names
  std::set<std::string> files;
};

// An unreadable previous summary is left out with a warning (and replaced when json is saved).
PreviousSummary read_previous_summary(const std::filesystem::path& file, Reporter& report);

// --skip-existing resumes a run in the same folder: the entries of the previous summary.json
// stay, those of inputs segmented again are replaced (same place), new ones are appended, and a
// skipped input without a previous entry is listed as "skipped".
nlohmann::json merge_summaries(nlohmann::json previous,
                               const std::vector<std::string>& current_text,
                               const nlohmann::json& skipped);

// Writes summary.json (atomically): `head` (model, backend, ...) and the entries, one compact
// line each, so the file costs no parsed tree of a million entries.
void write_summary(const std::string& path, const nlohmann::json& head,
                   const std::vector<std::string>& entries);

}  // namespace sapiens_seg::cli
