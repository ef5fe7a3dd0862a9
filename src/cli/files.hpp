// How the CLI writes a file: never in place. Each file is written to <path>.tmp<pid><ext> in the
// same folder, flushed to disk (fsync), then renamed over <path>, so a reader (or a later
// --skip-existing) sees the old file or the whole new one. Every write, the flush, the fsync and
// the close are checked: a failure (disk full, a file size limit, no permission, an I/O error)
// removes the temporary file and throws Error(kIo) naming the file and the reason. A path that
// is an input of the run is never written.
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

// An image by its extension: encoded in memory (cv::imencode; the encoded file is held once),
// then written as write_file writes (OpenCV's own file writes do not report a failed flush).
void write_image(const std::string& path, const cv::Mat& image);

// A NumPy .npy file (format 1.0) of `shape`, its items produced in pieces by `next`, which is
// called with a buffer and the number of items it may fill and returns the number it filled.
void write_npy(const std::string& path, const std::string& dtype, std::size_t item_size,
               const std::vector<std::int64_t>& shape,
               const std::function<std::size_t(void* buffer, std::size_t max_items)>& next);

// Creates the output folder and checks that a file can be written in it: a run fails early
// (before loading gigabytes) when it cannot be.
void prepare_out_dir(const std::string& dir);

// fsync of a folder: the names renamed into it are on disk (the files' data already is).
void sync_dir(const std::string& dir);

// The output folder's lock: one run at a time writes into a folder. Held (flock) from
// construction to destruction in <dir>/.sapiens-seg.lock, which says who holds it; the kernel
// releases it when the process dies however it dies (kill -9 too), so a lock is never stale.
// A second run gets Error(kIo) naming the lock and the holder's pid. On a file system without
// locks the run goes on unlocked: unsupported() says why.
class OutDirLock {
 public:
  explicit OutDirLock(const std::string& dir);
  ~OutDirLock();
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;
  const std::string& unsupported() const { return unsupported_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::string unsupported_;
};
std::string lock_file_name();  // ".sapiens-seg.lock"

// True for the temporary names of this tool's writes: <file>.tmp<pid><ext of file>, and
// <base>_overlay.partial.mp4.
bool is_temp_file_name(const std::string& name);

// Removes the temporary files that a killed run (kill -9, power loss) left in `dir` and in its
// <base>_frames folders. Call with the folder's lock held (no other run writes there); returns
// how many were removed.
std::size_t remove_stale_temp_files(const std::string& dir);

}  // namespace sapiens_seg::cli
