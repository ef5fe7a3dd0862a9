#include "safetensors.hpp"

#include <bit>
#include <cstdint>
#include <cstring>
#include <utility>

#include <ATen/ATen.h>

#include "mapped_file.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core {
namespace {

// The format stores little-endian data; the views below reinterpret it in place.
static_assert(std::endian::native == std::endian::little,
              "safetensors views need a little-endian host");

}  // namespace

at::ScalarType to_scalar_type(SafetensorsDtype dtype) noexcept {
  switch (dtype) {
    case SafetensorsDtype::kF64:
      return at::kDouble;
    case SafetensorsDtype::kF32:
      return at::kFloat;
    case SafetensorsDtype::kF16:
      return at::kHalf;
    case SafetensorsDtype::kBF16:
      return at::kBFloat16;
    case SafetensorsDtype::kI64:
      return at::kLong;
    case SafetensorsDtype::kI32:
      return at::kInt;
    case SafetensorsDtype::kI16:
      return at::kShort;
    case SafetensorsDtype::kI8:
      return at::kChar;
    case SafetensorsDtype::kU8:
      return at::kByte;
    case SafetensorsDtype::kBool:
      return at::kBool;
  }
  return at::kByte;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  return from_mapped(map_file(path, "safetensors file"), path);
}

SafetensorsFile SafetensorsFile::from_mapped(MappedFile m, std::string source) {
  if (m.size < 8) {
    // Too short for the header length; the header parser gives the usual message and reads none
    // of these bytes.
    const std::uint8_t none[8] = {};
    parse_safetensors_header(none, m.size, source);
  }
  SafetensorsFile f;
  f.owner_ = std::move(m.owner);  // every view holds the bytes
  f.source_ = std::move(source);
  f.base_ = m.data;
  f.size_ = m.size;
  f.header_ = parse_safetensors_header(f.base_, f.size_, f.source_);
  return f;
}

SafetensorsFile SafetensorsFile::from_buffer(std::shared_ptr<const std::vector<std::uint8_t>> bytes,
                                             std::string source) {
  if (!bytes) throw Error(ErrorCode::kInvalidInput, "safetensors buffer " + source + " is null");
  SafetensorsFile f;
  f.source_ = std::move(source);
  f.base_ = bytes->data();
  f.size_ = bytes->size();
  f.owner_ = std::move(bytes);
  f.header_ = parse_safetensors_header(f.base_, f.size_, f.source_);
  return f;
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = header_.by_name.find(name);
  if (it == header_.by_name.end()) {
    throw Error(ErrorCode::kFormatError, source_ + ": no tensor '" + name + "' in the file");
  }
  return header_.tensors[it->second];
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsTensorInfo& ti = info(name);
  const auto options = at::TensorOptions().dtype(to_scalar_type(ti.dtype)).device(at::kCPU);
  // The header parser checked data_offset + end <= size_.
  const std::uint8_t* p = base_ + header_.data_offset + ti.begin;
  const std::size_t bytes = ti.end - ti.begin;
  if (ti.numel == 0) return at::empty(ti.shape, options);

  if (ti.dtype == SafetensorsDtype::kBool) {
    // A bool tensor holding another byte value is undefined behaviour in LibTorch kernels.
    for (std::size_t i = 0; i < bytes; ++i) {
      if (p[i] > 1) {
        throw Error(ErrorCode::kFormatError, source_ + ": malformed safetensors file: tensor '" +
                                                 name + "': BOOL byte " + std::to_string(p[i]) +
                                                 " at element " + std::to_string(i) +
                                                 " is neither 0 nor 1");
      }
    }
  } else if (reinterpret_cast<std::uintptr_t>(p) % element_size(ti.dtype) == 0) {
    // Zero-copy: the deleter's only job is to keep the bytes alive as long as the tensor.
    // from_blob wants a mutable pointer; see the header about writing through views.
    return at::from_blob(
        const_cast<std::uint8_t*>(p), ti.shape, [keep = owner_](void*) {}, options);
  }
  // Misaligned data (legal in the format, with an odd-sized header or tensor) or BOOL: a copy.
  at::Tensor t = at::empty(ti.shape, options);
  std::memcpy(t.data_ptr(), p, bytes);
  return t;
}

at::Tensor SafetensorsFile::tensor_as(const std::string& name, at::ScalarType dtype) const {
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
    throw Error(ErrorCode::kInvalidInput, std::string("cannot convert safetensors tensors to ") +
                                              c10::toString(dtype) +
                                              ": only float32, bfloat16 and float16");
  }
  const SafetensorsTensorInfo& ti = info(name);
  if (ti.dtype != SafetensorsDtype::kF32 && ti.dtype != SafetensorsDtype::kBF16 &&
      ti.dtype != SafetensorsDtype::kF16) {
    throw Error(ErrorCode::kFormatError, source_ + ": tensor '" + name + "' is stored as " +
                                             std::string(to_string(ti.dtype)) +
                                             ", not a floating dtype (F32, BF16 or F16)");
  }
  return tensor(name).to(dtype);
}

TensorMap SafetensorsFile::all() const {
  TensorMap out;
  for (const auto& t : header_.tensors) out.emplace(t.name, tensor(t.name));
  return out;
}

}  // namespace sapiens_seg::core
