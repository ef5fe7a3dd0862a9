#include "sha256.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <openssl/evp.h>

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::io {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr) throw Error(ErrorCode::kInternal, "OpenSSL: cannot allocate a digest");
  reset();
}

void Sha256::reset() {
  if (EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    throw Error(ErrorCode::kInternal, "OpenSSL: cannot initialise SHA-256");
  }
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
}

void Sha256::update(const void* data, std::size_t size) {
  if (EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size) != 1) {
    throw Error(ErrorCode::kInternal, "OpenSSL: SHA-256 update failed");
  }
}

std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), md, &n) != 1) {
    throw Error(ErrorCode::kInternal, "OpenSSL: SHA-256 final failed");
  }
  static const char* digits = "0123456789abcdef";
  std::string out(2 * static_cast<std::size_t>(n), '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[md[i] >> 4];
    out[2 * i + 1] = digits[md[i] & 15];
  }
  return out;
}

std::string sha256_file(const std::string& path,
                        const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) {
    throw Error(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                "cannot open " + path + ": " + std::strerror(errno));
  }
  std::error_code ec;
  const std::uint64_t total = std::filesystem::file_size(path, ec);
  Sha256 sha;
  std::vector<unsigned char> buf(4u << 20);
  std::uint64_t done = 0;
  for (;;) {
    const std::size_t n = std::fread(buf.data(), 1, buf.size(), f.get());
    if (n > 0) {
      sha.update(buf.data(), n);
      done += n;
      if (progress) progress(done, total);
    }
    if (n < buf.size()) {
      if (std::ferror(f.get())) throw Error(ErrorCode::kIo, "read error while hashing " + path);
      break;
    }
  }
  return sha.hex();
}

}  // namespace sapiens_seg::io
