// Writing a file so that no reader ever sees it half written: the weight store's stamps and
// notices, the CLI's outputs and the .npy writer all go through here.
#pragma once

#include <cstddef>
#include <string>

namespace sapiens_seg::io {

// Writes `bytes` to `path` atomically (temporary file in the same folder, then rename), so a
// failure (disk full, no permission) leaves no partial file. Throws Error(kIo).
void write_file_atomic(const std::string& path, const void* data, std::size_t size);

}  // namespace sapiens_seg::io
