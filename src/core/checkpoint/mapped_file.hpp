// Read-only memory maps of whole checkpoint files: tensors are used as views into the map (no
// copy for CPU float32), so the map lives as long as any view holds `owner`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace sapiens_seg::core {

struct MappedFile {
  std::shared_ptr<const void> owner;  // unmaps when the last holder lets go
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
};

// Maps `path` (a regular file). `what` names it in error messages ("checkpoint", "safetensors
// file"). Error(kNotFound) when it does not exist, Error(kIo) for anything else. An empty file
// comes back unmapped (data null, size 0) for the caller's parser to refuse in its own words.
// A file truncated by someone else while mapped faults (SIGBUS) on access, as with any mmap-based
// reader.
MappedFile map_file(const std::string& path, const std::string& what);

// Drops this process's resident pages of [data, data + bytes) when that range lies inside a live
// map_file mapping (whole pages only; the mapping stays valid, and a later read faults the pages
// back in from the file). For weights that were converted to another dtype or copied to a device:
// without it the file's pages stay counted in the process's RSS until the map is released, so a
// bfloat16 load of a 20 GB float32 file would peak at 30 GB instead of 10. Returns the bytes
// released (0 for memory that is not a file mapping, which is never touched).
std::size_t release_mapped_pages(const void* data, std::size_t bytes);

}  // namespace sapiens_seg::core
