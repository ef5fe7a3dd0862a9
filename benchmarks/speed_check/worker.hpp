// A C++ worker: one column (a library mode, or gpu_extras' original-autocast) in a process of its
// own, serving the parent's commands, one JSON object per line each way:
//
//   {"cmd":"prepare","height":H,"width":W,"batch":B,"warmup":N}  first call and warm-up calls,
//        then the peak counters reset -> {"first_ms", "warmup_ms"}
//   {"cmd":"run","calls":N}       timed calls -> {"ms", "cpu_ms", "net_ms"} (one entry per call)
//   {"cmd":"peak"}                -> {"peak_rss", "rss", CUDA peaks on CUDA, "graphs"}
//   {"cmd":"split"}               -> gpu_extras::split
//   {"cmd":"outputs","height":H,"width":W,"prefix":P}  one image's raw logits and labels written
//        to P.logits and P.labels -> {"logits", "labels"} (their element counts)
//   {"cmd":"quit"}
//
// On start it loads (--load-repeats times) and says {"event":"ready", ...} or
// {"event":"unavailable","reason",...}. original_python.py and peers_python.py speak the same.
#pragma once

#include <cstdint>
#include <vector>

#include "options.hpp"

namespace speed_check {

int run_worker(const Options& options);

// The benchmark pattern (original_python.py draws the same one): two gradients and a diagonal
// texture, shifted per batch index, uint8 RGB.
std::vector<std::uint8_t> synthetic_rgb(int h, int w, int index);

}  // namespace speed_check
