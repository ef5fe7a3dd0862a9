// sapiens_seg::resize: the public face of core/resize (the authors' cv2.resize bytes).
#include <ATen/ATen.h>

#include "../core/backends/backends.hpp"
#include "../core/resize/resize.hpp"
#include "../io/image.hpp"
#include "fork.hpp"
#include "sapiens_seg/model.hpp"

namespace sapiens_seg {

namespace {
core::Interp to_core(Interpolation i) {
  switch (i) {
    case Interpolation::kArea:
      return core::Interp::kArea;
    case Interpolation::kCubic:
      return core::Interp::kCubic;
    case Interpolation::kLinear:
      break;
  }
  return core::Interp::kLinear;
}

Image resize_unguarded(ImageView image, int height, int width, const ResizeOptions& options) {
  const cv::Mat src = io::wrap_view(image, "resize input", /*min_side=*/1);
  if (height < 1 || width < 1 || static_cast<std::int64_t>(height) * width > io::kMaxPixels) {
    throw Error(ErrorCode::kInvalidInput, "resize: the output size " + std::to_string(width) + "x" +
                                              std::to_string(height) +
                                              " must be at least 1x1 and at most 268 megapixels");
  }
  const core::Interp interp = to_core(options.interpolation);
  const core::CubicFlavor flavor = options.cubic == CubicResize::kOpenCV
                                       ? core::CubicFlavor::kOpenCV
                                       : core::CubicFlavor::kWheel;
  Image out;
  out.height = height;
  out.width = width;
  out.rgb.resize(static_cast<std::size_t>(height) * width * 3);
  if (options.device.empty()) {
    core::resize_u8({src.data, src.rows, src.cols, 3, src.step},
                    {out.rgb.data(), height, width, 3, 0}, interp, flavor);
    return out;
  }
  const c10::Device device = core::resolve_device(options.device);
  const at::Tensor host =
      at::from_blob(const_cast<std::uint8_t*>(src.data), {src.rows, src.cols, 3},
                    {static_cast<int64_t>(src.step), 3, 1}, at::kByte);
  const at::Tensor got = core::resize_tensor(host.to(device), height, width, interp, flavor);
  at::from_blob(out.rgb.data(), {height, width, 3}, at::kByte).copy_(got);
  return out;
}

}  // namespace

Image resize(ImageView image, int height, int width, const ResizeOptions& options) {
  api::settle_after_fork();
  // LibTorch (the device path, its allocator) throws its own types; callers get the library's.
  try {
    return resize_unguarded(image, height, width, options);
  } catch (...) {
    throw as_error(std::current_exception(), "resize");
  }
}

}  // namespace sapiens_seg
