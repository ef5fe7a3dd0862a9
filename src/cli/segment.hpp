// `sapiens-seg segment`: images, folders, lists and videos through a bounded pipeline.
#pragma once

#include <string>
#include <vector>

#include "sapiens_seg/names.hpp"
#include "sapiens_seg/options.hpp"

namespace sapiens_seg::cli {

struct SegmentArgs {
  std::vector<std::string> inputs;  // files, folders, @lists, "-"
  std::string out_dir;
  std::string model{default_model()};
  RunOptions run;   // batch size (the library's option table)
  int workers = 2;  // decode threads and writer threads (each)
  float opacity = 0.5f;
  bool recursive = false;
  std::string extensions;  // "" : image_extensions() and video_extensions() (inputs.hpp)
  std::string save = "labels,overlay,mask,npy,json";
  std::string overlay_style = "blend";  // or "side-by-side"
  int stride = 1;                       // videos: every Nth frame
  std::string codec = "auto";           // overlay videos: "auto" (H.264 where it can be
                                        // written, else mp4v, said in the log and JSON), "h264"
                                        // (an error where it cannot), "mp4v"
  bool json_lines = false;              // one JSON line per input on stdout
  bool quiet = false;
  bool skip_existing = false;
};

// Returns the exit status: 0, 128 + the signal after a stop (stop.hpp: SIGINT 130, SIGTERM 143,
// SIGHUP 129, a closed stdout 141), or 10 + the first error's code when some inputs failed (the
// others are still written). Output names: naming.hpp.
int run_segment(const SegmentArgs& args, const LoadOptions& load_options);

}  // namespace sapiens_seg::cli
