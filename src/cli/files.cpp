#include "files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
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

// The reason of a failed write in words, with what to do where that is clear: a file size limit
// (`ulimit -f`, RLIMIT_FSIZE, which batch schedulers set) says its value.
std::string reason(int err) {
  std::string why = std::strerror(err);
  if (err == EFBIG) {
    struct rlimit lim {};
    if (::getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
      why += ": the file size limit of this process (ulimit -f, RLIMIT_FSIZE) is " +
             std::to_string(static_cast<unsigned long long>(lim.rlim_cur)) + " bytes";
    }
  } else if (err == ENOSPC || err == EDQUOT) {
    why += ": the output folder's file system is full";
  }
  return why;
}

[[noreturn]] void fail(const std::string& path, const std::string& tmp, const std::string& what,
                       int err) {
  std::remove(tmp.c_str());
  throw Error(ErrorCode::kIo,
              "cannot write " + path + ": " + what + (err ? " (" + reason(err) + ")" : ""));
}

// Flushes the open temporary file's data to disk and closes it: any error of the writes, the
// flush, the fsync or the close (NFS reports some only there) fails the file.
void finish_temp(const std::string& path, const std::string& tmp, std::FILE* f) {
  int err = 0;
  if (std::ferror(f)) err = errno ? errno : EIO;
  if (!err && std::fflush(f) != 0) err = errno;
  if (!err && ::fsync(fileno(f)) != 0 && errno != EINVAL && errno != EROFS) err = errno;
  if (std::fclose(f) != 0 && !err) err = errno;
  if (err) fail(path, tmp, "write failed", err);
}

void commit(const std::string& path, const std::string& tmp) {
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
    errno = 0;
    fill(f);
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  finish_temp(path, tmp, f);
  commit(path, tmp);
}

void write_file(const std::string& path, const void* data, std::size_t size) {
  write_file(path, [&](std::FILE* f) {
    if (size > 0 && std::fwrite(data, 1, size, f) != size) {
      throw Error(ErrorCode::kIo,
                  "cannot write " + path + ": write failed (" + reason(errno) + ")");
    }
  });
}

void write_image(const std::string& path, const cv::Mat& image) {
  // Encoded in memory, then written and checked as any file: OpenCV's encoders writing to a
  // file ignore a failed final flush or close (a full disk left 0-byte or cut PNGs that
  // imwrite called written).
  check_not_input(path);
  std::vector<std::uint8_t> bytes;
  std::string why;
  bool ok = false;
  try {
    ok = cv::imencode(fs::path(path).extension().string(), image, bytes);
  } catch (const cv::Exception& e) {
    why = e.what();
  }
  if (!ok) {
    throw Error(ErrorCode::kIo,
                "cannot write " + path + ": " +
                    (why.empty() ? "cannot encode the image" : "cannot encode: " + why));
  }
  write_file(path, bytes.data(), bytes.size());
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

// Fails early (before loading gigabytes) when the output folder cannot be written.
void prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot create output folder " + dir + ": " + ec.message());
  const std::string probe = (fs::path(dir) / ".sapiens-seg-write-test").string();
  write_file(probe, "", 0);
  fs::remove(probe, ec);
}

}  // namespace sapiens_seg::cli

namespace sapiens_seg::cli {

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int err = fd < 0 ? errno : 0;
  if (fd >= 0) {
    if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) err = errno;
    ::close(fd);
  }
  if (err) {
    throw Error(ErrorCode::kIo,
                "cannot flush the folder " + dir + " to disk (" + reason(err) + ")");
  }
}

namespace {

constexpr const char* kLockName = ".sapiens-seg.lock";

// "pid 123 on host, since 2026-12-06 15:26:01 UTC" from a lock file's text (see OutDirLock).
std::string describe_holder(const std::string& lock_path) {
  std::ifstream in(lock_path);
  long long pid = 0;
  std::string host, since;
  if (!(in >> pid >> host) || pid <= 0) return "";
  std::getline(in >> std::ws, since);
  return "pid " + std::to_string(pid) + " on " + host + (since.empty() ? "" : ", since " + since);
}

}  // namespace

std::string lock_file_name() {
  return kLockName;
}

OutDirLock::OutDirLock(const std::string& dir) : path_((fs::path(dir) / kLockName).string()) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ < 0) {
      throw Error(ErrorCode::kIo,
                  "cannot create the lock file " + path_ + " (" + std::strerror(errno) + ")");
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const std::string who = describe_holder(path_);
        ::close(fd_);
        fd_ = -1;
        throw Error(ErrorCode::kIo,
                    "another sapiens-seg run" + (who.empty() ? "" : " (" + who + ")") +
                        " is writing into " + dir + ": it holds the lock " + path_ +
                        ". Two runs into one folder could replace each other's outputs; wait "
                        "for it to end, or write into another folder (-o)");
      }
      // A file system without locks (some FUSE and network mounts): the run goes on unlocked,
      // and says so.
      ::close(fd_);
      fd_ = -1;
      ::unlink(path_.c_str());
      unsupported_ = "cannot lock " + path_ + " (" + std::strerror(err) +
                     "): this file system has no file locks, so a second run into " + dir +
                     " at the same time would not be detected";
      return;
    }
    // The previous holder may have removed the file between our open and our lock: then we
    // hold a lock on a file nobody else can find. Lock the file that is there.
    struct stat held {
    }, there{};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &there) == 0 &&
        held.st_ino == there.st_ino && held.st_dev == there.st_dev) {
      char host[256] = "?";
      ::gethostname(host, sizeof host - 1);
      char since[64] = "";
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      if (::gmtime_r(&now, &tm)) std::strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S UTC", &tm);
      const std::string text = std::to_string(::getpid()) + " " + host + " " + since + "\n";
      // Who holds it, for the message of a second run; a full disk leaves it empty, harmlessly.
      if (::ftruncate(fd_, 0) == 0) {
        [[maybe_unused]] const ssize_t n = ::pwrite(fd_, text.data(), text.size(), 0);
      }
      return;
    }
    ::close(fd_);
    fd_ = -1;
  }
  throw Error(ErrorCode::kIo, "cannot take the lock " + path_ + ": it keeps being replaced");
}

OutDirLock::~OutDirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while it is held: no other run can have it now
  ::close(fd_);
}

bool is_temp_file_name(const std::string& name) {
  // <output>.tmp<pid><ext of output> (files.hpp), and the overlay video being written.
  static const std::string partial = "_overlay.partial.mp4";
  if (name.size() > partial.size() &&
      name.compare(name.size() - partial.size(), partial.size(), partial) == 0) {
    return true;
  }
  for (std::size_t at = name.rfind(".tmp"); at != std::string::npos && at > 0;
       at = name.rfind(".tmp", at - 1)) {
    std::size_t end = at + 4;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == at + 4) continue;  // no pid
    const std::string output = name.substr(0, at);
    const std::string ext = fs::path(output).extension().string();
    if ((!ext.empty() || output == ".sapiens-seg-write-test") &&
        name.compare(end, std::string::npos, ext) == 0) {
      return true;
    }
  }
  return false;
}

std::size_t remove_stale_temp_files(const std::string& dir) {
  std::size_t removed = 0;
  auto sweep = [&](const fs::path& folder) {
    std::error_code ec;
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code sec;
      if (!it->is_regular_file(sec) || !is_temp_file_name(it->path().filename().string())) {
        continue;
      }
      if (fs::remove(it->path(), sec)) ++removed;
    }
  };
  sweep(dir);
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code sec;
    if (name.size() > 7 && name.compare(name.size() - 7, 7, "_frames") == 0 &&
        it->symlink_status(sec).type() == fs::file_type::directory) {
      sweep(it->path());
    }
  }
  return removed;
}

}  // namespace sapiens_seg::cli
