#include "inputs.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace sapiens_seg::cli {
namespace fs = std::filesystem;

namespace {

std::string lower_ext(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e;
}

const std::set<std::string>& video_exts() {
  static const std::set<std::string> v = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v"};
  return v;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

void add_lines(std::istream& in, std::vector<std::string>& out) {
  for (std::string line; std::getline(in, line);) {
    line = trim(line);
    if (!line.empty() && line[0] != '#') out.push_back(line);
  }
}

}  // namespace

bool is_video_path(const std::string& path) {
  return video_exts().count(lower_ext(path)) > 0;
}

std::set<std::string> parse_extensions(const std::string& list) {
  std::set<std::string> exts;
  std::stringstream ss(list);
  for (std::string e; std::getline(ss, e, ',');) {
    e = trim(e);
    if (e.empty()) continue;
    if (e[0] != '.') e = "." + e;
    std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
    exts.insert(e);
  }
  return exts;
}

ExpandedInputs expand_inputs(const std::vector<std::string>& args, bool recursive,
                             const std::set<std::string>& exts) {
  std::vector<std::string> paths;
  for (const auto& a : args) {
    if (a == "-") {
      add_lines(std::cin, paths);
    } else if (a.size() > 1 && a[0] == '@') {
      std::ifstream list(a.substr(1));
      if (!list) {
        paths.push_back(a);  // reported as missing below
        continue;
      }
      add_lines(list, paths);
    } else {
      paths.push_back(a);
    }
  }
  ExpandedInputs out;
  std::error_code ec;
  for (const auto& p : paths) {
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      auto take = [&](const fs::directory_entry& e) {
        if (e.is_regular_file(ec) && exts.count(lower_ext(e.path())))
          found.push_back(e.path().string());
      };
      if (recursive) {
        for (const auto& e : fs::recursive_directory_iterator(p, ec)) take(e);
      } else {
        for (const auto& e : fs::directory_iterator(p, ec)) take(e);
      }
      std::sort(found.begin(), found.end());
      for (auto& f : found) out.items.push_back({f, is_video_path(f)});
    } else if (fs::is_regular_file(p, ec)) {
      out.items.push_back({p, is_video_path(p)});
    } else {
      out.missing.push_back(p);
    }
  }
  return out;
}

}  // namespace sapiens_seg::cli
