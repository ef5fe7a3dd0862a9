// The weight store, as far as loading needs it: find a card's file on this machine, check its
// licence gate and its SHA-256.
#pragma once

#include <string>

#include "sapiens_seg/cards.hpp"

namespace sapiens_seg::io {

struct GateOptions {
  bool accept_noncommercial = false;  // or SAPIENS_SEG_NONCOMMERCIAL=1
  bool allow_unverified = false;      // or SAPIENS_SEG_ALLOW_UNVERIFIED=1
};

// Throws Error(kLicenseNotAccepted) for non-commercial weights without acceptance.
void check_license(const Card& card, const GateOptions& gate);

// Looks for the card's file: $SAPIENS_SEG_WEIGHTS_PATH/<file>, <cache>/weights/<file>, then the
// Hugging Face hub cache (models--ORG--NAME/snapshots/REV/FILE). Throws Error(kNotFound) naming
// the file, its size, SHA-256, URL and the folder to put it in.
std::string locate_weights(const Card& card);

// Hashes the file and compares with the card. A mismatch throws Error(kChecksumMismatch) with
// both hashes; a card without a pinned hash needs allow_unverified and logs the computed hash so
// the user can pin it. Returns the computed hash.
std::string verify_weights(const Card& card, const std::string& path, const GateOptions& gate);

// Where a hand-placed file for `card` is expected (for messages and `models path`).
std::string weights_target(const Card& card);

}  // namespace sapiens_seg::io
