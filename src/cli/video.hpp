// `segment`'s videos: frames in order, prepared and run in batches, written as an overlay video
// and/or one label PNG per frame.
#pragma once

#include <atomic>
#include <string>

#include "cli/naming.hpp"
#include "cli/outputs.hpp"
#include "cli/report.hpp"
#include "cli/segment.hpp"
#include "sapiens_seg/model.hpp"

namespace sapiens_seg::cli {

// Reports the video once (ok with its frame counts, or its error).
void run_video(const Model& model, const std::string& path, const OutputNames& names,
               const SegmentArgs& args, const SaveSet& save, OverlayStyle style, Reporter& report,
               const std::atomic<bool>& cancel);

}  // namespace sapiens_seg::cli
