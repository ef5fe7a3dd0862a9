#include "mapped_file.hpp"

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

// The live read-only file mappings, [begin, end), so that release_mapped_pages only ever drops
// pages of one of them (MADV_DONTNEED on anonymous memory would zero it).
std::mutex g_maps_mutex;
std::map<std::uintptr_t, std::uintptr_t>& live_maps() {
  static std::map<std::uintptr_t, std::uintptr_t> maps;
  return maps;
}

}  // namespace

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
  if (!(it->first <= b && b + bytes <= it->second)) return 0;  // not inside one file mapping
  // A private, never-written file mapping: dropped pages read back from the file if touched.
  if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
  return last - first;
}

MappedFile map_file(const std::string& path, const std::string& what) {
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
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
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kIo, what + " " + path + " is not a regular file");
  }
  MappedFile m;
  m.size = static_cast<std::size_t>(st.st_size);
  if (m.size == 0) return m;  // mmap refuses length 0
  void* addr = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (addr == MAP_FAILED) {
    throw Error(ErrorCode::kIo, "cannot map " + what + " " + path + ": " + std::strerror(errno));
  }
  // The mapping outlives the descriptor, closed on return.
  const std::size_t size = m.size;
  {
    std::lock_guard<std::mutex> lock(g_maps_mutex);
    live_maps()[reinterpret_cast<std::uintptr_t>(addr)] =
        reinterpret_cast<std::uintptr_t>(addr) + size;
  }
  m.owner = std::shared_ptr<const void>(addr, [size](const void* p) {
    {
      std::lock_guard<std::mutex> lock(g_maps_mutex);
      live_maps().erase(reinterpret_cast<std::uintptr_t>(p));
    }
    ::munmap(const_cast<void*>(p), size);
  });
  m.data = static_cast<const std::uint8_t*>(addr);
  return m;
}

}  // namespace sapiens_seg::core
