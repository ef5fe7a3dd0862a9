#include "npy.hpp"

#include <filesystem>
#include <sstream>

#include "atomic_file.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::io {

void write_npy(const std::string& path, const std::string& dtype, std::size_t item_size,
               const std::vector<std::int64_t>& shape, const void* data) {
  std::ostringstream dict;
  dict << "{'descr': '" << dtype << "', 'fortran_order': False, 'shape': (";
  std::size_t count = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    dict << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) dict << ' ';
    count *= static_cast<std::size_t>(shape[i]);
  }
  dict << "), }";
  std::string header = dict.str();
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64 and
  // ended by a newline, as the format specifies.
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(static_cast<const char*>(data), count * item_size);
  write_file_atomic(path, out.data(), out.size());
}

}  // namespace sapiens_seg::io
