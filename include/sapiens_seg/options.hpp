// Plain option structs: default-constructed values are the sensible defaults, and new fields can
// be added without breaking callers that use designated initialisers.
#pragma once

#include <string>

#include "sapiens_seg/weights.hpp"

namespace sapiens_seg {

enum class Mode {
  kAuto,      // portable today: kernels only where a card records a measurement preferring them
  kPortable,  // the network re-implemented on LibTorch ops (CPU and CUDA)
  kKernels,   // the project's CUDA kernels (NVIDIA sm_80+ only)
  kOriginal,  // the checkpoint's own TorchScript graph, as shipped (Sapiens v1 only)
};

enum class DType {
  kDefault,  // fp32 on the CPU, fp16 on CUDA
  kFloat32,
  kFloat16,
  kBFloat16,
};

// Which per-channel mean/std the image is normalised with. kDemo reproduces the authors'
// Sapiens-Lite demo (the outputs users compare against); kTraining uses the values the
// checkpoints were trained with. The difference is below 0.25 on the 0-255 scale.
enum class Normalization { kDemo, kTraining };

// Where the work around the network runs. On the host: the decoded image is resized to the
// network input (the authors' cv2.resize, reproduced by the library's own arithmetic), the
// normalised float image is handed to the network, and its logits come back as float32 for the
// upsample + argmax (the authors' demo pipeline). On the device: the decoded image is uploaded
// as uint8 (through pinned staging on CUDA), resized and normalised where the network runs (the
// same arithmetic on tensor ops, so the same bytes), and only the uint8 label map comes back.
enum class Pipeline {
  kAuto,  // device for CUDA models, host for CPU ones
  kHost,
  kDevice,  // also valid on the CPU, where it runs the same tensor code as on CUDA
};

// Whose INTER_CUBIC bytes the Sapiens2 resize reproduces when it enlarges an image (INTER_LINEAR
// and INTER_AREA are the same in every OpenCV build; cubic is not).
enum class CubicResize {
  // The x86-64 opencv-python wheel (5.0.0.93) as the authors' users run it: its default cubic
  // is Intel IPP's, for this CPU's IPP code path.
  kWheel,
  // OpenCV's own cubic: what the wheel computes with cv2.setUseOptimized(False), and what
  // builds without IPP compute (Debian's OpenCV, for instance).
  kOpenCV,
};

struct LoadOptions {
  Mode mode = Mode::kAuto;
  std::string device;  // "" (auto: cuda if present, else cpu), "cpu", "cuda", "cuda:N"
  DType dtype = DType::kDefault;
  Normalization normalization = Normalization::kDemo;
  // Sapiens v1 weights are CC-BY-NC-4.0. They load only when this is true or the environment
  // sets SAPIENS_SEG_NONCOMMERCIAL=1.
  bool accept_noncommercial = false;
  // A card without a pinned SHA-256 loads only when this is true or SAPIENS_SEG_ALLOW_UNVERIFIED=1.
  bool allow_unverified = false;
  // Network input size override (0 = the card's, else inferred from the checkpoint). A size other
  // than the training size resizes the position embedding bicubically, as the eager model does.
  int input_height = 0;
  int input_width = 0;
  Pipeline pipeline = Pipeline::kAuto;
  CubicResize cubic = CubicResize::kWheel;
  // On CUDA, capture the network as a CUDA graph for each batch shape (up to this many per
  // model, most recent kept) and replay it: far fewer kernel launches. Each graph keeps its
  // activations' memory reserved. 0 runs every call eagerly.
  int cuda_graphs = 4;
  // Intra-op CPU threads; 0 (the default) leaves LibTorch's count alone (OMP_NUM_THREADS, else
  // one per core). Not a setting of this model: load() calls at::set_num_threads(threads), which
  // sets the calling thread's count at once and makes `threads` the default of every thread that
  // runs its first LibTorch CPU operation afterwards, in the whole process (your own LibTorch code
  // included); threads that already ran LibTorch CPU work keep theirs, and the last load() with
  // threads > 0 sets the default. It also resizes LibTorch's pthreadpool and clears its oneDNN
  // primitive cache. docs/configuration.md#threads
  int threads = 0;
  // Downloads of missing weights (see weights.hpp): progress callback and HF_TOKEN opt-in.
  FetchOptions fetch;
};

// cv2.resize's interpolations for 8-bit images, as the authors' demos call them.
enum class Interpolation {
  kLinear,  // INTER_LINEAR (Sapiens v1)
  kArea,    // INTER_AREA (Sapiens2, when the width shrinks)
  kCubic,   // INTER_CUBIC (Sapiens2, otherwise)
};

struct ResizeOptions {
  Interpolation interpolation = Interpolation::kLinear;
  CubicResize cubic = CubicResize::kWheel;
  // "" runs the host code; "cpu", "cuda" or "cuda:N" run the device pipeline's tensor code there
  // (the same bytes; the CPU one is how the device code is checked without a GPU).
  std::string device;
};

// What a front end does around the library, with one default for all of them (the CLI, Python,
// the Ray driver, the server's batches).
struct RunOptions {
  // Images per network call. Results do not depend on it; memory grows with it.
  int batch_size = 4;
};

struct SegmentOptions {
  // Also return logits at the input's size ([classes, H, W] fp32). They are large: 28 x 12 MP is
  // 1.3 GB, so they are produced only when asked for.
  bool logits = false;
  // Also return the network's own output ([classes, h, w] fp32, before any resize).
  bool raw_logits = false;
};

}  // namespace sapiens_seg
