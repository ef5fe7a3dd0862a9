// segment()'s arithmetic around the network, with no image codec: an RGB image becomes the
// network's input (prepare), a batch of inputs becomes logits and each image's labels (run). The
// public Model (api/) is these two steps plus decoding; the benchmark's IO-less build uses them as
// they are, so what it measures is what the library runs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <ATen/Tensor.h>

#include "../backends/backends.hpp"
#include "../resize/resize.hpp"

namespace sapiens_seg::core {

// How one model turns an image into its network input: the authors' demo recipe of its family
// and card.
struct InputRecipe {
  int input_height = 0, input_width = 0;
  std::array<float, 3> mean{}, std{};
  bool area_or_cubic = false;  // Sapiens2's demo resize (INTER_AREA or INTER_CUBIC), else linear
  CubicFlavor cubic = CubicFlavor::kWheel;
  // The device pipeline (options.hpp Pipeline): the uint8 image goes to the network's device
  // and is resized and normalised there, and only labels come back.
  bool on_device = false;
};

// One image, ready for run(). On the host pipeline `input` is the resized, normalised float32
// [3, H, W] on the CPU; on the device pipeline it is the uint8 [h, w, 3] image (in pinned memory
// when the device is a GPU), uploaded and resized by run().
struct PreparedInput {
  at::Tensor input;
  int height = 0, width = 0;  // the image's size: what the labels come back at
};

// The pixels must stay valid for the call only (they are copied or resized away).
PreparedInput prepare(const PixelsU8& rgb, const InputRecipe& recipe, const c10::Device& device);

struct ImageOutput {
  std::vector<std::uint8_t> labels;  // height x width
  std::vector<float> logits;         // [K, height, width] when asked for
  std::vector<float> raw_logits;     // [K, raw_height, raw_width] when asked for
  int raw_height = 0, raw_width = 0;
  double preprocess_ms = 0;   // the device pipeline's upload and resize, queued here
  double postprocess_ms = 0;  // this image's upsample + argmax (and logits)
};

struct BatchOutput {
  std::vector<ImageOutput> images;
  double network_ms = 0;  // the batch's network call, for every image of it
};

// The batch through the network and each image back to labels at its own size. Safe to call
// concurrently: on a GPU each call queues its work on a stream of its own. LibTorch's exceptions
// pass through (the API turns them into its Error).
BatchOutput run(const Runner& runner, const InputRecipe& recipe,
                std::span<const PreparedInput* const> batch, bool logits, bool raw_logits);

}  // namespace sapiens_seg::core
