// The model families the library runs, in one table: how cards and ModelInfo name them, the
// format of their checkpoints, the label set of a bare checkpoint and the authors' demo resize.
// A third family is a row here and a folder beside v1/ and v2/.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace sapiens_seg::core {

enum class Family { kSapiensV1, kSapiens2 };

// Per-channel RGB mean and standard deviation on the 0-255 scale.
struct MeanStd {
  std::array<float, 3> mean, std;
};

// What a model card says of the checkpoint it names; each family holds the file to it.
struct CardFacts {
  std::string id, source;  // the card's id and the card file it was read from (messages)
  int heads = 0;           // 0: the card does not say
  int input_height = 0, input_width = 0, patch = 16;
  int num_classes = 0;  // 0: the card does not say
};

struct FamilyTraits {
  Family family;
  std::string_view name;       // "sapiens-v1": Card::family, ModelInfo::family
  std::string_view format;     // Card::format of its checkpoints
  std::string_view label_set;  // the classes of a bare checkpoint (a card's label_set)
  std::string_view resize;     // the authors' demo resize when no card says (Card::resize)
  // The normalisation of a checkpoint no card describes (a card's own values come first): the
  // authors' demo's and the training values. Sapiens v1's demo (Sapiens-Lite) rounds the
  // training values; Sapiens2's demo uses the training (ImageNet) values.
  MeanStd demo, training;
};

inline constexpr MeanStd kImageNet{{123.675f, 116.28f, 103.53f}, {58.395f, 57.12f, 57.375f}};

inline constexpr std::array<FamilyTraits, 2> kFamilies{{
    {Family::kSapiensV1, "sapiens-v1", "torchscript", "goliath-28", "linear",
     MeanStd{{123.5f, 116.5f, 103.5f}, {58.5f, 57.0f, 57.5f}}, kImageNet},
    {Family::kSapiens2, "sapiens2", "safetensors", "dome-29", "area_or_cubic", kImageNet,
     kImageNet},
}};

inline const FamilyTraits& traits_of(Family f) {
  for (const auto& t : kFamilies) {
    if (t.family == f) return t;
  }
  return kFamilies[0];  // unreachable: every enumerator has a row
}

// The family a card names; nullptr for a name the library does not know.
inline const FamilyTraits* family_named(std::string_view name) {
  for (const auto& t : kFamilies) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace sapiens_seg::core
