// Whole checkpoint files read into this process's private memory: tensors are used as views into
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
  // The file these bytes are, as fstat() gave it on the descriptor that was read (and unchanged
  // to the end of the read): a verification stamp is held against this, not against a later
  // stat() of the path, so a file replaced between the stamp check and the read cannot pass.
  std::uint64_t device = 0, inode = 0;
  std::int64_t mtime_ns = 0;
};

// Throws unless `path` names a regular file (symbolic links followed), without opening it: a FIFO
// would block an open() until a writer came, a device may have side effects on open. `what`
// names the file in messages ("checkpoint", "image"). Error(kNotFound) when nothing is there,
// Error(kInvalidInput) for a directory, FIFO, socket or device (the message says which),
// Error(kIo) when it cannot be examined.
void check_regular_file(const std::string& path, const std::string& what);

// Reads all of `path` (a regular file, see check_regular_file) with pread() into anonymous
// memory of this process, read-only from then on. `what` names it in error messages
// ("checkpoint", "safetensors file").
//
// Why not a file mapping: a checkpoint rewritten in place while a model uses it (`cp new.pt2
// model.pt2`) changed the weights under a running model, and one truncated by the copy killed the
// process with SIGBUS on the next access (even the private, copied pages of a file mapping are
// taken away by a truncation). A loaded model depends on the bytes it read, never on the file
// again. A file cut short while it is read is an Error(kIo) naming it; so is one whose size or
// modification time changed between the start and the end of the read (a copy in progress).
// Error(kOutOfMemory) when the memory cannot be had. An empty file comes back empty (data null,
// size 0) for the caller's parser to refuse in its own words.
MappedFile map_file(const std::string& path, const std::string& what);

// Gives back the memory of the whole pages of [data, data + bytes) when that range lies inside
// one live map_file buffer; bytes outside whole pages, and memory that is not such a buffer, are
// never touched. For weights that were converted to another dtype or copied to a device: without
// it the file's bytes would stay resident beside the converted copy until the model is released,
// so a bfloat16 load of a 20 GB float32 file would keep 30 GB resident after the load instead of
// 10 (during the load the peak is the file's size either way). The pages become
// a read-only mapping of the same bytes of the file: should the range be read again (a second
// network built from the same tensors), it faults in from the file as the file is then, so
// release only what the model will not read again. Returns the bytes released.
std::size_t release_mapped_pages(const void* data, std::size_t bytes);

}  // namespace sapiens_seg::core
