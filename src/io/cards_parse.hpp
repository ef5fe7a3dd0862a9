// Parsing one model card from its JSON text (kept apart from the file so it can be fuzzed).
#pragma once

#include <string>

#include "sapiens_seg/cards.hpp"

namespace sapiens_seg::io {

// Throws Error(kFormatError) naming `source` and the offending field; never anything else.
Card parse_card(const std::string& text, const std::string& source);

}  // namespace sapiens_seg::io
