// The model API: load() once, then segment() as often as you like, from any thread.
//
//   auto model = sapiens_seg::load("sapiens-seg-0.3b-goliath", {.accept_noncommercial = true});
//   sapiens_seg::Result r = model.segment(sapiens_seg::Input::file("photo.jpg"));
//   // r.labels: r.height x r.width class indices, row-major; r.classes[r.labels[i]] is the name.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sapiens_seg/error.hpp"
#include "sapiens_seg/export.hpp"
#include "sapiens_seg/options.hpp"

namespace sapiens_seg {

// A borrowed 8-bit RGB image, rows `stride` bytes apart (0 = packed, width * 3).
struct ImageView {
  const std::uint8_t* data = nullptr;
  int height = 0;
  int width = 0;
  std::size_t stride = 0;
};

// One image to segment. Files and encoded bytes are decoded like cv2.imread in the authors' demo:
// EXIF orientation applied (JPEG, PNG eXIf, WebP; TIFF by libtiff), grey replicated to RGB, alpha
// dropped (not composited), 16-bit scaled to 8-bit (value / 256). Both sides must be at least 32
// pixels.
class SAPIENS_SEG_API Input {
 public:
  static Input file(std::string path);
  static Input encoded(std::vector<std::uint8_t> bytes);
  static Input rgb(ImageView view);       // borrowed: must outlive the segment() call
  static Input rgb_copy(ImageView view);  // copied: the caller's buffer may go away

  enum class Kind { kFile, kEncoded, kRgb };
  Kind kind() const noexcept { return kind_; }
  const std::string& path() const noexcept { return path_; }
  const std::vector<std::uint8_t>& bytes() const noexcept;  // encoded bytes (kEncoded)
  const ImageView& view() const noexcept { return view_; }

 private:
  Kind kind_ = Kind::kRgb;
  std::string path_;
  // Encoded bytes, or the pixels of rgb_copy(); shared so that copies of an Input stay cheap and
  // view_ stays valid.
  std::shared_ptr<const std::vector<std::uint8_t>> bytes_;
  ImageView view_;
};

struct Backend {
  std::string mode;    // "portable", "kernels" or "original"
  std::string device;  // "cpu", "cuda:0", ...
  std::string dtype;   // "float32", "float16", "bfloat16"
};

// Where one image's time went, in milliseconds. The same meaning for every caller (C++, the
// CLI's summary.json, Python, the server), because all of them run Model::prepare then
// Model::run:
//   decode       reading and decoding the file or bytes (0 for pixels given as RGB)
//   preprocess   the resize to the network input and the normalisation (on the host pipeline;
//                on the device pipeline the upload, and the resize runs inside `network`)
//   network      the whole network call of the batch the image ran in (shared by the batch)
//   postprocess  this image's upsample + argmax, and its logits when asked for
//   total        decode + preprocess + network + postprocess
// Time spent waiting between prepare() and run() (a queue, a server's batching delay) is in none
// of them.
struct Timings {
  double decode = 0, preprocess = 0, network = 0, postprocess = 0, total = 0;
};

struct SAPIENS_SEG_API Result {
  int height = 0, width = 0;         // the input image's size (after EXIF rotation)
  std::vector<std::uint8_t> labels;  // height * width class indices, row-major
  std::vector<float> logits;         // [classes, height, width] when SegmentOptions::logits
  std::vector<float> raw_logits;     // [classes, raw_height, raw_width] when asked for
  int raw_height = 0, raw_width = 0;
  std::vector<std::string> classes;                  // class names; index 0 is the background
  std::vector<std::array<std::uint8_t, 3>> palette;  // RGB per class
  Backend backend;
  Timings timings;
  // What the image decoder warned about for a file or encoded bytes that were still decoded (as
  // cv2.imread decodes them), e.g. "libjpeg: Corrupt JPEG data: bad Huffman code"; also logged.
  std::vector<std::string> warnings;

  // 1 where the label is not background (what the authors' demo saves as <name>.npy).
  std::vector<std::uint8_t> foreground() const;
};

struct ModelInfo {
  std::string id;       // card id, or the file name for a bare path
  std::string family;   // "sapiens-v1" or "sapiens2"
  std::string path;     // the checkpoint that was loaded
  std::string sha256;   // verified hash ("" when the file was not verified)
  std::string license;  // SPDX-like id from the card ("" for a bare path)
  int input_height = 0, input_width = 0, num_classes = 0;
  int embed_dim = 0, depth = 0, heads = 0;
  Backend backend;
  std::vector<std::string> classes;                  // class names; index 0 is the background
  std::vector<std::array<std::uint8_t, 3>> palette;  // RGB per class (the authors' colours)
};

// One image decoded, resized and normalised for one model: the first half of Model::segment(),
// made by Model::prepare() on the calling thread and consumed by Model::run(). A program that
// decodes on many threads and batches on one (the CLI, a server) prepares each image where it
// arrives and runs batches of them. Copying is cheap (shared). Holding one holds its decoded
// pixels and, until a run() uses it, the network input (3 x input size float32, about 9 MB at
// 1024x768): a successful run() releases the input (the pixels stay, for overlays), so a
// Prepared runs once; prepare the image again to run it again. A run() that fails leaves it.
class SAPIENS_SEG_API Prepared {
 public:
  Prepared() = default;  // empty: run() refuses it
  bool empty() const noexcept { return impl_ == nullptr; }
  int height() const noexcept;  // the input image's size (after EXIF rotation)
  int width() const noexcept;
  // The decoded pixels (a file or bytes), or the caller's pixels for Input::rgb (borrowed: they
  // must outlive this object) and Input::rgb_copy (owned).
  ImageView image() const noexcept;
  // The decoder's warnings (see Result::warnings).
  const std::vector<std::string>& warnings() const noexcept;
  // decode and preprocess so far (see Timings).
  const Timings& timings() const noexcept;

  struct Impl;
  explicit Prepared(std::shared_ptr<const Impl> impl);
  const Impl& impl() const;

 private:
  std::shared_ptr<const Impl> impl_;
};

// Immutable after load(); copying is cheap (shared). Every call may be made concurrently from
// several threads on the same Model: no per-call state lives in it. A default-constructed Model
// is empty (a placeholder to assign a loaded one to); its calls throw Error(kInvalidInput).
class SAPIENS_SEG_API Model {
 public:
  Model() = default;
  bool empty() const noexcept { return impl_ == nullptr; }

  // prepare() each input, then run() them as one network batch. Images of different sizes may
  // be mixed.
  Result segment(const Input& input, const SegmentOptions& options = {}) const;
  std::vector<Result> segment(std::span<const Input> batch,
                              const SegmentOptions& options = {}) const;

  // The two halves of segment(): decode, resize and normalise one image (on the calling thread,
  // no network), then run prepared images of this model as one network batch and finish each
  // (upsample + argmax). run() gives the same results whatever the batch is made of.
  // Error(kInvalidInput) for an empty Prepared, one prepared by another model, or one that ran
  // already.
  Prepared prepare(const Input& input) const;
  std::vector<Result> run(std::span<const Prepared> batch,
                          const SegmentOptions& options = {}) const;

  const ModelInfo& info() const;

  struct Impl;
  explicit Model(std::shared_ptr<const Impl> impl);

 private:
  const Impl& checked() const;
  std::shared_ptr<const Impl> impl_;
};

// `id_or_path` is a card id ("sapiens-seg-0.3b-goliath", optionally "@revision"), or a path to a
// checkpoint file. Throws sapiens_seg::Error.
SAPIENS_SEG_API Model load(const std::string& id_or_path, const LoadOptions& options = {});

// An owned 8-bit RGB image.
struct Image {
  int height = 0, width = 0;
  std::vector<std::uint8_t> rgb;      // height * width * 3, row-major
  std::vector<std::string> warnings;  // the decoder's, as in Result::warnings (read_image)
  ImageView view() const { return {rgb.data(), height, width, 0}; }
};

// What an encoded image's header says, read without decoding a pixel: a server refuses an image
// over its pixel budget with this before any memory is spent on it.
struct ImageInfo {
  std::string format;         // "JPEG", "PNG", "WebP", "TIFF", "BMP", "PNM"
  int height = 0, width = 0;  // as decoded: after the EXIF orientation
};
// Error(kInvalidInput) for a format the library does not decode or a malformed header;
// Error(kNotFound / kIo) for a file that cannot be read.
SAPIENS_SEG_API ImageInfo read_image_info(const std::uint8_t* data, std::size_t size);
SAPIENS_SEG_API ImageInfo read_image_info(const std::string& path);

// Decodes a file or encoded bytes by the rules of Input (EXIF, grey, alpha, 16-bit, size
// limits); the decoder's warnings go to Image::warnings and the log. Throws Error(kNotFound /
// kIo / kInvalidInput / kOutOfMemory); a path that is a directory, FIFO, socket or device is
// kInvalidInput, refused without opening it.
SAPIENS_SEG_API Image read_image(const std::string& path);
SAPIENS_SEG_API Image read_image(const std::vector<std::uint8_t>& encoded);

// cv2.resize(image, (width, height), interpolation=...) of the opencv-python wheel, byte for
// byte, computed by the library's own arithmetic (no OpenCV call: the bytes do not depend on the
// OpenCV installed). This is the resize segment() applies before the network. Throws
// Error(kInvalidInput) for an empty size, Error(kBackendUnavailable) for a device that cannot
// run.
SAPIENS_SEG_API Image resize(ImageView image, int height, int width,
                             const ResizeOptions& options = {});

// The authors' visualisation: palette colours blended over the image at `opacity`
// (out = image * (1 - opacity) + colour * opacity, truncated to 8 bits). `image` must have the
// result's size.
SAPIENS_SEG_API Image overlay(const Result& result, ImageView image, float opacity = 0.5f);

// Whether this process is a child forked (fork(), multiprocessing's "fork") after the library was
// loaded. Such a child runs the library on one CPU thread: GNU OpenMP's worker threads, which
// LibTorch's CPU operators use, exist in the parent only, and a parallel region in the child
// would wait for them for ever. To use every core in workers, spawn them instead of forking.
SAPIENS_SEG_API bool forked_child() noexcept;

// Library version ("0.1.0").
SAPIENS_SEG_API const char* version() noexcept;

}  // namespace sapiens_seg
