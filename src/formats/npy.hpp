// NumPy .npy encoding (format 1.0), shared by every front end that hands arrays out: the CLI's
// files (cli/files.cpp) and the server's responses (serve/encode.cpp) must be the same bytes,
// and the authors' demo users load both with numpy.load. Header-only so that each target that
// needs it (the CLI, the server, the Python module) compiles it without another library.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace sapiens_seg::formats {

// Both the header's length field and the items are written in the machine's order and declared
// little-endian ('<'): true on every platform the library builds for.
static_assert(std::endian::native == std::endian::little, "npy writers assume little-endian");

// The magic, version, header length and the dict literal of a C-order array, padded with spaces
// so that the data starts at a multiple of 64 bytes (as numpy.save writes it).
inline std::string npy_header(std::string_view descr, std::span<const std::int64_t> shape) {
  std::string dict = "{'descr': '";
  dict += descr;
  dict += "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    // A 1-tuple needs its trailing comma; numpy writes none after the last item otherwise.
    if (shape.size() == 1 || i + 1 < shape.size()) dict += ',';
    if (i + 1 < shape.size()) dict += ' ';
  }
  dict += "), }";
  const std::size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string head("\x93NUMPY\x01\x00", 8);
  head.push_back(static_cast<char>(dict.size() & 0xff));
  head.push_back(static_cast<char>(dict.size() >> 8));
  return head + dict;
}

// Label indices widened to int64 ('<i8'), the type the authors' demo saves <name>_seg.npy in.
inline void widen_labels(const std::uint8_t* labels, std::size_t count, void* out) {
  // memcpy: `out` may be a byte buffer (a std::string) with no int64 object in it.
  auto* dst = static_cast<unsigned char*>(out);
  for (std::size_t k = 0; k < count; ++k) {
    const std::int64_t v = labels[k];
    std::memcpy(dst + k * sizeof v, &v, sizeof v);
  }
}

// A whole <name>_seg.npy in memory: an H x W int64 label map.
inline std::string labels_npy(const std::uint8_t* labels, int height, int width) {
  const std::int64_t shape[] = {height, width};
  std::string out = npy_header("<i8", shape);
  const std::size_t count = static_cast<std::size_t>(height) * static_cast<std::size_t>(width);
  const std::size_t head = out.size();
  out.resize(head + count * sizeof(std::int64_t));
  widen_labels(labels, count, out.data() + head);
  return out;
}

}  // namespace sapiens_seg::formats
