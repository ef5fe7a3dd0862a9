// What an encoded image is and how large it is, read from its header before any pixel is
// decoded, so that a small file describing a huge image (a decompression bomb) costs nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sapiens_seg::io {

// The formats the library decodes: those whose dimensions a well-kept library reads from the
// header. OpenCV decodes more (JPEG 2000, OpenEXR, Radiance HDR, PFM, Sun raster, PAM, ASCII
// PNM); those are refused, as their memory could not be bounded before decoding.
enum class ImageFormat { kJpeg, kPng, kWebp, kTiff, kBmp, kPnm };

struct ImageHeader {
  ImageFormat format = ImageFormat::kJpeg;
  std::int64_t width = 0, height = 0;  // as stored, before any EXIF rotation
};

// "JPEG", "PNG", ...
const char* format_name(ImageFormat format) noexcept;

// Recognises the format by its signature and reads width and height from the header: libjpeg
// (JPEG), libpng (PNG), libwebp (WebP), libtiff (TIFF, first page) and stb_image (BMP, binary
// PGM/PPM). Throws Error(kInvalidInput) for another format or a header its library rejects; a
// header that says "too large" without dimensions is reported as above the size limit.
ImageHeader read_image_header(const std::uint8_t* data, std::size_t size, const std::string& what);

// JPEG: runs libjpeg over all of the entropy-coded data (at 1/8 scale, luma only, pixels
// discarded) and throws Error(kInvalidInput) when the data ends before the end-of-image marker
// (a truncated file, which libjpeg would otherwise fill with grey and only warn about), when
// an entropy-coded segment stops before its last block (missing data, also grey), or when it
// is too corrupt to decode. Bytes after the end-of-image marker (the video of a phone's "motion
// photo") are never read, so such files pass.
void check_jpeg_complete(const std::uint8_t* data, std::size_t size, const std::string& what);

}  // namespace sapiens_seg::io
