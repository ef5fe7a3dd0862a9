// `segment`'s images: Model::prepare on `workers` threads, Model::run on batches, outputs written
// on `workers` threads.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "cli/naming.hpp"
#include "cli/outputs.hpp"
#include "cli/report.hpp"
#include "cli/segment.hpp"
#include "sapiens_seg/model.hpp"

namespace sapiens_seg::cli {

struct ImageJob {
  std::string path;
  OutputNames names;
};

// Queues hold at most two batches per stage. Every input is reported exactly once (ok or
// error); no exception leaves a thread body, so nothing can terminate the process. `cancel`
// (Ctrl-C): the batch that is running is written, nothing new starts.
void run_images(const Model& model, const std::vector<ImageJob>& jobs, const SegmentArgs& args,
                const SaveSet& save, OverlayStyle style, Reporter& report,
                const std::atomic<bool>& cancel);

}  // namespace sapiens_seg::cli
