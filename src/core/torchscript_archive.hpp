// Reading the tensors of a TorchScript archive (the authors' *_torchscript.pt2 files) without
// LibTorch's TorchScript loader: the zip file is memory-mapped, `data.pkl` is decoded by a small
// unpickler that understands only what torch writes there (module objects, dicts, tuples, strings,
// numbers, persistent storage ids and _rebuild_tensor_v2), and each tensor becomes a zero-copy
// view of its stored `data/<key>` record. Nothing is executed and no code is compiled, so opening
// a 1.3 GB checkpoint costs page-table work instead of a copy plus a TorchScript compilation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

#include "checkpoint.hpp"

namespace sapiens_seg::core {

// One entry of the archive's zip directory.
struct ArchiveRecord {
  std::string name;          // without the archive's top folder, e.g. "data/12"
  std::uint16_t method = 0;  // 0 stored, 8 deflated
  std::uint64_t offset = 0;  // where the (possibly compressed) bytes start in the file
  std::uint64_t size = 0;    // stored size
  std::uint64_t uncompressed = 0;
};

// A tensor attribute of a module in data.pkl.
struct ArchiveTensor {
  std::string name;  // dotted module path, e.g. "backbone.layers.0.attn.qkv.weight"
  at::ScalarType dtype = at::kFloat;
  std::vector<std::int64_t> sizes, strides;
  std::int64_t storage_offset = 0;  // in elements
  std::string storage_key;          // the record is data/<storage_key>
  std::int64_t storage_numel = 0;   // as declared by the persistent id
};

class TorchScriptArchive {
 public:
  // Maps `path` read-only and decodes its directory and data.pkl. Throws Error(kNotFound) when it
  // does not exist, Error(kIo) when it cannot be read or mapped, and Error(kFormatError) naming the
  // file (and the record or tensor) for anything malformed.
  static TorchScriptArchive open(const std::string& path);
  // The same over bytes in memory (tests); `source` names them in messages.
  static TorchScriptArchive from_buffer(std::shared_ptr<const std::vector<std::uint8_t>> bytes,
                                        std::string source = "<buffer>");

  const std::string& source() const { return source_; }
  const std::string& root() const { return root_; }  // the archive's top folder
  const std::vector<ArchiveRecord>& records() const { return records_; }
  const ArchiveRecord* find_record(const std::string& name) const;
  // A record's bytes (inflated when stored compressed). Throws Error(kFormatError) when absent.
  std::string read_record(const std::string& name) const;

  const std::vector<ArchiveTensor>& tensors() const { return tensors_; }
  // A CPU tensor over the record's bytes. Zero-copy when the data is aligned for its element type;
  // the view keeps the mapping alive and is READ-ONLY (the mapping is PROT_READ): convert or clone
  // it before writing to it.
  at::Tensor tensor(const ArchiveTensor& t) const;
  TensorMap all() const;

  // The attention head count written into the serialized code of the module `module_path` (the
  // reshape of the fused qkv output to [B, N, 3, heads, head_dim]); nullopt when the code does not
  // show it.
  std::optional<int> attention_heads(const std::string& module_path) const;

 private:
  TorchScriptArchive() = default;
  void parse();

  std::string source_;
  std::shared_ptr<const void> owner_;  // the mapping or the buffer; shared with every view
  const std::uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  std::string root_;
  std::vector<ArchiveRecord> records_;
  std::map<std::string, std::size_t> by_name_;
  std::vector<ArchiveTensor> tensors_;
  std::map<std::string, std::string> module_classes_;  // module path -> "qualified.Class"
};

// Decodes a pickle as torch writes data.pkl and returns the tensor attributes of the module tree
// (and, for each module, its class). Exposed for the unit tests. Throws Error(kFormatError)
// naming `source` for anything it does not understand.
struct PickledModule {
  std::vector<ArchiveTensor> tensors;
  std::map<std::string, std::string> module_classes;
};
PickledModule unpickle_module_tree(const std::uint8_t* data, std::size_t size,
                                   const std::string& source);

}  // namespace sapiens_seg::core
