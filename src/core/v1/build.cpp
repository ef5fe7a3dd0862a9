// Sapiens v1: the TorchScript archive's tensors (and, for the original mode, its graph) on a
// Runner.
#include "../pipeline/build.hpp"
#include "../checkpoint/torchscript.hpp"
#include "sapiens_seg/error.hpp"
#include "vit_seg.hpp"

namespace sapiens_seg::core::v1 {
namespace {

std::string grid_text(std::int64_t h, std::int64_t w) {
  return std::to_string(h) + "x" + std::to_string(w);
}

// The card's input size fixes the position embedding's grid: a checkpoint trained at another size
// is not the card's.
void check_card_grid(const TorchScriptCheckpoint& ckpt, const std::string& path,
                     const CardFacts& card, std::int64_t grid_h, std::int64_t grid_w) {
  const auto it = ckpt.tensors.find("backbone.pos_embed");
  if (it == ckpt.tensors.end() || it->second.dim() != 3 || it->second.size(1) == grid_h * grid_w) {
    return;
  }
  throw Error(ErrorCode::kFormatError,
              path + ": the card '" + card.id + "' (" + card.source + ") gives the input size " +
                  grid_text(card.input_height, card.input_width) + ", a " +
                  grid_text(grid_h, grid_w) + " grid of " + std::to_string(grid_h * grid_w) +
                  " patches, but the checkpoint's position embedding has " +
                  std::to_string(it->second.size(1)) +
                  " tokens: the card does not describe this checkpoint (correct its input size, "
                  "or rename the file so that no card claims it)");
}

ConfigHints hints_for(const TorchScriptCheckpoint& ckpt, const std::string& path,
                      const BuildRequest& request) {
  ConfigHints hints;
  if (const auto& card = request.card) {
    if (card->heads > 0) hints.heads = card->heads;
    hints.grid_h = card->input_height / card->patch;
    hints.grid_w = card->input_width / card->patch;
    check_card_grid(ckpt, path, *card, *hints.grid_h, *hints.grid_w);
  }
  if (ckpt.heads_from_graph) {
    if (hints.heads && *hints.heads != *ckpt.heads_from_graph) {
      throw Error(ErrorCode::kFormatError, path + ": the card says " +
                                               std::to_string(*hints.heads) +
                                               " attention heads but the traced graph uses " +
                                               std::to_string(*ckpt.heads_from_graph));
    }
    hints.heads = *ckpt.heads_from_graph;
  }
  if (request.input_height > 0) hints.input_h = request.input_height;
  if (request.input_width > 0) hints.input_w = request.input_width;
  return hints;
}

}  // namespace

Built build(const MappedFile& file, const std::string& path, const BuildRequest& request) {
  // Only the original mode runs the TorchScript module; the others read the tensors alone.
  const TorchScriptCheckpoint ckpt =
      open_torchscript(file, path, /*load_module=*/request.mode == Mode::kOriginal);
  Config cfg;
  try {
    cfg = infer_config(ckpt.tensors, hints_for(ckpt, path, request));
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
  const c10::Device device = request.device;
  const at::ScalarType dtype = request.dtype;
  Built out;
  out.runner = pick_runner(
      request.mode, device, [&] { return make_portable_v1(ckpt, cfg, device, dtype); },
      [&] {
        if (request.input_height > 0 || request.input_width > 0) {
          throw Error(ErrorCode::kBackendUnavailable,
                      "the original mode runs the traced graph at its own input size only");
        }
        return make_original_v1(ckpt, cfg, device, dtype);
      },
      [&] { return make_kernels_v1(ckpt, cfg, device, dtype); });
  out.num_classes = cfg.num_classes;
  out.embed_dim = cfg.embed_dim;
  out.depth = cfg.depth;
  out.heads = cfg.heads;
  out.input_height = cfg.input_h;
  out.input_width = cfg.input_w;
  return out;
}

}  // namespace sapiens_seg::core::v1
