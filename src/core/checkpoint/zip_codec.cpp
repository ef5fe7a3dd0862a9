#include "zip_codec.hpp"

#include <algorithm>

#include <zlib.h>

#ifdef SAPIENS_SEG_HAVE_ISAL
#include <isa-l/crc.h>
#endif

namespace sapiens_seg::core {

std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc) noexcept {
#ifdef SAPIENS_SEG_HAVE_ISAL
  // The same reflected CRC-32 as zlib's (pre- and post-inverted), 64-bit lengths; several times
  // faster than zlib 1.2's table code on CPUs with carry-less multiply.
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), size);
#else
  return static_cast<std::uint32_t>(
      ::crc32_z(crc, static_cast<const Bytef*>(data), static_cast<z_size_t>(size)));
#endif
}

std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b,
                            std::uint64_t size_b) noexcept {
  return static_cast<std::uint32_t>(
      ::crc32_combine64(crc_a, crc_b, static_cast<z_off64_t>(size_b)));
}

std::string crc32_implementation() {
#ifdef SAPIENS_SEG_HAVE_ISAL
  return "ISA-L (crc32_gzip_refl)";
#else
  return std::string("zlib ") + zlibVersion();
#endif
}

std::string inflate_raw(const std::uint8_t* in, std::size_t in_size, std::uint8_t* out,
                        std::size_t out_size) {
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) return "zlib cannot start inflating";
  // zlib counts in 32-bit units: feed and drain large records in pieces. Past the declared size
  // the output goes to one spare byte, so a stream holding more than declared is noticed.
  constexpr std::size_t kStep = std::size_t{1} << 30;
  std::size_t in_fed = 0, out_given = 0;
  Bytef spare = 0;
  bool into_spare = false;
  int rc = Z_OK;
  for (;;) {
    if (z.avail_in == 0 && in_fed < in_size) {
      z.next_in = const_cast<Bytef*>(in + in_fed);
      z.avail_in = static_cast<uInt>(std::min(kStep, in_size - in_fed));
      in_fed += z.avail_in;
    }
    if (z.avail_out == 0) {
      if (into_spare) break;  // the spare byte was written: too much data
      if (out_given < out_size) {
        z.next_out = out + out_given;
        z.avail_out = static_cast<uInt>(std::min(kStep, out_size - out_given));
        out_given += z.avail_out;
      } else {
        z.next_out = &spare;
        z.avail_out = 1;
        into_spare = true;
      }
    }
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) break;
    if (rc == Z_OK) continue;
    // Z_BUF_ERROR: no progress possible, i.e. the input ran out before the stream's end.
    break;
  }
  const bool overflow = into_spare && z.avail_out == 0;
  const std::size_t produced = into_spare ? out_size : out_given - z.avail_out;
  const std::string msg = z.msg ? z.msg : "";
  inflateEnd(&z);
  if (overflow) {
    return "the stream holds more than the " + std::to_string(out_size) + " bytes declared";
  }
  if (rc == Z_STREAM_END) {
    if (produced == out_size) return "";
    return "the stream ends after " + std::to_string(produced) + " of the " +
           std::to_string(out_size) + " bytes declared";
  }
  if (rc == Z_DATA_ERROR) return "damaged DEFLATE data (" + msg + ")";
  if (rc == Z_MEM_ERROR) return "zlib ran out of memory";
  return "the stream is cut short (" + std::to_string(produced) + " of the " +
         std::to_string(out_size) + " bytes declared)";
}

}  // namespace sapiens_seg::core
