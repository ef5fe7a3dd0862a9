#include "atomic_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::io {

void write_file_atomic(const std::string& path, const void* data, std::size_t size) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  auto fail = [&](const std::string& what) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error(ErrorCode::kIo,
                "cannot write " + path + ": " + what + " (" + std::strerror(err) + ")");
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) fail("cannot create the file");
  const bool ok = std::fwrite(data, 1, size, f) == size;
  const bool flushed = std::fflush(f) == 0;
  const bool synced = ::fsync(fileno(f)) == 0 || errno == EINVAL;
  if (std::fclose(f) != 0 || !ok || !flushed || !synced) fail("write failed");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("rename failed");
}

}  // namespace sapiens_seg::io
