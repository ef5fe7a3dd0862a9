// The weight store internals: lookup, stamps, verification, licence gates and downloads.
#pragma once

#include <optional>
#include <string>

#include "../core/checkpoint/mapped_file.hpp"
#include "../core/families.hpp"
#include "sapiens_seg/cards.hpp"
#include "sapiens_seg/weights.hpp"

namespace sapiens_seg::io {

struct GateOptions {
  bool accept_noncommercial = false;  // or SAPIENS_SEG_NONCOMMERCIAL=1
  bool allow_unverified = false;      // or SAPIENS_SEG_ALLOW_UNVERIFIED=1
};

// Throws Error(kLicenseNotAccepted) for non-commercial weights without acceptance.
void check_license(const Card& card, const GateOptions& gate);

// Logs the card's licence notice (use restrictions) once per machine and cache folder: a marker
// under <cache>/notices/ records that it was shown. Returns whether it was shown now.
bool show_license_notice(const Card& card);

struct Located {
  std::string path;
  std::string location;  // "weights_path", "cache" or "hf_cache"
  // What is at `path` when it is not a regular file ("a directory", "a character device",
  // ...; links followed), "" for a file: such an entry is reported as what it is, never taken
  // for a missing file.
  std::string not_a_file;
};
// Looks for the card's file without hashing or network: the first candidate where something
// exists.
std::optional<Located> find_weights(const Card& card);

// Where a download puts the card's file: <cache>/weights/<file>.
std::string weights_target(const Card& card);
// $HF_ENDPOINT/<repo>/resolve/<revision>/<path_in_repo>, else the card's url ("" when neither).
std::string download_url(const Card& card);
bool offline();  // SAPIENS_SEG_OFFLINE=1 or HF_HUB_OFFLINE=1

// Checks `path` against the card: the stamp when it matches the file's size, mtime and inode,
// else a fresh hash (always with `rehash`), which then gets a stamp. A mismatch throws
// Error(kChecksumMismatch) with both hashes; a card without a pinned hash needs
// allow_unverified and logs the computed hash. Returns the hash.
std::string verify_weights(const Card& card, const std::string& path, const GateOptions& gate,
                           bool rehash = false);

// Forgets the verification stamp of `path`.
void remove_stamp(const std::string& path);
// The stamp's hash when it still fits the file (size, inode, mtime), else nullopt. No hashing.
std::optional<std::string> read_stamp(const std::string& path);

// The card whose `file` is the file name of `path`, if any.
std::optional<Card> card_for_file_name(const std::string& path);

// What a checkpoint given by a path whose name matches no card is, by content.
struct Identified {
  std::optional<Card> card;  // the card whose file it is: same size and SHA-256
  bool by_content = false;
  std::string sha256;  // "" when it was not hashed
};
// A file is hashed (once: the stamp makes later calls free while its size, mtime and inode stay)
// when its size equals that of a card with a pinned hash, or always with `always_hash`
// (safetensors, which carry no checksum of their own). A hashed file that is no card's file gets
// a stamp recording its SHA-256 (logged the first time): when it is hashed again after a change
// (size, mtime or inode) and its content differs, Error(kChecksumMismatch) says so, with both
// hashes and how to accept the new content (sapiens_seg::verify_file, `models verify PATH`).
Identified identify_by_content(const std::string& path, bool always_hash);

// find_weights, else (unless offline) a download into the cache. A download hashes what it
// transfers and stamps it, so `sha256` is set then; a file found in place is not hashed here.
struct Obtained {
  std::string path;
  std::optional<std::string> sha256;
};
Obtained obtain_file(const Card& card, const GateOptions& gate, const FetchOptions& fetch);

// obtain_file, then verify_weights unless the download hashed it already.
struct Verified {
  std::string path, sha256;
};
Verified obtain_weights(const Card& card, const GateOptions& gate, const FetchOptions& fetch);

// Everything a load needs of the weight store, in one call, each step once: the name resolved (a
// card id, or a path that a card claims by its file name), the card's licence checked before
// anything is downloaded or hashed, the file found or downloaded, read ONCE into private memory,
// and those bytes verified (the stamp when it fits the file that was read, else their hash; a
// file no card names is recognised by its content, whose card's licence is then checked). The
// family is the card's, or for a file of no card what its bytes are. The licence notice of the
// card is shown (once per machine). Throws the store's errors (kNotFound, kOffline,
// kDownloadFailed, kLicenseNotAccepted, kChecksumMismatch, kIo, kInvalidInput for a path that is
// no regular file, kOutOfMemory).
struct OpenedCheckpoint {
  std::optional<Card> card;  // named, claimed by the file's name, or recognised by content
  std::string path;          // the file that was read
  std::string sha256;        // of the bytes read; "" when nothing asked for a hash (a bare
                             // TorchScript archive the size of no card's file)
  const core::FamilyTraits* family = nullptr;  // never null once opened
  // What the card says that the family's network is held to (nullopt: no card claims the file).
  std::optional<core::CardFacts> card_facts;
  core::MappedFile bytes;  // the whole file: what the network is built from
};
OpenedCheckpoint open_checkpoint(const std::string& id_or_path, const GateOptions& gate,
                                 const FetchOptions& fetch);

}  // namespace sapiens_seg::io
