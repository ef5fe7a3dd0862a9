// Whole checkpoint files held in this process's private memory: tensors are used as views into
// it (no second copy for CPU float32), so it lives as long as any view holds `owner`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace sapiens_seg::core {

struct MappedFile {
  std::shared_ptr<const void> owner;  // frees the memory when the last holder lets go
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
};

// Throws unless `path` names a regular file (symbolic links followed), without opening it: a FIFO
// would block an open() until a writer came, a device may have side effects on open. `what`
// names the file in messages ("checkpoint", "image"). Error(kNotFound) when nothing is there,
// Error(kInvalidInput) for a directory, FIFO, socket or device (the message says which),
// Error(kIo) when it cannot be examined.
void check_regular_file(const std::string& path, const std::string& what);

// Reads all of `path` (a regular file, see check_regular_file) into private, read-only memory.
// `what` names it in error messages ("checkpoint", "safetensors file").
//
// Why not a shared file mapping: a checkpoint rewritten in place while a model uses it (`cp
// new.pt2 model.pt2`) would change the weights under a running model, and one truncated by the
// copy would kill the process with SIGBUS on the next access. A loaded model depends on the
// bytes it read, never on the file again. The file is read with pread(), so a file cut short
// while it is read is an Error(kIo) naming it; a file whose size or modification time changed
// between the start and the end of the read (a copy in progress) is refused the same way.
// Error(kOutOfMemory) when the memory cannot be had. An empty file comes back empty (data null,
// size 0) for the caller's parser to refuse in its own words.
MappedFile map_file(const std::string& path, const std::string& what);

// Gives back to the system the whole pages of [data, data + bytes) when that range lies inside
// one live map_file buffer; bytes outside whole pages, and memory that is not such a buffer,
// are never touched. For weights that were converted to another dtype or copied to a device:
// without it the file's bytes would stay resident beside the converted copy until the model is
// released. The released bytes read as zeros afterwards: call it only for a range that no view
// will read again. Returns the bytes released.
std::size_t release_mapped_pages(const void* data, std::size_t bytes);

}  // namespace sapiens_seg::core
