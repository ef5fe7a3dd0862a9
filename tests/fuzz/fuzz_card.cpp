// libFuzzer target for the model card parser: any input either parses or throws
// sapiens_seg::Error(kFormatError); anything else (a crash, another exception, a sanitizer
// report) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "io/cards_parse.hpp"
#include "sapiens_seg/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const sapiens_seg::Card c = sapiens_seg::io::parse_card(text, "fuzz");
    if (c.classes.size() != static_cast<std::size_t>(c.num_classes)) std::abort();
  } catch (const sapiens_seg::Error& e) {
    if (e.code() != sapiens_seg::ErrorCode::kFormatError) std::abort();
  }
  return 0;
}
