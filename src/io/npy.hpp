// Writing NumPy .npy files (format version 1.0), as the authors' demo saves its outputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sapiens_seg::io {

// dtype: a NumPy descr such as "|u1", "|b1", "<i8", "<f4"; data holds prod(shape) items of
// `item_size` bytes. Written to a temporary file and renamed, so a failure (disk full, no
// permission) leaves no partial file. Throws Error(kIo).
void write_npy(const std::string& path, const std::string& dtype, std::size_t item_size,
               const std::vector<std::int64_t>& shape, const void* data);

}  // namespace sapiens_seg::io
