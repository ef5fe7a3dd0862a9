#include "image_header.hpp"

#include <algorithm>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

// The C libraries report fatal errors by longjmp; the functions that call them keep no C++
// object with a destructor alive across a setjmp.
#include <jerror.h>
#include <jpeglib.h>
#include <png.h>
#include <stb_image.h>
#include <tiffio.h>
#include <webp/decode.h>

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::io {
namespace {

bool starts_with(const std::uint8_t* d, std::size_t n, const char* magic, std::size_t len) {
  return n >= len && std::memcmp(d, magic, len) == 0;
}

[[noreturn]] void bad_header(const std::string& what, ImageFormat f, const std::string& why) {
  throw Error(ErrorCode::kInvalidInput,
              "cannot decode " + what + ": corrupt " + format_name(f) + " header (" + why + ")");
}

[[noreturn]] void too_large(const std::string& what, ImageFormat f) {
  throw Error(ErrorCode::kInvalidInput, "cannot decode " + what + ": its " + format_name(f) +
                                            " header describes an image too large to decode");
}

// ---- JPEG (libjpeg-turbo, the library OpenCV decodes JPEG with) ---------------------------

struct JpegErrors {
  jpeg_error_mgr mgr;  // first: libjpeg hands back a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  int fatal_code;
  bool premature_end;  // the data ended before the end-of-image marker
  bool data_stops;     // an entropy-coded segment ended before its last block (or resync)
  // The other warnings' texts, each once (a damaged file can repeat one per block); a fixed
  // array, as nothing with a destructor may live across the setjmp.
  static constexpr int kMaxKept = 8;
  char kept[kMaxKept][JMSG_LENGTH_MAX];
  int n_kept;
};

extern "C" void jpeg_fatal(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  e->fatal_code = cinfo->err->msg_code;
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings are collected, never printed. Those that mean missing image data (which libjpeg
// fills with grey) matter; harmless ones (extraneous bytes between segments) do not.
extern "C" void jpeg_warning(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  const int code = cinfo->err->msg_code;
  if (code == JWRN_JPEG_EOF) e->premature_end = true;
  if (code == JWRN_HIT_MARKER || code == JWRN_MUST_RESYNC) e->data_stops = true;
  ++cinfo->err->num_warnings;
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  for (int i = 0; i < e->n_kept; ++i)
    if (std::strcmp(e->kept[i], text) == 0) return;
  if (e->n_kept < JpegErrors::kMaxKept) std::memcpy(e->kept[e->n_kept++], text, sizeof text);
}

struct JpegRun {
  jpeg_decompress_struct cinfo;
  JpegErrors err;
  JDIMENSION width, height;
  std::uint64_t blocks;      // 8x8 blocks of all components, each coded with >= 1 bit
  std::uint64_t coef_bytes;  // libjpeg's whole-image coefficient buffers, when it needs them
  bool arithmetic, multiscan;
};

// Reads the header, and with `all_data` decodes everything up to the end-of-image marker.
// Returns false after a fatal libjpeg error (its text in r->err.message).
bool run_libjpeg(JpegRun* r, const std::uint8_t* data, std::size_t size, bool all_data) {
  std::memset(r, 0, sizeof *r);
  r->cinfo.err = jpeg_std_error(&r->err.mgr);
  r->err.mgr.error_exit = jpeg_fatal;
  r->err.mgr.emit_message = jpeg_warning;
  if (setjmp(r->err.jump)) {
    jpeg_destroy_decompress(&r->cinfo);
    return false;
  }
  jpeg_create_decompress(&r->cinfo);
  jpeg_mem_src(&r->cinfo, data, static_cast<unsigned long>(size));
  if (jpeg_read_header(&r->cinfo, TRUE) != JPEG_HEADER_OK) {
    std::snprintf(r->err.message, sizeof r->err.message, "no image in the data");
    jpeg_destroy_decompress(&r->cinfo);
    return false;
  }
  r->width = r->cinfo.image_width;
  r->height = r->cinfo.image_height;
  // jpeg_read_header has laid out the components (it stops at the first scan's header).
  r->arithmetic = r->cinfo.arith_code != 0;
  r->multiscan = jpeg_has_multiple_scans(&r->cinfo) != 0;
  for (int c = 0; c < r->cinfo.num_components; ++c) {
    const jpeg_component_info& ci = r->cinfo.comp_info[c];
    const std::uint64_t w = ci.width_in_blocks, h = ci.height_in_blocks;
    r->blocks += w * h;
    const auto up = [](std::uint64_t n, int m) { return (n + m - 1) / m * m; };
    r->coef_bytes += up(w, ci.h_samp_factor) * up(h, ci.v_samp_factor) * sizeof(JBLOCK);
  }
  if (all_data) {
    // The cheapest decode that still reads every entropy-coded segment: DC-only IDCT, no
    // chroma IDCT or upsampling.
    r->cinfo.scale_num = 1;
    r->cinfo.scale_denom = 8;
    r->cinfo.dct_method = JDCT_IFAST;
    r->cinfo.do_fancy_upsampling = FALSE;
    r->cinfo.do_block_smoothing = FALSE;
    if (r->cinfo.jpeg_color_space == JCS_YCbCr || r->cinfo.jpeg_color_space == JCS_GRAYSCALE) {
      r->cinfo.out_color_space = JCS_GRAYSCALE;
    }
    jpeg_start_decompress(&r->cinfo);
    const JDIMENSION stride = r->cinfo.output_width * r->cinfo.output_components;
    JSAMPARRAY row = (*r->cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&r->cinfo),
                                                   JPOOL_IMAGE, stride, 1);
    while (r->cinfo.output_scanline < r->cinfo.output_height)
      jpeg_read_scanlines(&r->cinfo, row, 1);
    jpeg_finish_decompress(&r->cinfo);
  }
  jpeg_destroy_decompress(&r->cinfo);
  return true;
}

// ---- PNG (libpng, the library OpenCV decodes PNG with) ------------------------------------

struct PngSource {
  const std::uint8_t* data;
  std::size_t size, pos;
  char message[256];
  char warning[2][256];  // the first two warnings (fixed arrays: see the note on setjmp)
  int n_warnings;
};

extern "C" void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
  auto* s = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > s->size - s->pos) png_error(png, "the file ends inside the header");
  std::memcpy(out, s->data + s->pos, n);
  s->pos += n;
}

extern "C" void png_fatal(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof s->message, "%s", message);
  png_longjmp(png, 1);
}

extern "C" void png_keep_warning(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngSource*>(png_get_error_ptr(png));
  if (s->n_warnings < 2) std::snprintf(s->warning[s->n_warnings++], 256, "%s", message);
}

bool run_libpng(PngSource* src, png_uint_32* width, png_uint_32* height) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, src, png_fatal, png_keep_warning);
  if (png == nullptr) {
    std::snprintf(src->message, sizeof src->message, "out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(src->message, sizeof src->message, "out of memory");
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  // The size limit is the caller's; libpng's default (a million pixels a side) would hide the
  // dimensions from its message.
  png_set_user_limits(png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
  png_set_read_fn(png, src, png_read_mem);
  png_read_info(png, info);
  *width = png_get_image_width(png, info);
  *height = png_get_image_height(png, info);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

// ---- TIFF (libtiff, the library OpenCV decodes TIFF with) ---------------------------------

struct TiffSource {
  const std::uint8_t* data;
  std::size_t size, pos;
  char message[256];
};

extern "C" tmsize_t tiff_read(thandle_t h, void* out, tmsize_t n) {
  auto* s = static_cast<TiffSource*>(h);
  if (n < 0) return 0;
  const std::size_t take = std::min(static_cast<std::size_t>(n), s->size - s->pos);
  std::memcpy(out, s->data + s->pos, take);
  s->pos += take;
  return static_cast<tmsize_t>(take);
}
extern "C" tmsize_t tiff_write(thandle_t, void*, tmsize_t) {
  return 0;
}
extern "C" toff_t tiff_seek(thandle_t h, toff_t off, int whence) {
  auto* s = static_cast<TiffSource*>(h);
  std::uint64_t base = whence == SEEK_CUR ? s->pos : whence == SEEK_END ? s->size : 0;
  if (off > std::numeric_limits<std::uint64_t>::max() - base || base + off > s->size) {
    return static_cast<toff_t>(-1);
  }
  s->pos = static_cast<std::size_t>(base + off);
  return s->pos;
}
extern "C" int tiff_close(thandle_t) {
  return 0;
}
extern "C" toff_t tiff_size(thandle_t h) {
  return static_cast<TiffSource*>(h)->size;
}
extern "C" int tiff_error(TIFF*, void* user, const char* module, const char* fmt, va_list ap) {
  auto* s = static_cast<TiffSource*>(user);
  if (s->message[0] == '\0') {
    char text[200];
    std::vsnprintf(text, sizeof text, fmt, ap);
    std::snprintf(s->message, sizeof s->message, "%s%s%s", module ? module : "", module ? ": " : "",
                  text);
  }
  return 1;  // handled: nothing on stderr
}
extern "C" int tiff_warning(TIFF*, void*, const char*, const char*, va_list) {
  return 1;
}

bool run_libtiff(TiffSource* src, std::uint32_t* width, std::uint32_t* height) {
  TIFFOpenOptions* opts = TIFFOpenOptionsAlloc();
  if (opts == nullptr) {
    std::snprintf(src->message, sizeof src->message, "out of memory");
    return false;
  }
  TIFFOpenOptionsSetErrorHandlerExtR(opts, tiff_error, src);
  TIFFOpenOptionsSetWarningHandlerExtR(opts, tiff_warning, src);
  // Reading the first directory needs little; a tag claiming gigabytes is corrupt.
  TIFFOpenOptionsSetMaxSingleMemAlloc(opts, 64 << 20);
  // "m": no memory mapping (there is no file); the first directory is read here.
  TIFF* tif = TIFFClientOpenExt("image", "rm", src, tiff_read, tiff_write, tiff_seek, tiff_close,
                                tiff_size, nullptr, nullptr, opts);
  TIFFOpenOptionsFree(opts);
  if (tif == nullptr) return false;
  const bool ok = TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, width) == 1 &&
                  TIFFGetField(tif, TIFFTAG_IMAGELENGTH, height) == 1;
  if (!ok) std::snprintf(src->message, sizeof src->message, "no image width or length");
  TIFFClose(tif);
  return ok;
}

// ---- sizes and EXIF ----------------------------------------------------------------------

std::uint32_t load(const std::uint8_t* p, int bytes, bool little) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    const int k = little ? bytes - 1 - i : i;
    v = (v << 8) | p[k];
  }
  return v;
}

// EXIF payloads are sometimes stored with the "Exif\0\0" prefix of JPEG's APP1 (WebP and PNG
// writers differ); both are accepted.
int orientation_of_payload(const std::uint8_t* p, std::size_t n) noexcept {
  if (n >= 6 && std::memcmp(p, "Exif\0\0", 6) == 0) return exif_orientation(p + 6, n - 6);
  return exif_orientation(p, n);
}

// The first APP1 "Exif" segment before the first scan.
int jpeg_orientation(const std::uint8_t* d, std::size_t n) noexcept {
  std::size_t pos = 2;
  while (pos + 4 <= n) {
    if (d[pos] != 0xFF) return 1;
    const std::uint8_t marker = d[pos + 1];
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (marker == 0xD8 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {
      pos += 2;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return 1;  // start of scan, end of image
    const std::size_t len = load(d + pos + 2, 2, false);
    if (len < 2 || len > n - pos - 2) return 1;
    if (marker == 0xE1 && len >= 8 && std::memcmp(d + pos + 4, "Exif\0\0", 6) == 0) {
      return exif_orientation(d + pos + 10, len - 8);
    }
    pos += 2 + len;
  }
  return 1;
}

// The eXIf chunk.
int png_orientation(const std::uint8_t* d, std::size_t n) noexcept {
  std::size_t pos = 8;
  while (pos + 12 <= n) {
    const std::size_t len = load(d + pos, 4, false);
    if (len > n - pos - 12) return 1;
    const std::uint8_t* type = d + pos + 4;
    if (std::memcmp(type, "eXIf", 4) == 0) return orientation_of_payload(d + pos + 8, len);
    if (std::memcmp(type, "IEND", 4) == 0) return 1;
    pos += 12 + len;
  }
  return 1;
}

// The RIFF "EXIF" chunk.
int webp_orientation(const std::uint8_t* d, std::size_t n) noexcept {
  std::size_t pos = 12;
  while (pos + 8 <= n) {
    const std::size_t len = load(d + pos + 4, 4, true);
    if (len > n - pos - 8) return 1;
    if (std::memcmp(d + pos, "EXIF", 4) == 0) return orientation_of_payload(d + pos + 8, len);
    pos += 8 + len + (len & 1);  // chunks are padded to an even size
  }
  return 1;
}

}  // namespace

const char* format_name(ImageFormat format) noexcept {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kTiff:
      return "TIFF";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kPnm:
      return "PGM/PPM";
  }
  return "image";
}

ImageHeader read_image_header(const std::uint8_t* d, std::size_t n, const std::string& what) {
  ImageHeader h;
  if (starts_with(d, n, "\xFF\xD8\xFF", 3)) {
    h.format = ImageFormat::kJpeg;
    JpegRun r;
    if (!run_libjpeg(&r, d, n, /*all_data=*/false)) bad_header(what, h.format, r.err.message);
    h.width = r.width;
    h.height = r.height;
    h.jpeg_blocks = r.blocks;
    h.jpeg_coef_bytes = r.coef_bytes;
    h.jpeg_arithmetic = r.arithmetic;
    h.jpeg_multiscan = r.multiscan;
    h.orientation = jpeg_orientation(d, n);
  } else if (starts_with(d, n, "\x89PNG\r\n\x1A\n", 8)) {
    h.format = ImageFormat::kPng;
    PngSource src{d, n, 0, {}, {}, 0};
    png_uint_32 w = 0, hh = 0;
    if (!run_libpng(&src, &w, &hh)) bad_header(what, h.format, src.message);
    h.width = w;
    h.height = hh;
    for (int i = 0; i < src.n_warnings; ++i)
      h.warnings.push_back(std::string("libpng: ") + src.warning[i]);
    h.orientation = png_orientation(d, n);
  } else if (n >= 12 && starts_with(d, n, "RIFF", 4) && std::memcmp(d + 8, "WEBP", 4) == 0) {
    h.format = ImageFormat::kWebp;
    int w = 0, hh = 0;
    if (!WebPGetInfo(d, n, &w, &hh)) bad_header(what, h.format, "libwebp cannot parse it");
    h.width = w;
    h.height = hh;
    h.orientation = webp_orientation(d, n);
  } else if (starts_with(d, n, "II*\0", 4) || starts_with(d, n, "MM\0*", 4) ||
             starts_with(d, n, "II+\0", 4) || starts_with(d, n, "MM\0+", 4)) {
    h.format = ImageFormat::kTiff;
    TiffSource src{d, n, 0, {}};
    std::uint32_t w = 0, hh = 0;
    if (!run_libtiff(&src, &w, &hh)) bad_header(what, h.format, src.message);
    h.width = w;
    h.height = hh;
  } else if (starts_with(d, n, "BM", 2) || starts_with(d, n, "P5", 2) ||
             starts_with(d, n, "P6", 2)) {
    h.format = d[0] == 'B' ? ImageFormat::kBmp : ImageFormat::kPnm;
    if (n > static_cast<std::size_t>(std::numeric_limits<int>::max())) too_large(what, h.format);
    int w = 0, hh = 0, comp = 0;
    if (!stbi_info_from_memory(d, static_cast<int>(n), &w, &hh, &comp)) {
      const char* why = stbi_failure_reason();
      if (why != nullptr && std::strcmp(why, "too large") == 0) too_large(what, h.format);
      bad_header(what, h.format, why ? why : "stb_image cannot parse it");
    }
    h.width = w;
    // A BMP stores top-down rows as a negative height; stb_image's header call reports it so.
    h.height = h.format == ImageFormat::kBmp ? std::abs(static_cast<std::int64_t>(hh)) : hh;
  } else {
    throw Error(ErrorCode::kInvalidInput,
                "cannot decode " + what +
                    ": not an image in a supported format (JPEG, PNG, WebP, TIFF, BMP, binary "
                    "PGM/PPM)");
  }
  if (h.width <= 0 || h.height <= 0) bad_header(what, h.format, "zero width or height");
  return h;
}

void check_jpeg_data_size(const ImageHeader& h, std::size_t size, const std::string& what) {
  if (h.format != ImageFormat::kJpeg) return;
  const std::string dims = std::to_string(h.width) + "x" + std::to_string(h.height);
  if (!h.jpeg_arithmetic && size < h.jpeg_blocks / 8) {
    throw Error(ErrorCode::kInvalidInput,
                "cannot decode " + what + ": truncated JPEG (its header describes " + dims + ", " +
                    std::to_string(h.jpeg_blocks) + " blocks of 8x8 pixels, which need at least " +
                    std::to_string(h.jpeg_blocks / 8) + " bytes of image data; the file has " +
                    std::to_string(size) + ")");
  }
  constexpr std::uint64_t kCoefFloor = std::uint64_t{256} << 20, kCoefPerByte = 1024;
  if (h.jpeg_arithmetic && h.jpeg_multiscan && h.jpeg_coef_bytes > kCoefFloor &&
      h.jpeg_coef_bytes / kCoefPerByte > size) {
    throw Error(ErrorCode::kInvalidInput,
                "cannot decode " + what + ": its arithmetic-coded JPEG header describes " + dims +
                    ", whose decoding buffers (" + std::to_string(h.jpeg_coef_bytes >> 20) +
                    " MiB) are out of all proportion to the file's " + std::to_string(size) +
                    " bytes");
  }
}

int exif_orientation(const std::uint8_t* p, std::size_t n) noexcept {
  if (n < 8) return 1;
  bool little;
  if (p[0] == 'I' && p[1] == 'I') {
    little = true;
  } else if (p[0] == 'M' && p[1] == 'M') {
    little = false;
  } else {
    return 1;
  }
  if (load(p + 2, 2, little) != 42) return 1;
  const std::size_t ifd = load(p + 4, 4, little);
  if (ifd > n - 2) return 1;
  const std::size_t entries = load(p + ifd, 2, little);
  for (std::size_t i = 0; i < entries; ++i) {
    const std::size_t e = ifd + 2 + 12 * i;
    if (e + 12 > n) break;  // (n - 12 would wrap for n < 12)
    if (load(p + e, 2, little) != 0x0112) continue;
    // A SHORT with one value, stored in the entry itself.
    if (load(p + e + 2, 2, little) != 3 || load(p + e + 4, 4, little) < 1) return 1;
    const std::uint32_t v = load(p + e + 8, 2, little);
    return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
  }
  return 1;
}

std::vector<std::string> check_jpeg_complete(const std::uint8_t* data, std::size_t size,
                                             const std::string& what) {
  JpegRun r;
  if (!run_libjpeg(&r, data, size, /*all_data=*/true)) {
    if (r.err.fatal_code == JERR_OUT_OF_MEMORY) {
      throw Error(ErrorCode::kOutOfMemory,
                  "out of memory decoding " + what + " (libjpeg: " + r.err.message + ")");
    }
    throw Error(ErrorCode::kInvalidInput,
                "cannot decode " + what + ": corrupt JPEG (" + r.err.message + ")");
  }
  if (r.err.premature_end) {
    throw Error(ErrorCode::kInvalidInput,
                "cannot decode " + what +
                    ": truncated JPEG (the data ends before the end-of-image marker)");
  }
  if (r.err.data_stops) {
    throw Error(ErrorCode::kInvalidInput,
                "cannot decode " + what +
                    ": corrupt JPEG (its image data stops early; the rest would be grey)");
  }
  std::vector<std::string> warnings;
  for (int i = 0; i < r.err.n_kept; ++i)
    warnings.push_back(std::string("libjpeg: ") + r.err.kept[i]);
  return warnings;
}

}  // namespace sapiens_seg::io
