// libFuzzer target for the safetensors header parser: any input either parses into a header whose
// tensors all lie, without overlap, inside the data section, or throws
// sapiens_seg::Error(kFormatError); anything else (a crash, another exception, a sanitizer report)
// is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/checkpoint/safetensors_header.hpp"
#include "sapiens_seg/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using sapiens_seg::core::element_size;
  try {
    const auto h = sapiens_seg::core::parse_safetensors_header(data, size, "fuzz");
    if (h.data_offset + h.data_size != size) std::abort();
    if (h.by_name.size() != h.tensors.size()) std::abort();
    std::uint64_t prev_end = 0;
    for (const auto& t : h.tensors) {
      if (t.begin > t.end || t.end > h.data_size) std::abort();
      if (t.end - t.begin != static_cast<std::uint64_t>(t.numel) * element_size(t.dtype)) {
        std::abort();
      }
      if (t.begin == t.end) continue;
      if (t.begin < prev_end) std::abort();
      prev_end = t.end;
    }
  } catch (const sapiens_seg::Error& e) {
    if (e.code() != sapiens_seg::ErrorCode::kFormatError) std::abort();
  }
  return 0;
}
