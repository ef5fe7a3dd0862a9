// How the CLI writes a file: never in place. Each file is written to <path>.tmp<pid><ext> in the
// same folder, flushed to disk, then renamed over <path>, so a reader (or a later
// --skip-existing) sees the old file or the whole new one, and a failure (disk full, no
// permission) removes the temporary file. A path that is an input of the run is never written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace cv {
class Mat;
}

namespace sapiens_seg::cli {

// The inputs of the run: no write may replace one (also through another spelling of its path
// or a symbolic link to it). Set once, before the writers start.
void protect_inputs(const std::vector<std::string>& paths);

// `fill` writes the content to the open temporary file. Throws Error(kIo) naming `path`.
void write_file(const std::string& path, const std::function<void(std::FILE*)>& fill);
void write_file(const std::string& path, const void* data, std::size_t size);

// An image by its extension (cv::imwrite streams the encoder's output to the file: no second
// full-size buffer).
void write_image(const std::string& path, const cv::Mat& image);

// A NumPy .npy file (format 1.0) of `shape`, its items produced in pieces by `next`, which is
// called with a buffer and the number of items it may fill and returns the number it filled.
void write_npy(const std::string& path, const std::string& dtype, std::size_t item_size,
               const std::vector<std::int64_t>& shape,
               const std::function<std::size_t(void* buffer, std::size_t max_items)>& next);

// Creates the output folder and checks that a file can be written in it: a run fails early
// (before loading gigabytes) when it cannot be.
void prepare_out_dir(const std::string& dir);

}  // namespace sapiens_seg::cli
