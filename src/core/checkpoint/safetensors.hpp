// Reading .safetensors checkpoints (the Sapiens2 releases): the file is read once into private
// memory (map_file: a model never depends on the file again, so rewriting it under a running model
// changes nothing) and its tensors are handed out as at::Tensor views over that memory, so a
// 20 GB checkpoint costs no second copy unless the weights move to another device or dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

#include "mapped_file.hpp"
#include "safetensors_header.hpp"
#include "tensor_map.hpp"

namespace sapiens_seg::core {

at::ScalarType to_scalar_type(SafetensorsDtype dtype) noexcept;

class SafetensorsFile {
 public:
  // Reads `path` (map_file) and checks its header. Throws Error(kNotFound) when it does not
  // exist, Error(kInvalidInput) when it is not a regular file, Error(kIo) when it cannot be read
  // or changes while it is read, and Error(kFormatError) naming the file (and the tensor) when
  // it is malformed.
  static SafetensorsFile open(const std::string& path);
  // The same over a file already read (map_file); `source` names it in messages.
  static SafetensorsFile from_mapped(MappedFile file, std::string source);
  // The same over bytes already in memory (tests, fuzzing, downloads); `source` names them in
  // messages. The tensors keep `bytes` alive.
  static SafetensorsFile from_buffer(std::shared_ptr<const std::vector<std::uint8_t>> bytes,
                                     std::string source = "<buffer>");

  const std::string& source() const { return source_; }
  const std::vector<SafetensorsTensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  bool contains(const std::string& name) const { return header_.by_name.count(name) != 0; }
  // Throws Error(kFormatError) naming the file when there is no tensor `name`.
  const SafetensorsTensorInfo& info(const std::string& name) const;

  // The tensor `name` on the CPU, contiguous. When its data is suitably aligned for the element
  // type it is a zero-copy view over the file's bytes that keeps those bytes alive; otherwise a
  // copy. Views are READ-ONLY: the memory is PROT_READ, so writing through one (in-place ops,
  // copy_ into it) crashes the process; the file itself is never written.
  // Clone or convert a tensor before modifying it. BOOL tensors are always copied, after checking
  // that every byte is 0 or 1.
  at::Tensor tensor(const std::string& name) const;
  // The tensor converted to the floating dtype `dtype` (float32, bfloat16 or float16). The stored
  // dtype must be F32, BF16 or F16 (else Error(kFormatError)); another requested dtype is
  // Error(kInvalidInput). When no conversion is needed the result may be a view as above.
  at::Tensor tensor_as(const std::string& name, at::ScalarType dtype) const;
  // Every tensor by name, as tensor() gives them.
  TensorMap all() const;

  // The file's bytes (as read, or the buffer): tensor views point inside [data(),
  // data()+size()).
  const std::uint8_t* data() const { return base_; }
  std::size_t size() const { return size_; }

 private:
  SafetensorsFile() = default;

  std::string source_;
  std::shared_ptr<const void> owner_;  // the bytes read or the buffer; shared with every view
  const std::uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  SafetensorsHeader header_;
};

}  // namespace sapiens_seg::core
