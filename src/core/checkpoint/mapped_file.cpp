#include "mapped_file.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core {
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// The live map_file mappings, [begin, end), so that release_mapped_pages only ever drops pages
// of one of them.
struct LiveMap {
  std::uintptr_t end;
  int fd;  // the file, open for as long as the buffer lives (see release_mapped_pages)
};
std::mutex g_maps_mutex;
std::map<std::uintptr_t, LiveMap>& live_maps() {
  static std::map<std::uintptr_t, LiveMap> maps;
  return maps;
}

// What a file that is not a regular file is, in words; "" for a regular file.
const char* not_regular(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

[[noreturn]] void refuse(const std::string& path, const std::string& what, mode_t mode) {
  throw Error(ErrorCode::kInvalidInput,
              what + " " + path + " is " + not_regular(mode) + ", not a regular file");
}

bool same_file_state(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

[[noreturn]] void changed(const std::string& path, const std::string& what,
                          const std::string& how) {
  throw Error(ErrorCode::kIo, what + " " + path + " changed while it was being read (" + how +
                                  "); is a copy to it still running? Load it again when the file "
                                  "is complete");
}

}  // namespace

void check_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR)
      throw Error(ErrorCode::kNotFound, what + " not found: " + path);
    throw Error(ErrorCode::kIo, "cannot open " + what + " " + path + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) refuse(path, what, st.st_mode);
}

std::size_t release_mapped_pages(const void* data, std::size_t bytes) {
  if (!data || bytes == 0) return 0;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto b = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t first = (b + page - 1) / page * page, last = (b + bytes) / page * page;
  if (last <= first) return 0;  // not one whole page inside the range
  std::lock_guard<std::mutex> lock(g_maps_mutex);
  const auto& maps = live_maps();
  auto it = maps.upper_bound(b);
  if (it == maps.begin()) return 0;
  --it;
  if (!(it->first <= b && b + bytes <= it->second.end)) return 0;  // not inside one buffer
  // The buffer mirrors the file byte for byte from a page boundary, so the released pages are
  // replaced by a read-only mapping of the same bytes of the file: the memory goes back to the
  // system, and should the range be read again it faults in from the file (as the file is then).
  const off_t offset = static_cast<off_t>(first - it->first);
  void* got = ::mmap(reinterpret_cast<void*>(first), last - first, PROT_READ,
                     MAP_PRIVATE | MAP_FIXED, it->second.fd, offset);
  if (got == MAP_FAILED) return 0;
  return last - first;
}

MappedFile map_file(const std::string& path, const std::string& what) {
  check_regular_file(path, what);
  // O_NONBLOCK: should the path have become a FIFO since the check, open() must not wait for a
  // writer; the fstat below refuses it. Regular files ignore the flag.
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR)
      throw Error(ErrorCode::kNotFound, what + " not found: " + path);
    throw Error(ErrorCode::kIo, "cannot open " + what + " " + path + ": " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw Error(ErrorCode::kIo, "cannot stat " + what + " " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) refuse(path, what, st.st_mode);
  MappedFile m;
  m.size = static_cast<std::size_t>(st.st_size);
  m.device = static_cast<std::uint64_t>(st.st_dev);
  m.inode = static_cast<std::uint64_t>(st.st_ino);
  m.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  if (m.size == 0) return m;  // mmap refuses length 0
  const std::size_t size = m.size;
  // Anonymous memory filled by pread(), not a mapping of the file: even the private pages of a
  // file mapping are taken away when the file is truncated (SIGBUS on the next access).
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    throw Error(err == ENOMEM ? ErrorCode::kOutOfMemory : ErrorCode::kIo,
                "cannot allocate " + std::to_string(size) + " bytes to read " + what + " " + path +
                    ": " + std::strerror(err));
  }
  const int kept_fd = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
  if (kept_fd < 0) {
    const int err = errno;
    ::munmap(addr, size);
    throw Error(ErrorCode::kIo, "cannot open " + what + " " + path + ": " + std::strerror(err));
  }
  std::shared_ptr<const void> owner(addr, [size, kept_fd](const void* p) {
    {
      std::lock_guard<std::mutex> lock(g_maps_mutex);
      live_maps().erase(reinterpret_cast<std::uintptr_t>(p));
    }
    ::munmap(const_cast<void*>(p), size);
    ::close(kept_fd);
  });
  auto* out = static_cast<std::uint8_t*>(addr);
  // Pieces bounded well below what one read() returns (about 2 GiB on Linux).
  constexpr std::size_t kPiece = std::size_t{64} << 20;
  for (std::size_t done = 0; done < size;) {
    const std::size_t want = std::min(kPiece, size - done);
    const ssize_t n = ::pread(fd.get(), out + done, want, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw Error(ErrorCode::kIo, "cannot read " + what + " " + path + ": " + std::strerror(errno));
    }
    if (n == 0) {
      changed(path, what,
              "it ended after " + std::to_string(done) + " of " + std::to_string(size) + " bytes");
    }
    done += static_cast<std::size_t>(n);
  }
  struct stat after {};
  if (::fstat(fd.get(), &after) != 0) {
    throw Error(ErrorCode::kIo, "cannot stat " + what + " " + path + ": " + std::strerror(errno));
  }
  if (!same_file_state(st, after)) {
    changed(path, what,
            "it was modified: " + std::to_string(st.st_size) + " bytes when the read began, " +
                std::to_string(after.st_size) + " at its end");
  }
  // Read-only from here, as the views promise (safetensors.hpp): a write through one is a bug.
  ::mprotect(addr, size, PROT_READ);
  {
    std::lock_guard<std::mutex> lock(g_maps_mutex);
    live_maps()[reinterpret_cast<std::uintptr_t>(addr)] = {
        reinterpret_cast<std::uintptr_t>(addr) + size, kept_fd};
  }
  m.owner = std::move(owner);
  m.data = out;
  return m;
}

}  // namespace sapiens_seg::core
