#include "mapped_file.hpp"

#include <cerrno>
#include <cstring>

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

}  // namespace

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
  m.owner = std::shared_ptr<const void>(
      addr, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  m.data = static_cast<const std::uint8_t*>(addr);
  return m;
}

}  // namespace sapiens_seg::core
