// `sapiens-seg segment`, top-down: the inputs, every output name, the model, the images and
// videos, the summary.
#include "segment.hpp"

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include "cli/files.hpp"
#include "cli/images.hpp"
#include "cli/inputs.hpp"
#include "cli/json_paths.hpp"
#include "cli/naming.hpp"
#include "cli/outputs.hpp"
#include "cli/report.hpp"
#include "cli/stop.hpp"
#include "cli/summary.hpp"
#include "cli/video.hpp"
#include "sapiens_seg/sapiens_seg.hpp"

namespace sapiens_seg::cli {
namespace fs = std::filesystem;

namespace {

bool can_write_ext(const std::string& ext) {
  return cv::haveImageWriter("x" + ext);
}

// The run's inputs (inputs.hpp); a run with none at all is an error before anything loads.
ExpandedInputs list_inputs(const SegmentArgs& a, const PreviousSummary& prev) {
  InputRules rules;
  const std::string extensions = a.extensions.empty() ? extension_list(image_extensions()) + "," +
                                                            extension_list(video_extensions())
                                                      : a.extensions;
  rules.exts = parse_extensions(extensions);
  rules.recursive = a.recursive;
  rules.out_dir = a.out_dir;
  rules.previous_outputs = prev.files;
  ExpandedInputs in = expand_inputs(a.inputs, rules);
  if (in.items.empty() && in.problems.empty()) {
    throw Error(ErrorCode::kInvalidInput,
                "no inputs (folders are searched for the extensions " + extensions +
                    "; use --recursive for sub-folders" +
                    (in.excluded ? "; " + std::to_string(in.excluded) +
                                       " files of the output folder are outputs, not inputs"
                                 : std::string()) +
                    ")");
  }
  // A checkpoint must be a regular file: a FIFO would block the load, a folder is not one.
  if (const std::string kind = special_file_kind(a.model); !kind.empty()) {
    throw Error(ErrorCode::kInvalidInput,
                "--model " + a.model + " is " + kind +
                    ", not a checkpoint file (a .pt2 TorchScript archive or a .safetensors file) "
                    "or a card id");
  }
  return in;
}

// Every output name of the run, decided before anything is written (naming.hpp): one
// OutputNames per input, in the inputs' order.
std::vector<OutputNames> name_outputs(const SegmentArgs& a, const ExpandedInputs& in,
                                      const PreviousSummary& prev, OverlayStyle style) {
  std::vector<NameRequest> requests;
  std::set<std::string> inputs_here;
  requests.reserve(in.items.size());
  for (const auto& item : in.items) {
    NameRequest r;
    r.path = item.path;
    r.identity = path_identity(item.path);
    r.video = item.video;
    if (const auto it = prev.base_of.find(item.path); it != prev.base_of.end()) {
      r.pinned_base = it->second;
    }
    inputs_here.insert(item.path);
    requests.push_back(std::move(r));
  }
  std::set<std::string> taken = reserved_names(requests, a.out_dir);
  for (const auto& [input, files] : prev.files_of) {
    if (!inputs_here.count(input)) taken.insert(files.begin(), files.end());
  }
  const std::vector<std::string> bases = assign_bases(requests, taken, style, can_write_ext);
  std::vector<OutputNames> names;
  names.reserve(in.items.size());
  for (std::size_t i = 0; i < in.items.size(); ++i) {
    const auto& item = in.items[i];
    names.push_back(output_names(a.out_dir, bases[i], fs::path(item.path).filename().string(),
                                 item.video, style, can_write_ext));
  }
  return names;
}

nlohmann::json summary_head(const Model& model, std::size_t excluded,
                            const std::atomic<bool>& cancel) {
  const ModelInfo& info = model.info();
  nlohmann::json head = {{"model", info.id},
                         {"sha256", info.sha256},
                         {"version", version()},
                         {"backend",
                          {{"mode", info.backend.mode},
                           {"device", info.backend.device},
                           {"dtype", info.backend.dtype}}},
                         {"cancelled", cancel.load()}};
  if (cancel) head["cancelled_by"] = stop_reason();
  if (excluded > 0) head["outputs_not_taken_as_inputs"] = excluded;
  put_path(head, "checkpoint", info.path);
  return head;
}

}  // namespace

int run_segment(const SegmentArgs& a, const LoadOptions& load_options) {
  const std::atomic<bool>& cancel = stop_flag();
  const SaveSet save = parse_save(a.save);
  const OverlayStyle style =
      a.overlay_style == "side-by-side" ? OverlayStyle::kSideBySide : OverlayStyle::kBlend;
  const fs::path summary_file = fs::path(a.out_dir) / "summary.json";
  // The counts are known only once the inputs are: the reporter starts with none.
  Reporter report(0, a);
  const PreviousSummary prev = read_previous_summary(summary_file, report);

  // 1. The inputs, and a writable output folder (before gigabytes are loaded).
  const ExpandedInputs in = list_inputs(a, prev);
  prepare_out_dir(a.out_dir);
  report.set_total(in.items.size() + in.problems.size());
  for (const auto& note : in.notes) report.warn(note);
  if (in.excluded > 0) {
    report.warn(std::to_string(in.excluded) + " files in the output folder " + a.out_dir +
                " are outputs of sapiens-seg (named in its summary.json, or *_seg.png, "
                "*_overlay.png, *_overlay.mp4, *.tmp<N>): not taken as inputs");
  }
  for (const auto& p : in.problems) report.failed(p.path, Error(p.code, p.message));
  if (in.items.empty()) return report.status();

  // 2. Every output name, and the inputs no output may replace.
  std::vector<OutputNames> names = name_outputs(a, in, prev, style);
  {
    std::vector<std::string> paths;
    paths.reserve(in.items.size());
    for (const auto& item : in.items) paths.push_back(item.path);
    protect_inputs(paths);
  }

  // 3. The model, then the images (in batches) and the videos (one by one).
  const Model model = load(a.model, load_options);
  std::vector<ImageJob> jobs;
  std::vector<std::pair<std::string, OutputNames>> videos;
  for (std::size_t i = 0; i < in.items.size(); ++i) {
    const auto& item = in.items[i];
    if (item.video) {
      videos.emplace_back(item.path, std::move(names[i]));
    } else if (a.skip_existing && outputs_exist(names[i], save)) {
      report.skipped(item.path);
    } else {
      jobs.push_back({item.path, std::move(names[i])});
    }
  }
  run_images(model, jobs, a, save, style, report, cancel);
  for (const auto& [path, video_names] : videos) {
    if (cancel) break;
    run_video(model, path, video_names, a, save, style, report, cancel);
  }
  report.finish();

  // 4. The summary (a resumed run keeps the previous entries it did not replace).
  if (save.json) {
    std::vector<std::string> merged;
    if (a.skip_existing) {
      for (const auto& e :
           merge_summaries(prev.images, report.summary(), report.skipped_entries())) {
        merged.push_back(dump_json(e));
      }
    }
    write_summary(summary_file.string(), summary_head(model, in.excluded, cancel),
                  a.skip_existing ? merged : report.summary());
  }
  if (cancel) {
    const int sig = stop_signal() ? stop_signal() : SIGINT;
    std::fprintf(stderr,
                 "sapiens-seg: interrupted by %s; finished outputs are complete, run again with "
                 "--skip-existing to continue\n",
                 stop_reason().c_str());
    return 128 + sig;
  }
  if (report.failed_count() > 0 && !a.quiet) {
    std::fprintf(stderr, "sapiens-seg: %zu of %zu inputs failed\n", report.failed_count(),
                 in.items.size() + in.problems.size());
  }
  return report.status();
}

}  // namespace sapiens_seg::cli
