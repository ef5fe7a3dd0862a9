// Shared helpers of the C++ tests: fixture paths and reading the reference .npy files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sapiens_seg::test {

// $SAPIENS_SEG_FIXTURES (set by ctest), with a skip message when absent.
std::string fixtures_dir();
std::string fixture(const std::string& relative);  // fixtures_dir()/relative

struct Array {
  std::string dtype;  // NumPy descr, e.g. "<f4", "|u1"
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;
  std::int64_t numel() const;
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
};
// Reads a C-order little-endian .npy written by NumPy (format 1.0-3.0).
Array read_npy(const std::string& path);

}  // namespace sapiens_seg::test
