#include "files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <unordered_set>

#include <opencv2/imgcodecs.hpp>

#include "cli/stop.hpp"
#include "formats/npy.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::cli {
namespace fs = std::filesystem;

namespace {

std::unordered_set<std::string>& protected_paths() {
  static std::unordered_set<std::string> p;
  return p;
}

// The file a write to `p` would replace: its folder resolved, the last component as written (a
// rename replaces a symbolic link, not its target).
std::string replaced_key(const fs::path& p) {
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(fs::absolute(p, ec).parent_path(), ec);
  return (dir / p.filename()).lexically_normal().string();
}

void check_not_input(const std::string& path) {
  const auto& inputs = protected_paths();
  if (inputs.empty()) return;
  std::error_code ec;
  const fs::path p(path);
  const std::string resolved = fs::weakly_canonical(fs::absolute(p, ec), ec).string();
  if (inputs.count(replaced_key(p)) || (!ec && inputs.count(resolved))) {
    throw Error(ErrorCode::kInternal, "refusing to write " + path +
                                          ": it is an input of this run (the output names " +
                                          "should have avoided it; please report this)");
  }
}

std::string temp_name(const std::string& path) {
  return path + ".tmp" + std::to_string(::getpid()) + fs::path(path).extension().string();
}

[[noreturn]] void fail(const std::string& path, const std::string& tmp, const std::string& what,
                       int err) {
  std::remove(tmp.c_str());
  throw Error(ErrorCode::kIo, "cannot write " + path + ": " + what +
                                  (err ? std::string(" (") + std::strerror(err) + ")" : ""));
}

// Flushes the temporary file to disk and renames it over `path`.
void commit(const std::string& path, const std::string& tmp) {
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || (::fsync(fd) != 0 && errno != EINVAL)) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    fail(path, tmp, "write failed", err);
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, tmp, "rename failed", errno);
}

}  // namespace

void protect_inputs(const std::vector<std::string>& paths) {
  auto& set = protected_paths();
  for (const auto& p : paths) {
    std::error_code ec;
    set.insert(replaced_key(p));
    const fs::path resolved = fs::weakly_canonical(fs::absolute(p, ec), ec);
    if (!ec) set.insert(resolved.string());
  }
}

void write_file(const std::string& path, const std::function<void(std::FILE*)>& fill) {
  check_not_input(path);
  const std::string tmp = temp_name(path);
  const TempFileGuard guard(tmp);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) fail(path, tmp, "cannot create the file", errno);
  try {
    fill(f);
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  const bool ok = !std::ferror(f) && std::fflush(f) == 0;
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) fail(path, tmp, "write failed", ok ? errno : err);
  commit(path, tmp);
}

void write_file(const std::string& path, const void* data, std::size_t size) {
  write_file(path, [&](std::FILE* f) {
    if (size > 0 && std::fwrite(data, 1, size, f) != size) {
      throw Error(ErrorCode::kIo,
                  "cannot write " + path + ": write failed (" + std::strerror(errno) + ")");
    }
  });
}

void write_image(const std::string& path, const cv::Mat& image) {
  check_not_input(path);
  const std::string tmp = temp_name(path);
  const TempFileGuard guard(tmp);
  bool ok = false;
  std::string why;
  errno = 0;
  try {
    ok = cv::imwrite(tmp, image);
  } catch (const cv::Exception& e) {
    why = e.what();
  }
  if (!ok) {
    const int err = errno;
    fail(path, tmp, why.empty() ? "cannot encode or write the image" : "cannot encode: " + why,
         err);
  }
  commit(path, tmp);
}

void write_npy(const std::string& path, const std::string& dtype, std::size_t item_size,
               const std::vector<std::int64_t>& shape,
               const std::function<std::size_t(void* buffer, std::size_t max_items)>& next) {
  const std::string head = formats::npy_header(dtype, shape);
  std::size_t count = 1;
  for (const std::int64_t n : shape) count *= static_cast<std::size_t>(n);
  // 4 MB pieces: the data is never held a second time.
  const std::size_t piece = std::max<std::size_t>(1, (std::size_t{4} << 20) / item_size);
  write_file(path, [&](std::FILE* f) {
    auto put = [&](const void* p, std::size_t bytes) {
      if (bytes > 0 && std::fwrite(p, 1, bytes, f) != bytes) {
        throw Error(ErrorCode::kIo,
                    "cannot write " + path + ": write failed (" + std::strerror(errno) + ")");
      }
    };
    put(head.data(), head.size());
    std::unique_ptr<char[]> buf(new char[piece * item_size]);
    for (std::size_t done = 0; done < count;) {
      const std::size_t n = next(buf.get(), std::min(piece, count - done));
      if (n == 0) throw Error(ErrorCode::kInternal, "writing " + path + ": the data ended early");
      put(buf.get(), n * item_size);
      done += n;
    }
  });
}

}  // namespace sapiens_seg::cli
