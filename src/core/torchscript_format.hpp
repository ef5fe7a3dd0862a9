// The layout of a TorchScript archive (the authors' *_torchscript.pt2 files), decoded without
// LibTorch: the zip directory, the records (stored or deflated, each checked against the CRC-32
// its directory entry carries) and `data.pkl`, read by a small unpickler that understands only
// what torch writes there (module objects, dicts, tuples, strings, numbers, persistent storage
// ids and _rebuild_tensor_v2). Nothing is executed. Kept free of LibTorch so that this parser of
// files from the internet can be fuzzed alone (tests/fuzz/fuzz_torchscript.cpp);
// torchscript_archive.hpp turns its tensor descriptions into at::Tensor views.
//
// Why not LibTorch's own unpickler (torch::jit::Unpickler, behind torch::jit::load and
// torch::pickle_load): for a TorchScript module it resolves every class of data.pkl against the
// module's compiled code and calls the classes' __setstate__ methods, i.e. it needs the code/
// records compiled first (seconds for a large file) and runs code from the file;
// torch::pickle_load takes only the torch.save container and refuses module objects. Its errors
// are c10::Errors we could catch, but it was not written against hostile input and the project
// cannot fuzz it at the depth it fuzzes this reader. This reader accepts less (the subset torch
// writes for modules of tensors) and refuses the rest with a message naming the byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sapiens_seg::core {

// The element types a storage of data.pkl can have (torch.FloatStorage, ...).
enum class ArchiveDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };
std::size_t element_size(ArchiveDtype dtype) noexcept;
const char* to_string(ArchiveDtype dtype) noexcept;  // torch's names: "Float", "Half", ...

// One entry of the archive's zip directory.
struct ArchiveRecord {
  std::string name;          // without the archive's top folder, e.g. "data/12"
  std::uint16_t method = 0;  // 0 stored, 8 deflated
  std::uint16_t flags = 0;   // the general-purpose bits
  std::uint64_t offset = 0;  // where the (possibly compressed) bytes start in the file
  std::uint64_t size = 0;    // stored size
  std::uint64_t uncompressed = 0;
  std::uint32_t crc32 = 0;  // of the uncompressed bytes, from the central directory
  // torch.save with torch.serialization.set_crc32_options(False) writes 0 with a data descriptor
  // (flag bit 3): the CRC was not computed, so there is nothing to check.
  bool has_crc() const { return !(crc32 == 0 && (flags & 8) != 0); }
};

// A tensor attribute of a module in data.pkl.
struct ArchiveTensor {
  std::string name;  // dotted module path, e.g. "backbone.layers.0.attn.qkv.weight"
  ArchiveDtype dtype = ArchiveDtype::kF32;
  std::vector<std::int64_t> sizes, strides;
  std::int64_t storage_offset = 0;  // in elements
  std::string storage_key;          // the record is data/<storage_key>
  std::int64_t storage_numel = 0;   // as declared by the persistent id
};

struct ArchiveLayout {
  std::string root;  // the archive's top folder
  std::vector<ArchiveRecord> records;
  std::map<std::string, std::size_t> by_name;  // record name -> index
  std::vector<ArchiveTensor> tensors;
  std::map<std::string, std::string> module_classes;  // module path -> "qualified.Class"
  const ArchiveRecord* find(const std::string& name) const;
};

// Decodes the zip directory of [data, data + size) and its data.pkl (reading data.pkl and
// byteorder, CRC-checked), and checks that every tensor lies inside its storage record. Tensor
// records are not read here: see read_record and check_record_crc. Throws Error(kFormatError)
// naming `source` (and the record or tensor) for anything malformed, Error(kChecksumMismatch) for
// a record that fails its CRC-32.
ArchiveLayout parse_torchscript_archive(const std::uint8_t* data, std::size_t size,
                                        const std::string& source);

// The uncompressed bytes of `record` (inflated when deflated), checked against its CRC-32:
// Error(kChecksumMismatch) when they differ, Error(kFormatError) when it cannot be inflated.
// `out` must hold record.uncompressed bytes.
void read_record(const std::uint8_t* data, const ArchiveRecord& record, std::uint8_t* out,
                 const std::string& source);
std::string read_record(const std::uint8_t* data, const ArchiveRecord& record,
                        const std::string& source);
// Throws Error(kChecksumMismatch) naming the record and both values when `computed` (the CRC-32
// of the record's uncompressed bytes) is not what its directory entry says.
void check_record_crc(const ArchiveRecord& record, std::uint32_t computed,
                      const std::string& source);

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
