// Reading the tensors of a TorchScript archive (the authors' *_torchscript.pt2 files) without
// LibTorch's TorchScript loader: the zip file is read into private memory (map_file), its layout
// decoded by torchscript_format.hpp (nothing is executed, no code is compiled), every tensor record
// checked against its CRC-32, and each tensor becomes a zero-copy view of its stored `data/<key>`
// record (or of an owned, inflated copy when the record is deflated). Opening a 1.3 GB checkpoint
// costs one read and one CRC pass over its bytes instead of a copy plus a TorchScript compilation.
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

#include "mapped_file.hpp"
#include "tensor_map.hpp"
#include "torchscript_format.hpp"

namespace sapiens_seg::core {

at::ScalarType to_scalar_type(ArchiveDtype dtype) noexcept;

struct ArchiveOptions {
  // Check every tensor record against its CRC-32 (in parallel on LibTorch's intra-op threads).
  // Off only to measure what the check costs (benchmarks); records read as bytes (data.pkl,
  // code) are always checked.
  bool verify_crc = true;
};

class TorchScriptArchive {
 public:
  // Reads `path` (map_file) and decodes its directory and data.pkl. Throws Error(kNotFound) when
  // it does not exist, Error(kInvalidInput) when it is not a regular file, Error(kIo) when it
  // cannot be read or changes while it is read, Error(kFormatError) naming the
  // file (and the record or tensor) for anything malformed, and Error(kChecksumMismatch) naming
  // the record when one fails its CRC-32.
  static TorchScriptArchive open(const std::string& path, const ArchiveOptions& options = {});
  // The same over a file already read (map_file); `source` names it in messages.
  static TorchScriptArchive from_mapped(MappedFile file, std::string source,
                                        const ArchiveOptions& options = {});
  // The same over bytes in memory (tests); `source` names them in messages.
  static TorchScriptArchive from_buffer(std::shared_ptr<const std::vector<std::uint8_t>> bytes,
                                        std::string source = "<buffer>",
                                        const ArchiveOptions& options = {});

  const std::string& source() const { return source_; }
  const std::string& root() const { return layout_.root; }  // the archive's top folder
  const std::vector<ArchiveRecord>& records() const { return layout_.records; }
  const ArchiveRecord* find_record(const std::string& name) const { return layout_.find(name); }
  // A record's bytes (inflated when stored compressed), CRC-checked. Throws Error(kFormatError)
  // when absent.
  std::string read_record(const std::string& name) const;

  const std::vector<ArchiveTensor>& tensors() const { return layout_.tensors; }
  // A CPU tensor over the record's bytes. Zero-copy when the data is aligned for its element type;
  // the view keeps the bytes alive and is READ-ONLY (the memory is PROT_READ): convert or clone
  // it before writing to it.
  at::Tensor tensor(const ArchiveTensor& t) const;
  TensorMap all() const;

  // The attention head count written into the serialized code of the module `module_path` (the
  // reshape of the fused qkv output to [B, N, 3, heads, head_dim]); nullopt when the code does not
  // show it.
  std::optional<int> attention_heads(const std::string& module_path) const;

 private:
  TorchScriptArchive() = default;
  void load_storages(const ArchiveOptions& options);

  std::string source_;
  std::shared_ptr<const void> owner_;  // the bytes read or the buffer; shared with every view
  const std::uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  ArchiveLayout layout_;
  // Deflated storage records, inflated once (uint8 tensors that the views keep alive).
  std::map<std::string, at::Tensor> inflated_;
};

}  // namespace sapiens_seg::core
