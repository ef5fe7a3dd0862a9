// libFuzzer target for the TorchScript archive reader (torchscript_format.hpp): the zip directory,
// the records (stored or deflated, CRC-checked) and the unpickler of data.pkl, as
// TorchScriptArchive runs them on a checkpoint from the internet. Any input either parses into a
// layout whose tensors all lie inside their storage records, or throws sapiens_seg::Error with
// kFormatError, kChecksumMismatch (or kIo, for an allocation the machine cannot make); anything
// else (a crash, another exception, a sanitizer
// report, a leak) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/checkpoint/torchscript_format.hpp"
#include "sapiens_seg/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sapiens_seg;
  try {
    const core::ArchiveLayout a = core::parse_torchscript_archive(data, size, "fuzz");
    if (a.by_name.size() != a.records.size()) std::abort();
    for (const auto& r : a.records) {
      if (r.offset > size || r.size > size - r.offset) std::abort();
      if (r.method == 0 && r.size != r.uncompressed) std::abort();
    }
    for (const auto& t : a.tensors) {
      const core::ArchiveRecord* r = a.find("data/" + t.storage_key);
      if (r == nullptr) std::abort();
      const std::size_t es = core::element_size(t.dtype);
      if (t.storage_numel < 0 ||
          static_cast<std::uint64_t>(t.storage_numel) * es > r->uncompressed) {
        std::abort();
      }
      if (t.sizes.size() != t.strides.size() || t.storage_offset > t.storage_numel) std::abort();
      // Read the storage as TorchScriptArchive does (inflating it when deflated), within a
      // budget so that a record declaring much data cannot stall the fuzzer.
      if (r->uncompressed <= (1u << 20)) {
        std::vector<std::uint8_t> bytes(r->uncompressed);
        core::read_record(data, *r, bytes.data(), "fuzz");
      }
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kFormatError && e.code() != ErrorCode::kChecksumMismatch &&
        e.code() != ErrorCode::kIo) {
      std::abort();
    }
  }
  return 0;
}
