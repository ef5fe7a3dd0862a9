// What an encoded image is and how large it is, read from its header before any pixel is
// decoded, so that a small file describing a huge image (a decompression bomb) costs nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sapiens_seg::io {

// The formats the library decodes: those whose dimensions a well-kept library reads from the
// header. OpenCV decodes more (JPEG 2000, OpenEXR, Radiance HDR, PFM, Sun raster, PAM, ASCII
// PNM); those are refused, as their memory could not be bounded before decoding.
enum class ImageFormat { kJpeg, kPng, kWebp, kTiff, kBmp, kPnm };

struct ImageHeader {
  ImageFormat format = ImageFormat::kJpeg;
  std::int64_t width = 0, height = 0;  // as stored, before any EXIF rotation
  // The EXIF Orientation tag (1 to 8; 1 when absent or unreadable) of a JPEG (APP1), PNG (eXIf)
  // or WebP (EXIF chunk): the formats whose EXIF orientation cv2.imread of opencv-python 5.0
  // applies. A TIFF's orientation is its decoder's business (libtiff), 1 here.
  int orientation = 1;
  // What the format's library warned about while reading the header (libpng's, such as a known
  // incorrect sRGB profile), "libpng: " and its text, as it would print them.
  std::vector<std::string> warnings;
  // JPEG: its 8x8 blocks (all components), the bytes of libjpeg's whole-image coefficient
  // buffers, whether it is arithmetic-coded and whether it has several scans (progressive, or
  // components in separate scans: the files that need those buffers).
  std::uint64_t jpeg_blocks = 0, jpeg_coef_bytes = 0;
  bool jpeg_arithmetic = false, jpeg_multiscan = false;
};

// "JPEG", "PNG", ...
const char* format_name(ImageFormat format) noexcept;

// Recognises the format by its signature and reads width and height from the header: libjpeg
// (JPEG), libpng (PNG), libwebp (WebP), libtiff (TIFF, first page) and stb_image (BMP, binary
// PGM/PPM). Throws Error(kInvalidInput) for another format or a header its library rejects; a
// header that says "too large" without dimensions is reported as above the size limit.

ImageHeader read_image_header(const std::uint8_t* data, std::size_t size, const std::string& what);

// JPEG, from its header alone (a no-op for other formats): a Huffman-coded JPEG codes every 8x8
// block of every component with at least one bit, so one whose file is smaller than that (a
// kilobyte describing 16000x16000) is refused as truncated (Error(kInvalidInput)). Else libjpeg
// would first allocate its whole-image coefficient buffers (128 bytes a block; 1.2 GB for that
// kilobyte when it is progressive) and only then find the data missing. An arithmetic-coded JPEG
// with several scans, which can legitimately be that small, is refused when those buffers would
// exceed both 256 MiB and 1024 times the file's size.
void check_jpeg_data_size(const ImageHeader& header, std::size_t size, const std::string& what);

// JPEG: runs libjpeg over all of the entropy-coded data (at 1/8 scale, luma only, pixels
// discarded) and throws Error(kInvalidInput) when the data ends before the end-of-image marker
// (a truncated file, which libjpeg would otherwise fill with grey and only warn about), when
// an entropy-coded segment stops before its last block (missing data, also grey), or when it
// is too corrupt to decode. Bytes after the end-of-image marker (the video of a phone's "motion
// photo") are never read, so such files pass. Returns libjpeg's other warnings ("libjpeg: " and
// its text, each once, such as "Corrupt JPEG data: bad Huffman code"): such a file is accepted,
// as cv2.imread accepts it, and the caller reports them.
std::vector<std::string> check_jpeg_complete(const std::uint8_t* data, std::size_t size,
                                             const std::string& what);

// The Orientation tag (1 to 8) of EXIF data in its TIFF layout ("II*\0" or "MM\0*", IFD0), or 1.
int exif_orientation(const std::uint8_t* tiff, std::size_t size) noexcept;

}  // namespace sapiens_seg::io
