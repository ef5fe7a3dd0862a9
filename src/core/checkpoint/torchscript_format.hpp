// The layout of a TorchScript archive (the authors' *_torchscript.pt2 files), decoded without
// LibTorch: the zip directory, the records (stored or deflated, each checked against the CRC-32
// its directory entry carries) and `data.pkl`, read by a small unpickler that understands only
// what torch writes there (module objects, dicts, tuples, strings, numbers, persistent storage
// ids and _rebuild_tensor_v2). Nothing is executed. Kept free of LibTorch so that this parser of
// files from the internet can be fuzzed alone (tests/fuzz/fuzz_torchscript.cpp);
// torchscript_archive.hpp turns its tensor descriptions into at::Tensor views.
//
// Why not LibTorch's own unpickler (torch::jit::Unpickler, behind torch::jit::load and
// torch::jit::unpickle / torch::pickle_load): it can decode data.pkl without running Python, but
// not a module tree on its own. Object entries (every __torch__.* module) need a type resolver
// that hands back the compiled ClassType (pickle.h: "if any IValues in the pickled data are
// Objects, then a class_resolver function must be provided"), which torch::jit::load gets by
// compiling the archive's code/ records, i.e. running the TorchScript compiler over text from
// the file, and classes with __setstate__ then run that method; torch::pickle_load has no
// resolver and is meant for torch.save containers. It is also not hardened against hostile
// input: fuzzing has found out-of-bounds reads and crashes in it (pytorch/pytorch issues 77573,
// 109791, PR 103667) and unbounded allocations from lengths in the stream (issue 185443, 2026).
// So this reader stays: it accepts only the subset torch writes for modules of tensors, never
// allocates more than the input's size for a value, and refuses everything else with a message
// naming the byte; tests/fuzz/fuzz_torchscript.cpp fuzzes it under ASan and UBSan.
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
