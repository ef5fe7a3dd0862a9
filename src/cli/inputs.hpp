// Turning `segment` arguments (files, folders, @lists, -) into a list of inputs.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::cli {

struct InputItem {
  std::string path;
  bool video = false;
};

// An argument, a list entry or a file met in a folder that cannot be an input: reported as that
// input's error entry; the run goes on with the others.
struct InputProblem {
  std::string path;
  ErrorCode code;
  std::string message;
};

struct InputRules {
  std::set<std::string> exts;  // of the files taken from folders: {".jpg", ...}
  bool recursive = false;
  // The run's output folder: a folder walk does not enter it when it lies below the searched
  // folder, and does not take what this tool writes there as inputs (names in
  // `previous_outputs`, which the previous summary.json records, and names of the forms of
  // looks_like_output_name).
  std::string out_dir;
  std::set<std::string> previous_outputs;
  // Take a path with a URI scheme ("s3://bucket/dir/") as one item, as given, without looking
  // for it on this machine: for a caller that reads such paths itself (the Ray driver).
  bool pass_uris = false;
};

struct ExpandedInputs {
  std::vector<InputItem> items;
  std::vector<InputProblem> problems;
  std::size_t excluded = 0;        // files of the output folder that a walk did not take
  std::vector<std::string> notes;  // what the run should say about that, once each
};

// Each argument is a file, a folder (its images and videos with an extension in `exts`, sorted;
// sub-folders with `recursive`; symbolic links to folders are not followed), "@list.txt" (one
// path per line, '#' comments, as the authors' demo takes; a UTF-8 byte order mark and CRLF line
// ends are accepted), or "-" (paths on stdin). Files named explicitly are taken whatever their
// extension; videos are recognised by extension. Only regular files are inputs: a FIFO, device
// or socket is refused at once (never opened, which could block). A folder that cannot be read
// is one problem naming it; the walk goes on. A file named twice is taken once.
ExpandedInputs expand_inputs(const std::vector<std::string>& args, const InputRules& rules);

std::set<std::string> parse_extensions(const std::string& list);  // "jpg,png" -> {".jpg",".png"}
// The extensions a folder walk takes by default: images, then videos (which the CLI segments
// frame by frame); ".jpg" form. extension_list() writes them as --ext takes them ("jpg,png").
std::vector<std::string> image_extensions();
std::vector<std::string> video_extensions();
std::string extension_list(const std::vector<std::string>& exts);
bool is_video_path(const std::string& path);

// What kind of file `path` is, for messages: "a folder", "a FIFO (named pipe)", ...; "" for a
// regular file or a path that does not exist.
std::string special_file_kind(const std::string& path);

}  // namespace sapiens_seg::cli
