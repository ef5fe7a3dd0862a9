#include "pipeline.hpp"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>
#include <cstring>
#include <new>
#include <optional>
#include <string>

#include "../cpu/onednn_thread.hpp"
#include "../tensor_ops.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Interp interp_of(const InputRecipe& r, int width) {
  return r.area_or_cubic ? sapiens2_interp(width, r.input_width) : Interp::kLinear;
}

at::Tensor run_network(const Runner& runner, const at::Tensor& x, bool on_device) {
  const auto forward = [&] { return on_device ? runner.forward_device(x) : runner.forward(x); };
  // oneDNN (the CPU's convolutions) cannot build new primitives on a thread where it once ran
  // out of memory; such a call moves to a fresh thread. CUDA work stays on the caller's stream.
  return runner.device().is_cpu() ? run_clear_of_onednn_failures(forward) : forward();
}

// Logits of one image to the host as contiguous float32 [K, h, w], then the CPU upsample +
// argmax (and the full-size or raw logits when asked for).
void finish_on_host(ImageOutput& out, int height, int width, const at::Tensor& logits,
                    bool want_logits, bool want_raw) {
  const at::Tensor one = logits.to(at::kCPU, at::kFloat).contiguous();
  out.labels.resize(static_cast<std::size_t>(height) * width);
  if (want_logits) {
    const auto n = static_cast<std::size_t>(one.size(0)) * out.labels.size();
    try {
      out.logits.resize(n);
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::kOutOfMemory,
                  "out of memory for the full-size logits of a " + std::to_string(width) + "x" +
                      std::to_string(height) + " image (" + std::to_string(one.size(0)) +
                      " float32 channels, " + std::to_string(n * sizeof(float) >> 20) +
                      " MiB); labels alone need no logits");
    }
  }
  upsample_argmax(one, height, width, out.labels.data(), want_logits ? out.logits.data() : nullptr);
  if (want_raw) {
    out.raw_height = static_cast<int>(one.size(1));
    out.raw_width = static_cast<int>(one.size(2));
    out.raw_logits.assign(one.const_data_ptr<float>(), one.const_data_ptr<float>() + one.numel());
  }
}

// The labels the device pipeline computed where the network ran, to the host.
void labels_to_host(ImageOutput& out, int height, int width, const at::Tensor& logits) {
  const at::Tensor labels = upsample_argmax_labels(logits, height, width);
  out.labels.resize(static_cast<std::size_t>(height) * width);
  if (labels.device().is_cpu()) {
    at::from_blob(out.labels.data(), {height, width}, at::kByte).copy_(labels);
    return;
  }
  // Through pinned memory: a direct copy to pageable memory is staged by the driver in small
  // pieces.
  at::Tensor staged =
      at::empty({height, width}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  staged.copy_(labels);
  std::memcpy(out.labels.data(), staged.const_data_ptr<std::uint8_t>(), out.labels.size());
}

}  // namespace

PreparedInput prepare(const PixelsU8& rgb, const InputRecipe& recipe, const c10::Device& device) {
  PreparedInput p;
  p.height = rgb.height;
  p.width = rgb.width;
  if (!recipe.on_device) {
    std::vector<std::uint8_t> resized(static_cast<std::size_t>(recipe.input_height) *
                                      recipe.input_width * 3);
    const std::size_t row = static_cast<std::size_t>(recipe.input_width) * 3;
    resize_u8(rgb, {resized.data(), recipe.input_height, recipe.input_width, 3, row},
              interp_of(recipe, rgb.width), recipe.cubic);
    p.input = normalize_rgb(resized.data(), recipe.input_height, recipe.input_width, row,
                            recipe.mean, recipe.std);
    return p;
  }
  // For a GPU, pinned (page-locked) staging from LibTorch's caching host allocator, so run()'s
  // upload is asynchronous; the allocator keeps the block until the copy has finished.
  const bool gpu = !device.is_cpu();
  p.input = at::empty({rgb.height, rgb.width, 3},
                      at::TensorOptions().dtype(at::kByte).pinned_memory(gpu));
  auto* dst = p.input.data_ptr<std::uint8_t>();
  const auto row = static_cast<std::size_t>(rgb.width) * 3;
  const std::size_t src_stride = rgb.stride ? rgb.stride : row;
  for (int y = 0; y < rgb.height; ++y) std::memcpy(dst + y * row, rgb.data + y * src_stride, row);
  return p;
}

BatchOutput run(const Runner& runner, const InputRecipe& recipe,
                std::span<const PreparedInput* const> batch, bool logits, bool raw_logits) {
  BatchOutput out;
  out.images.resize(batch.size());
  if (batch.empty()) return out;
  const c10::Device device = runner.device();
  const bool on_device = recipe.on_device;
  // On a GPU each call queues its work on a stream of its own, so calls from several threads
  // overlap (one call's upload and resize with another's network).
  std::optional<c10::StreamGuard> stream;
  if (on_device && !device.is_cpu()) {
    stream.emplace(c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device));
  }
  std::vector<at::Tensor> inputs;
  inputs.reserve(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const PreparedInput& p = *batch[i];
    if (!on_device) {
      inputs.push_back(p.input);
      continue;
    }
    const auto t0 = Clock::now();
    const at::Tensor image = device.is_cpu() ? p.input : p.input.to(device, /*non_blocking=*/true);
    inputs.push_back(resize_normalize(image, recipe.input_height, recipe.input_width, recipe.mean,
                                      recipe.std, interp_of(recipe, p.width), recipe.cubic));
    // On a GPU this is the time to queue the work; the device time shows in `network`.
    out.images[i].preprocess_ms = ms_since(t0);
  }

  const auto t_net = Clock::now();
  const at::Tensor all = run_network(runner, at::stack(inputs), on_device);
  inputs.clear();
  if (stream) stream->current_stream().synchronize();
  out.network_ms = ms_since(t_net);

  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto t0 = Clock::now();
    const at::Tensor one = all[static_cast<std::int64_t>(i)];
    if (!on_device || logits || raw_logits) {
      finish_on_host(out.images[i], batch[i]->height, batch[i]->width, one, logits, raw_logits);
    } else {
      labels_to_host(out.images[i], batch[i]->height, batch[i]->width, one);
    }
    out.images[i].postprocess_ms = ms_since(t0);
  }
  return out;
}

}  // namespace sapiens_seg::core
