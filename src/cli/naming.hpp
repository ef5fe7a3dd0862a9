// The names of a run's output files, all decided before anything is written (one registry).
//
// Every input has a base name; its files are <base>_seg.png, <base>_overlay.png (or, with
// --overlay side-by-side, <base> + the input's extension, as the authors' demo names it),
// <base>.npy, <base>_seg.npy and <base>_logits.npy for an image, and <base>_overlay.mp4 (written
// as <base>_overlay.partial.mp4 first) and the folder <base>_frames for a video. An input claims
// all of these names whatever --save selects, so that changing --save never renames anything.
//
// The base is the input's stem. Where two inputs would claim the same file, or a claim is a file
// no output may replace (an input of the run inside the output folder, summary.json, a file the
// previous summary.json records for another input), every input involved is renamed one level
// further, and this repeats until nothing collides:
//   level 0  photo
//   level 1  photo_jpg                   (the extension as written, when the file has one)
//   level 2  photo_jpg_1a2b3c4d          (8 hex digits of the FNV-1a hash of the input's
//                                         absolute path)
//   then     photo_jpg_1a2b3c4d_2, _3... (only if 32-bit hashes collide: by path order)
// So a name depends on the input's own path and on which other inputs share its stem, never on
// the order in which inputs arrive or finish. A run with --skip-existing keeps the base that the
// previous summary.json records for each input it lists, so names found once are found again;
// such an input also keeps its stem's level-0 names from newcomers (a.bmp added beside a.jpg
// and a.png, kept as a_jpg and a_png, is a_bmp, as a fresh run of the three would name it).
//
// The rule is the CLI's and also `python -m sapiens_seg.ray`'s: the binding calls run_bases(), so
// the two drivers name the same inputs alike.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "sapiens_seg/error.hpp"
#include "sapiens_seg/options.hpp"

namespace sapiens_seg::cli {

enum class OverlayStyle {
  kBlend,       // palette blended over the photo, same size
  kSideBySide,  // input | blend, as the authors' demo saves it, under the input's file name
};

// Whether an image with this extension (".jpg") can be encoded; the side-by-side picture falls
// back to .png when not.
using CanWriteExt = std::function<bool(const std::string& ext)>;

struct OutputNames {
  std::string base;
  std::string labels_png, overlay, mask_npy, labels_npy, logits_npy, raw_logits_npy;  // images
  std::string overlay_video, overlay_video_partial, frames_dir;                       // videos
};

// Every kind of output file, in one table: the --save item that selects it, its key in the JSON
// summary's "outputs", and its name after the base. The CLI's --save parser, its namer, its
// summary reader and the binding's Ray driver all read this table.
struct OutputKind {
  const char* save;    // the --save item ("labels"); nullptr for a file no item names
  const char* key;     // summary.json "outputs" key ("labels_png")
  const char* suffix;  // after the base ("_seg.png"); the side-by-side overlay is special
  std::string OutputNames::*field;
  bool video;
};
const std::vector<OutputKind>& output_kinds();
// The --save items, in the table's order, and "json" (the summary itself).
std::vector<std::string> save_items();

// The full paths of the outputs of an input named `input_name` (its file name) under `base`.
OutputNames output_names(const std::string& dir, const std::string& base,
                         const std::string& input_name, bool video, OverlayStyle style,
                         const CanWriteExt& can_write);

// The file names (inside the output folder) an input claims under `base`.
std::vector<std::string> claimed_names(const std::string& base, const std::string& input_name,
                                       bool video, OverlayStyle style,
                                       const CanWriteExt& can_write);

struct NameRequest {
  std::string path;      // as given
  std::string identity;  // absolute and normal: the hash of level 2 is taken of it
  bool video = false;
  std::string pinned_base;  // the base the previous summary.json records ("" when none)
};

// One base per request, by the rule above. `taken`: file names in the output folder that no
// output may have. A pinned base is kept unless it collides (with `taken` or another pinned
// base); then that input is named by the rule like the others.
std::vector<std::string> assign_bases(const std::vector<NameRequest>& requests,
                                      const std::set<std::string>& taken, OverlayStyle style,
                                      const CanWriteExt& can_write);

// An input's identity: its absolute, normal path (symbolic links resolved where the file exists).
std::string path_identity(const std::string& path);

// The file names that no output of a run writing into `out_dir` may have: summary.json, the
// folder's write test, and every input of the run that lies in `out_dir` itself.
std::set<std::string> reserved_names(const std::vector<NameRequest>& requests,
                                     const std::string& out_dir);

// The bases of a fresh run (no previous summary) of these inputs into `out_dir`, with the blend
// overlay: what the Python Ray driver names its label PNGs by. A path holding "://" (a URI) is its
// own identity.
std::vector<std::string> run_bases(const std::vector<std::string>& paths,
                                   const std::string& out_dir);

// The base of an output file name of a previous run (kind as in the summary's "outputs":
// "labels_png", "labels_npy", ...), "" when the name does not have that kind's form.
std::string base_of_output(const std::string& kind, const std::string& file_name);

// True for the file names this tool writes into an output folder (outputs and temporary
// files): what a folder walk over the output folder does not take as inputs.
bool looks_like_output_name(const std::string& file_name);

std::uint64_t fnv1a64(const std::string& s) noexcept;

// --save: which files to write (their names: naming.hpp's output_kinds()).
struct SaveSet {
  bool labels = true;       // <name>_seg.png, 8-bit grey class indices
  bool overlay = true;      // <name>_overlay.png, or the demo's side-by-side image
  bool mask = true;         // <name>.npy, bool foreground (the authors' demo name)
  bool npy = true;          // <name>_seg.npy, int64 labels (the authors' demo name)
  bool logits = false;      // <name>_logits.npy, float32 [classes, H, W] (large)
  bool raw_logits = false;  // <name>_raw_logits.npy, float32 [classes, h, w]: the network's own
  bool json = true;         // summary.json for the run
  // The library's SegmentOptions these outputs need.
  SegmentOptions segment_options() const { return {.logits = logits, .raw_logits = raw_logits}; }
};

// Parses a comma list of save_items() (any subset). Throws Error(kInvalidInput).
SaveSet parse_save(const std::string& list);

// True when every selected output exists already (--skip-existing).
bool outputs_exist(const OutputNames& names, const SaveSet& save);

}  // namespace sapiens_seg::cli
