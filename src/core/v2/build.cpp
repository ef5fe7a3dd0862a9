// Sapiens2: the safetensors weights (authors' or transformers naming) on a Runner. There is no
// original mode: the authors release weights, not a traced graph.
#include "../pipeline/build.hpp"
#include "../checkpoint/safetensors.hpp"
#include "sapiens2.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core::v2 {

Built build(const MappedFile& file, const std::string& path, const BuildRequest& request) {
  ConfigHints hints;
  if (request.card) {
    hints.input_h = request.card->input_height;
    hints.input_w = request.card->input_width;
  }
  if (request.input_height > 0) hints.input_h = request.input_height;
  if (request.input_width > 0) hints.input_w = request.input_width;
  TensorMap tensors;
  Config cfg;
  try {
    // The file's bytes stay while the network holds views of them (CPU float32 weights are used
    // in place; other devices and dtypes get one converted copy each).
    tensors = to_original_names(SafetensorsFile::from_mapped(file, path).all());
    cfg = infer_config(tensors, hints);
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
  if (request.card && request.card->heads > 0 && request.card->heads != cfg.heads) {
    throw Error(ErrorCode::kFormatError,
                path + ": the card says " + std::to_string(request.card->heads) +
                    " attention heads but the q/k-norm width gives " + std::to_string(cfg.heads));
  }
  const c10::Device device = request.device;
  const at::ScalarType dtype = request.dtype;
  Built out;
  out.runner = pick_runner(
      request.mode, device, [&] { return make_portable_v2(tensors, cfg, device, dtype); },
      []() -> std::unique_ptr<Runner> {
        throw Error(ErrorCode::kBackendUnavailable,
                    "the original mode does not exist for Sapiens2: the authors release weights "
                    "(safetensors), not a traced graph, so there is nothing to run as shipped. "
                    "Use the portable mode (the network re-implemented from the authors' "
                    "module definition and checked against it).");
      },
      [&] { return make_kernels_v2(tensors, cfg, device, dtype); });
  out.num_classes = cfg.num_classes;
  out.embed_dim = cfg.embed_dim;
  out.depth = cfg.depth;
  out.heads = cfg.heads;
  out.input_height = cfg.input_h;
  out.input_width = cfg.input_w;
  return out;
}

}  // namespace sapiens_seg::core::v2
