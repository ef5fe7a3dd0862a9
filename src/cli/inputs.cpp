#include "inputs.hpp"

#include <climits>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <unordered_set>

#include "cli/naming.hpp"

namespace sapiens_seg::cli {
namespace fs = std::filesystem;

namespace {

std::string lower_ext(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e;
}

const std::set<std::string>& video_exts() {
  static const std::set<std::string> v = [] {
    const std::vector<std::string> list = video_extensions();
    return std::set<std::string>(list.begin(), list.end());
  }();
  return v;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// Editors on Windows save lists with a byte order mark and CRLF: the mark is not part of the
// first path, and trim() drops the CR.
void add_lines(std::istream& in, std::vector<std::string>& out) {
  bool first = true;
  for (std::string line; std::getline(in, line);) {
    if (first && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    first = false;
    line = trim(line);
    if (!line.empty() && line[0] != '#') out.push_back(line);
  }
}

// An error of access in words; a path too long for the system names the limit.
std::string access_error(const std::error_code& ec, const fs::path& p) {
  if (ec == std::errc::filename_too_long) {
    return ec.message() + " (the path is " + std::to_string(p.native().size()) +
           " bytes; this system opens paths of at most " + std::to_string(PATH_MAX) +
           " bytes, and names of at most " + std::to_string(NAME_MAX) + ")";
  }
  return ec.message();
}

std::string kind_of(fs::file_type t) {
  switch (t) {
    case fs::file_type::directory:
      return "a folder";
    case fs::file_type::fifo:
      return "a FIFO (named pipe)";
    case fs::file_type::socket:
      return "a socket";
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::regular:
    case fs::file_type::not_found:
    case fs::file_type::none:
      return "";
    default:
      return "not a regular file";
  }
}

class Expander {
 public:
  explicit Expander(const InputRules& rules) : rules_(rules) {
    out_key_ = rules.out_dir.empty() ? std::string() : path_identity(rules.out_dir);
  }

  // A path named by the user (argument or list entry).
  void named(const std::string& p) {
    if (rules_.pass_uris && p.find("://") != std::string::npos) {
      out_.items.push_back({p, is_video_path(p)});
      return;
    }
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (st.type() == fs::file_type::not_found || (ec && ec != std::errc::permission_denied)) {
      std::error_code lec;
      if (fs::is_symlink(fs::symlink_status(p, lec))) {
        problem(p, ErrorCode::kNotFound,
                "input not found: " + p + " is a symbolic link to " +
                    fs::read_symlink(p, lec).string() + ", which does not exist");
      } else if (ec && ec != std::errc::no_such_file_or_directory &&
                 ec != std::errc::not_a_directory) {
        problem(p, ErrorCode::kIo, "cannot access input " + p + ": " + ec.message());
      } else {
        problem(p, ErrorCode::kNotFound, "input not found: " + p);
      }
      return;
    }
    if (ec) {
      problem(p, ErrorCode::kIo, "cannot access input " + p + ": " + ec.message());
      return;
    }
    if (st.type() == fs::file_type::directory) {
      walk(p);
    } else if (st.type() == fs::file_type::regular) {
      take(p);
    } else {
      refuse(p, st.type());
    }
  }

  ExpandedInputs done() { return std::move(out_); }

  void problem(const std::string& p, ErrorCode code, std::string message) {
    out_.problems.push_back({p, code, std::move(message)});
  }

 private:
  void refuse(const std::string& p, fs::file_type t) {
    problem(p, ErrorCode::kInvalidInput,
            p + " is " + kind_of(t) +
                ", not an image or video file: refused (only regular files "
                "are read)");
  }

  void take(const std::string& p) {
    if (!seen_.insert(path_identity(p)).second) return;  // named twice: one input
    out_.items.push_back({p, is_video_path(p)});
  }

  // The folder `root` (its sub-folders with --recursive), its files sorted by path.
  void walk(const std::string& root) {
    std::vector<std::string> found;
    std::vector<fs::path> pending = {fs::path(root)};
    while (!pending.empty()) {
      const fs::path dir = pending.back();
      pending.pop_back();
      const bool is_out_dir = !out_key_.empty() && path_identity(dir) == out_key_;
      std::error_code ec;
      fs::directory_iterator it(dir, ec), end;
      if (ec) {
        problem(dir.string(), ErrorCode::kIo,
                "cannot read the folder " + dir.string() + ": " + access_error(ec, dir) +
                    "; its files are not inputs of this run");
        continue;
      }
      for (; it != end; it.increment(ec)) {
        const fs::directory_entry& e = *it;
        std::error_code sec;
        const fs::file_status link = e.symlink_status(sec);
        if (sec && sec != std::errc::no_such_file_or_directory) {
          // Cannot even tell what it is (a path longer than PATH_MAX: ENAMETOOLONG): a folder
          // or an input that is not searched is said, never dropped in silence.
          if (!rules_.recursive && !rules_.exts.count(lower_ext(e.path()))) continue;
          problem(e.path().string(), ErrorCode::kIo,
                  "cannot access " + e.path().string() + ": " + access_error(sec, e.path()) +
                      "; it is not an input of this run" +
                      (rules_.recursive ? " (nor searched, if it is a folder)" : ""));
          continue;
        }
        if (link.type() == fs::file_type::directory) {
          if (!rules_.recursive) continue;
          if (!out_key_.empty() && path_identity(e.path()) == out_key_) {
            out_.notes.push_back("the output folder " + e.path().string() + " lies in " + root +
                                 ": it is not searched for inputs");
            continue;
          }
          // A video's frame folder in the output folder.
          if (is_out_dir && looks_like_frames(e.path().filename().string())) continue;
          pending.push_back(e.path());
          continue;
        }
        if (!rules_.exts.count(lower_ext(e.path()))) continue;
        const fs::file_status st = e.status(sec);
        if (st.type() == fs::file_type::regular) {
          const std::string name = e.path().filename().string();
          if (is_out_dir &&
              (rules_.previous_outputs.count(name) > 0 || looks_like_output_name(name))) {
            ++out_.excluded;
            continue;
          }
          found.push_back(e.path().string());
        } else if (st.type() == fs::file_type::not_found) {
          problem(e.path().string(), ErrorCode::kNotFound,
                  "input not found: " + e.path().string() +
                      " is a symbolic link to a file that does not exist");
        } else if (sec) {
          problem(e.path().string(), ErrorCode::kIo,
                  "cannot access input " + e.path().string() + ": " + access_error(sec, e.path()));
        } else if (st.type() != fs::file_type::directory) {
          refuse(e.path().string(), st.type());
        }
      }
      if (ec) {
        problem(dir.string(), ErrorCode::kIo,
                "cannot read the folder " + dir.string() + " to its end: " + ec.message() +
                    "; the files after the error are not inputs of this run");
      }
    }
    std::sort(found.begin(), found.end());
    for (const auto& f : found) take(f);
  }

  static bool looks_like_frames(const std::string& name) {
    return name.size() > 7 && name.compare(name.size() - 7, 7, "_frames") == 0;
  }

  const InputRules& rules_;
  std::string out_key_;
  std::unordered_set<std::string> seen_;
  ExpandedInputs out_;
};

}  // namespace

std::vector<std::string> image_extensions() {
  return {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"};
}

std::vector<std::string> video_extensions() {
  return {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v"};
}

std::string extension_list(const std::vector<std::string>& exts) {
  std::string out;
  for (const auto& e : exts) {
    if (!out.empty()) out += ',';
    out.append(e, 1);  // without the dot
  }
  return out;
}

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

std::string special_file_kind(const std::string& path) {
  std::error_code ec;
  return kind_of(fs::status(path, ec).type());
}

ExpandedInputs expand_inputs(const std::vector<std::string>& args, const InputRules& rules) {
  Expander x(rules);
  for (const auto& a : args) {
    std::vector<std::string> paths;
    if (a == "-") {
      add_lines(std::cin, paths);
    } else if (a.size() > 1 && a[0] == '@') {
      const std::string file = a.substr(1);
      std::error_code ec;
      const fs::file_type t = fs::status(file, ec).type();
      if (t == fs::file_type::not_found) {
        x.problem(a, ErrorCode::kNotFound, "list file not found: " + file);
        continue;
      }
      // A FIFO would block the run before it starts; a folder is not a list.
      if (t != fs::file_type::regular) {
        x.problem(a, ErrorCode::kInvalidInput,
                  "the list file " + file + " is " +
                      (ec ? "unreadable (" + ec.message() + ")" : kind_of(t)) +
                      ", not a text file of paths");
        continue;
      }
      std::ifstream list(file);
      if (!list) {
        x.problem(a, ErrorCode::kIo,
                  "cannot read the list file " + file + ": " + std::strerror(errno));
        continue;
      }
      add_lines(list, paths);
    } else {
      paths.push_back(a);
    }
    for (const auto& p : paths) x.named(p);
  }
  return x.done();
}

}  // namespace sapiens_seg::cli
