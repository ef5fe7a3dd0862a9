#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace sapiens_seg::io {

// Streaming SHA-256 (OpenSSL EVP), lower-case hex.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, std::size_t size);
  void reset();       // start over, as if new
  std::string hex();  // finishes the digest

 private:
  void* ctx_;
};

// Hash of a whole file, read in 4 MiB blocks; `progress(done, total)` is called per block.
std::string sha256_file(const std::string& path,
                        const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});

}  // namespace sapiens_seg::io
