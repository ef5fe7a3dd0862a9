// The two zip primitives the checkpoint readers need, over well-kept libraries: the CRC-32 that
// zip records carry (ISA-L's carry-less-multiply code when the build found it, else zlib's, with
// the same results) and raw-DEFLATE decompression (zlib). LibTorch-free, so the archive parser
// built on it can be fuzzed alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sapiens_seg::core {

// The zip/gzip CRC-32 (reflected 0xEDB88320) of `size` bytes, continuing from `crc` (0 to
// start), as zlib's crc32().
std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc = 0) noexcept;
// The CRC-32 of A followed by B, from crc32(A), crc32(B) and B's length.
std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b,
                            std::uint64_t size_b) noexcept;
// "ISA-L <version>" or "zlib <version>": what computes crc32() in this build.
std::string crc32_implementation();

// Inflates the raw DEFLATE stream [in, in + in_size) into exactly `out_size` bytes at `out`.
// Returns "" on success, else why not (a damaged stream, a stream that ends early, or one that
// holds more than `out_size` bytes).
std::string inflate_raw(const std::uint8_t* in, std::size_t in_size, std::uint8_t* out,
                        std::size_t out_size);

}  // namespace sapiens_seg::core
