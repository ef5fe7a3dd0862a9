// Turning `segment` arguments (files, folders, @lists, -) into a list of inputs.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace sapiens_seg::cli {

struct InputItem {
  std::string path;
  bool video = false;
};

struct ExpandedInputs {
  std::vector<InputItem> items;
  std::vector<std::string> missing;  // arguments that name nothing readable
};

// Each argument is a file, a folder (its images and videos with an extension in `exts`, sorted;
// sub-folders with `recursive`), "@list.txt" (one path per line, '#' comments, as the authors'
// demo takes), or "-" (paths on stdin). Files named explicitly are taken whatever their
// extension; videos are recognised by extension.
ExpandedInputs expand_inputs(const std::vector<std::string>& args, bool recursive,
                             const std::set<std::string>& exts);

std::set<std::string> parse_extensions(const std::string& list);  // "jpg,png" -> {".jpg",".png"}
bool is_video_path(const std::string& path);

}  // namespace sapiens_seg::cli
