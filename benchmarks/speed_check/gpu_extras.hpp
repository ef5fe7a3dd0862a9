// What only a benchmark needs and the public API does not give, kept apart from the library
// columns (library.hpp) and built on the library's internals on purpose:
//
//   - the `original-autocast` column: the authors' float32 graph run under autocast, their own way
//     to half precision on a GPU, against which the product's GPU goal is stated. The library has
//     no such mode (its original mode runs the graph as shipped, in float32), so this column is
//     the core steps (library_core.hpp) with the network wrapped in an autocast scope;
//   - CUDA-graph capture counts: whether a column's timings are of graph replays at all. Model
//     keeps its network private; the core steps' network shows them;
//   - the backbone/head split: the original's two traced submodules and the kernels schedule's two
//     halves, timed apart. Neither is an entry point of the library;
//   - peak CUDA memory: LibTorch's caching-allocator counters, reset before the timed rounds.
//
// The benchmark builds with and without the IO layer, and so does this part (the GPU machine has
// none); where LibTorch has no CUDA (SPEED_CHECK_CUDA unset) the CUDA counters are left out, and a
// network the device cannot run says so in its column, as any other.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "library.hpp"

namespace speed_check::gpu_extras {

// The authors' float32 graph (Sapiens v1's TorchScript file) under autocast to options.dtype on a
// CUDA device; the other options as for a library column.
std::unique_ptr<LibraryColumn> load_original_autocast(const std::string& path,
                                                      const sapiens_seg::LoadOptions& options);

// The column's CUDA-graph counts (captured and eager shapes, why, replays), or null where it has
// none (the CPU, a column through the public API, CUDA graphs off).
nlohmann::json graph_counts(const LibraryColumn& column);

// The network of `path` in the column's `mode` (a library mode or "original-autocast") timed in
// its backbone and head apart at batch 1, eagerly (no CUDA graph): backbone_ms and head_ms, or a
// note saying why there is no split. Builds a second copy of the network, so it runs after the
// timed rounds and the peak-memory readings.
nlohmann::json split(const std::string& path, const std::string& mode,
                     const sapiens_seg::LoadOptions& options);

// The CUDA caching allocator's peaks since the last reset (cuda_peak_allocated,
// cuda_peak_reserved) added to `out` when `device` is a CUDA device; nothing otherwise.
void add_cuda_peaks(const std::string& device, nlohmann::json& out);
void reset_cuda_peaks(const std::string& device);
// Waits for every queued CUDA operation (a timed call starts and ends on an idle device).
void sync(const std::string& device);

}  // namespace speed_check::gpu_extras
