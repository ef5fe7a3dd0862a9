// Where the library looks for cards and weights, from the environment as it is now
// (core/settings.hpp; each variable is in docs/configuration.md).
#pragma once

#include <string>
#include <vector>

namespace sapiens_seg::io {

// SAPIENS_SEG_CARDS entries (':'-separated), then the bundled folder
// <prefix>/share/sapiens_seg/cards next to the library (build tree and install tree alike).
std::vector<std::string> card_dirs();
// $SAPIENS_SEG_HOME, else $XDG_CACHE_HOME/sapiens-seg, else ~/.cache/sapiens-seg.
std::string cache_dir();
// Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub.
std::string hf_hub_cache_dir();

}  // namespace sapiens_seg::io
