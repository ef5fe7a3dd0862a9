#include "torchscript.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/script.h>

#include "mapped_file.hpp"
#include "sapiens_seg/error.hpp"
#include "torchscript_archive.hpp"

namespace sapiens_seg::core {
namespace {

constexpr const char* kFirstAttention = "backbone.layers.0.attn";

// A TorchScript archive is a zip file. Looking at its first and last bytes lets us tell "not an
// archive at all" from "an archive cut short" (an interrupted copy), which LibTorch reports with
// the same generic message.
void check_zip_container(const MappedFile& file, const std::string& path) {
  const std::uint64_t size = file.size;
  if (size < 22 || std::memcmp(file.data, "PK\x03\x04", 4) != 0) {
    throw Error(ErrorCode::kFormatError,
                "not a TorchScript archive (no zip signature at the start): " + path +
                    ". Sapiens v1 *_torchscript.pt2 files are zip archives; was the right file "
                    "downloaded?");
  }
  // The end-of-central-directory record sits in the last 22 bytes plus an optional comment of
  // at most 64 KiB.
  const std::uint64_t tail = std::min<std::uint64_t>(size, 22 + 65535);
  const std::uint8_t* buf = file.data + (size - tail);
  bool found = false;
  for (std::size_t i = tail - 22 + 1; i-- > 0;) {
    if (std::memcmp(buf + i, "PK\x05\x06", 4) == 0) {
      found = true;
      break;
    }
  }
  if (!found) {
    throw Error(ErrorCode::kFormatError,
                "truncated checkpoint (the zip archive has no end-of-central-directory record; "
                "the file is " +
                    std::to_string(size) +
                    " bytes, probably an interrupted "
                    "download or copy): " +
                    path);
  }
}

// LibTorch's TorchScript loader reading the bytes already in memory, so the original mode does
// not open the file a second time (it could have changed since it was verified). Reads past the
// end return what is there, as a file would.
class MemoryAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit MemoryAdapter(MappedFile file) : file_(std::move(file)) {}
  size_t size() const override { return file_.size; }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= file_.size) return 0;
    n = static_cast<size_t>(std::min<uint64_t>(n, file_.size - pos));
    std::memcpy(buf, file_.data + pos, n);
    return n;
  }

 private:
  MappedFile file_;
};

std::optional<int> heads_from_attention_graph(const torch::jit::Module& attn) {
  auto method = attn.find_method("forward");
  if (!method) return std::nullopt;
  for (torch::jit::Node* node : method->graph()->nodes()) {
    const auto kind = node->kind();
    if (kind != c10::aten::reshape && kind != c10::aten::view) continue;
    torch::jit::Node* list = node->input(1)->node();
    if (list->kind() != c10::prim::ListConstruct || list->inputs().size() != 5) continue;
    auto three = torch::jit::toIValue(list->input(2));
    auto heads = torch::jit::toIValue(list->input(3));
    if (three && three->isInt() && three->toInt() == 3 && heads && heads->isInt()) {
      return static_cast<int>(heads->toInt());
    }
  }
  return std::nullopt;
}

}  // namespace

TorchScriptCheckpoint open_torchscript(const std::string& path, bool load_module) {
  return open_torchscript(map_file(path, "checkpoint"), path, load_module);
}

TorchScriptCheckpoint open_torchscript(const MappedFile& file, const std::string& path,
                                       bool load_module) {
  check_zip_container(file, path);
  TorchScriptCheckpoint ckpt;
  ckpt.path = path;
  const TorchScriptArchive archive = TorchScriptArchive::from_mapped(file, path);
  ckpt.tensors = archive.all();
  ckpt.heads_from_graph = archive.attention_heads(kFirstAttention);
  if (!load_module) return ckpt;

  try {
    ckpt.module = std::make_shared<torch::jit::Module>(
        torch::jit::load(std::make_shared<MemoryAdapter>(file), at::kCPU));
  } catch (const c10::Error& e) {
    std::string why = e.what_without_backtrace();
    why = why.substr(0, why.find('\n'));
    throw Error(ErrorCode::kFormatError, "cannot read TorchScript archive " + path + ": " + why);
  }
  ckpt.module->eval();
  // The compiled graph and the code text come from the same file; disagreeing would mean the
  // code reader misread it.
  for (const auto& m : ckpt.module->named_modules()) {
    if (m.name != kFirstAttention) continue;
    const auto from_graph = heads_from_attention_graph(m.value);
    if (from_graph && ckpt.heads_from_graph && *from_graph != *ckpt.heads_from_graph) {
      throw Error(ErrorCode::kFormatError, path + ": the traced graph uses " +
                                               std::to_string(*from_graph) +
                                               " attention heads but its code text reads as " +
                                               std::to_string(*ckpt.heads_from_graph));
    }
    if (from_graph) ckpt.heads_from_graph = from_graph;
    break;
  }
  return ckpt;
}

}  // namespace sapiens_seg::core
