// The header of a .safetensors file (the format of the Sapiens2 checkpoints), parsed and checked
// without LibTorch so that the fuzz target can build it alone; safetensors.hpp maps the file and
// hands out the tensors.
//
// Layout: an 8-byte little-endian header length N, then N bytes of UTF-8 JSON (an object mapping
// tensor names to {"dtype", "shape", "data_offsets": [begin, end]} plus an optional
// "__metadata__" object of strings), then the data section; offsets are relative to its start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace sapiens_seg::core {

enum class SafetensorsDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

std::string_view to_string(SafetensorsDtype dtype) noexcept;  // "F32", "BF16", ... as in files
std::size_t element_size(SafetensorsDtype dtype) noexcept;

struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<std::int64_t> shape;  // [] for a scalar
  std::int64_t numel = 1;           // product of shape (1 for a scalar, 0 when any dim is 0)
  std::uint64_t begin = 0;          // byte range [begin, end) in the data section
  std::uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;   // ordered by position in the data section
  std::map<std::string, std::size_t> by_name;   // name -> index into tensors
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
  std::uint64_t data_offset = 0;                // 8 + N: where the data section starts
  std::uint64_t data_size = 0;                  // file size - data_offset
};

// The header may not be larger than this (the reference implementation's limit too): a corrupt
// length must not make us parse or allocate gigabytes.
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses and checks the header of a whole file image `file` of `size` bytes (only the first 8 + N
// bytes are read; `size` bounds the data section). `source` names the file in messages. Throws
// Error(kFormatError) naming the file (and the tensor) for anything malformed; never reads outside
// [file, file + size).
SafetensorsHeader parse_safetensors_header(const std::uint8_t* file, std::size_t size,
                                           const std::string& source);

}  // namespace sapiens_seg::core
