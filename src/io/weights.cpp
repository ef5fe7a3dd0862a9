#include "weights.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../core/settings.hpp"
#include "atomic_file.hpp"
#include "download.hpp"
#include "log.hpp"
#include "paths.hpp"
#include "sapiens_seg/error.hpp"
#include "sha256.hpp"

namespace sapiens_seg::io {
namespace fs = std::filesystem;

void check_license(const Card& card, const GateOptions& gate) {
  if (card.commercial_use) return;
  if (gate.accept_noncommercial || core::read_settings().accept_noncommercial) return;
  throw Error(ErrorCode::kLicenseNotAccepted,
              "model '" + card.id + "' is licensed " + card.license_id +
                  " (non-commercial use only" +
                  (card.license_url.empty() ? std::string() : ", " + card.license_url) +
                  "). Accept the licence with accept_noncommercial=True (Python: "
                  "segmentation.load(..., accept_noncommercial=True)), the CLI flag "
                  "--accept-noncommercial, LoadOptions::accept_noncommercial = true (C++), or "
                  "SAPIENS_SEG_NONCOMMERCIAL=1 in the environment.");
}

bool show_license_notice(const Card& card) {
  if (card.license_notice.empty()) return false;
  std::string name = card.license_id.empty() ? card.id : card.license_id;
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '.') ch = '_';
  }
  const fs::path marker = fs::path(cache_dir()) / "notices" / (name + ".shown");
  std::error_code ec;
  if (fs::exists(marker, ec)) return false;
  log(Level::kWarn, "licence notice for " + card.id + " (shown once): " + card.license_notice);
  // If the marker cannot be written (read-only home), the notice simply shows again next time.
  fs::create_directories(marker.parent_path(), ec);
  std::ofstream(marker) << card.license_id << "\n" << card.license_notice << "\n";
  return true;
}

std::string weights_target(const Card& card) {
  return (fs::path(cache_dir()) / "weights" / card.file).string();
}

bool offline() {
  const core::Settings s = core::read_settings();
  return s.offline || s.hf_hub_offline;
}

namespace {
std::string hub_endpoint() {
  std::string endpoint = core::read_settings().hf_endpoint;
  if (endpoint.empty()) endpoint = "https://huggingface.co";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return endpoint;
}
}  // namespace

std::string download_url(const Card& card) {
  if (!card.repo.empty() && !card.revision.empty()) {
    return hub_endpoint() + "/" + card.repo + "/resolve/" + card.revision + "/" + card.path_in_repo;
  }
  return card.url;
}

namespace {

std::vector<Located> candidates(const Card& card) {
  std::vector<Located> c;
  if (auto dir = core::read_settings().weights_path; !dir.empty()) {
    c.push_back({(dir / card.file).string(), "weights_path", ""});
  }
  c.push_back({weights_target(card), "cache", ""});
  if (!card.repo.empty() && !card.revision.empty()) {
    std::string repo_dir = "models--" + card.repo;
    for (auto pos = repo_dir.find('/'); pos != std::string::npos; pos = repo_dir.find('/')) {
      repo_dir.replace(pos, 1, "--");
    }
    c.push_back(
        {(fs::path(hf_hub_cache_dir()) / repo_dir / "snapshots" / card.revision / card.path_in_repo)
             .string(),
         "hf_cache", ""});
  }
  return c;
}

std::string placement_hint(const Card& card) {
  std::ostringstream os;
  os << "\n  file:   " << card.file;
  if (card.size) os << " (" << *card.size << " bytes)";
  os << "\n  sha256: " << (card.sha256 ? *card.sha256 : std::string("(no pinned hash)"));
  const std::string url = download_url(card);
  os << "\n  url:    " << (url.empty() ? std::string("(none)") : url);
  os << "\n  put it in " << (fs::path(cache_dir()) / "weights").string()
     << "/ or in a folder named by SAPIENS_SEG_WEIGHTS_PATH.\n  looked in:";
  for (const auto& p : candidates(card)) os << "\n    " << p.path;
  if (!card.repo.empty() && !card.revision.empty()) {
    os << "\n  or, with network access (SAPIENS_SEG_OFFLINE and HF_HUB_OFFLINE unset), fetch it "
          "with `sapiens-seg models download "
       << card.id << "` from HF_ENDPOINT (now " << hub_endpoint()
       << "; set HF_ENDPOINT to use a mirror of the Hugging Face Hub)";
  }
  return os.str();
}

// Stamps live in the project cache, keyed by the file's absolute path, so files in read-only
// folders (the Hugging Face cache, hand-placed folders) get one too.
fs::path stamp_path(const std::string& path) {
  std::error_code ec;
  const std::string abs = fs::absolute(path, ec).lexically_normal().string();
  Sha256 h;
  h.update(abs.data(), abs.size());
  return fs::path(cache_dir()) / "stamps" / (h.hex().substr(0, 32) + ".json");
}

struct FileId {
  std::uint64_t size = 0, inode = 0;
  std::int64_t mtime_ns = 0;
};

std::optional<FileId> file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{static_cast<std::uint64_t>(st.st_size), static_cast<std::uint64_t>(st.st_ino),
                static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec};
}

std::int64_t now_ns() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// A stamp: what the file at a path was when it was last hashed.
struct Stamp {
  FileId id;
  std::int64_t stamped_ns = 0;
  std::string sha256;
  std::string card;    // the card it was verified against, "" for a file of no card
  bool fresh = false;  // the file's size, inode and mtime are still those recorded
};

// The stamp of `path`, judged fresh against `id` (the file as it is, or as it was read).
std::optional<Stamp> load_stamp(const std::string& path, const std::optional<FileId>& id) {
  std::ifstream in(stamp_path(path));
  if (!id || !in) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(in);
    Stamp s;
    s.id = {j.at("size").get<std::uint64_t>(), j.at("inode").get<std::uint64_t>(),
            j.at("mtime_ns").get<std::int64_t>()};
    s.stamped_ns = j.at("stamped_ns").get<std::int64_t>();
    s.sha256 = j.at("sha256").get<std::string>();
    if (j.contains("card") && j.at("card").is_string()) s.card = j.at("card").get<std::string>();
    // Like git's racy-clean rule: a file modified less than two seconds before its stamp was
    // written may have changed again within the timestamp granularity, so it is hashed again.
    const bool racy = id->mtime_ns + 2'000'000'000LL > s.stamped_ns;
    s.fresh =
        !racy && s.id.size == id->size && s.id.inode == id->inode && s.id.mtime_ns == id->mtime_ns;
    return s;
  } catch (const nlohmann::json::exception&) {
    // A damaged stamp is only a lost shortcut: hash again.
  }
  return std::nullopt;
}

std::optional<Stamp> load_stamp(const std::string& path) {
  return load_stamp(path, file_id(path));
}

// Records that the file `id` (as it is, or as it was read) at `path` hashes to `sha`.
void write_stamp(const std::string& path, const std::optional<FileId>& id, const std::string& sha,
                 const std::string& card_id) {
  if (!id) return;
  const fs::path sp = stamp_path(path);
  std::error_code ec;
  fs::create_directories(sp.parent_path(), ec);
  const std::string text =
      nlohmann::json{{"path", fs::absolute(path, ec).string()},
                     {"size", id->size},
                     {"inode", id->inode},
                     {"mtime_ns", id->mtime_ns},
                     {"stamped_ns", now_ns()},
                     {"sha256", sha},
                     {"card", card_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(card_id)}}
          .dump(2);
  try {
    write_file_atomic(sp.string(), text.data(), text.size());
  } catch (const Error& e) {
    log(Level::kWarn, std::string("cannot save the verification stamp: ") + e.what());
  }
}

void write_stamp(const std::string& path, const std::string& sha, const std::string& card_id) {
  write_stamp(path, file_id(path), sha, card_id);
}

// The content being verified: the file at a path (hashed by reading it), or the bytes a load read
// (hashed in memory, so what is verified is exactly what the network is built from).
struct Content {
  std::string path;
  std::optional<FileId> id;  // nullopt: the file is gone
  std::uint64_t size = 0;
  std::function<std::string()> hash;

  static Content of_file(const std::string& path) {
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) throw Error(ErrorCode::kNotFound, "cannot read " + path + ": " + ec.message());
    return {path, file_id(path), size, [path] { return sha256_file(path); }};
  }
  static Content of_bytes(const std::string& path, const core::MappedFile& m) {
    return {path, FileId{m.size, m.inode, m.mtime_ns}, m.size, [&m] {
              Sha256 h;
              if (m.size > 0) h.update(m.data, m.size);
              return h.hex();
            }};
  }
};

// A progress bar on stderr, redrawn in place; used when the caller gave no callback.
class ProgressBar {
 public:
  bool operator()(const DownloadProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.total > 0 && p.done == p.total) {
      draw(p);
      std::fputc('\n', stderr);
      return true;
    }
    if (now - last_ < std::chrono::milliseconds(250)) return true;
    last_ = now;
    draw(p);
    return true;
  }

 private:
  static void draw(const DownloadProgress& p) {
    const double mb = 1e6;
    std::string name = p.file.size() > 36 ? p.file.substr(0, 33) + "..." : p.file;
    if (p.total > 0) {
      const double f = static_cast<double>(p.done) / static_cast<double>(p.total);
      const int filled = static_cast<int>(f * 24);
      const double eta =
          p.bytes_per_second > 0 ? static_cast<double>(p.total - p.done) / p.bytes_per_second : 0;
      std::fprintf(stderr, "\r%-36s [%s%s] %3d%% %8.1f/%.1f MB %6.1f MB/s ETA %d:%02d ",
                   name.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
                   std::string(static_cast<size_t>(24 - filled), '-').c_str(),
                   static_cast<int>(f * 100), static_cast<double>(p.done) / mb,
                   static_cast<double>(p.total) / mb, p.bytes_per_second / mb,
                   static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
    } else {
      std::fprintf(stderr, "\r%-36s %8.1f MB %6.1f MB/s ", name.c_str(),
                   static_cast<double>(p.done) / mb, p.bytes_per_second / mb);
    }
    std::fflush(stderr);
  }
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace

namespace {
// What a path that exists but is not a regular file is, in words (symbolic links followed).
std::string kind_of(const fs::file_status& st) {
  switch (st.type()) {
    case fs::file_type::regular:
      return "";
    case fs::file_type::directory:
      return "a directory";
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::fifo:
      return "a FIFO (named pipe)";
    case fs::file_type::socket:
      return "a socket";
    default:
      return "not a regular file";
  }
}
}  // namespace

std::optional<Located> find_weights(const Card& card) {
  for (auto c : candidates(card)) {
    std::error_code ec;
    const fs::file_status st = fs::status(c.path, ec);
    if (ec || !fs::exists(st)) continue;  // nothing there (a dangling link included)
    c.not_a_file = kind_of(st);
    return c;
  }
  return std::nullopt;
}

namespace {
[[noreturn]] void refuse_not_a_file(const Card& card, const Located& found) {
  throw Error(ErrorCode::kInvalidInput, "the weights of '" + card.id + "' should be a file, but " +
                                            found.path + " is " + found.not_a_file +
                                            "; remove or replace it with the checkpoint file (" +
                                            card.file + ")");
}
}  // namespace

namespace {
void check_verifiable(const Card& card, const GateOptions& gate) {
  if (!card.sha256 && !(gate.allow_unverified || core::read_settings().allow_unverified)) {
    throw Error(ErrorCode::kChecksumMismatch,
                "model '" + card.id +
                    "' has no pinned SHA-256 in its card, so its file cannot be "
                    "verified. Load it anyway with SAPIENS_SEG_ALLOW_UNVERIFIED=1 (or "
                    "LoadOptions::allow_unverified); its hash is printed so you can pin it.");
  }
}
}  // namespace

std::optional<std::string> read_stamp(const std::string& path) {
  auto s = load_stamp(path);
  if (s && s->fresh) return s->sha256;
  return std::nullopt;
}

void remove_stamp(const std::string& path) {
  std::error_code ec;
  fs::remove(stamp_path(path), ec);
}

namespace {
std::string verify_content(const Card& card, const Content& c, const GateOptions& gate,
                           bool rehash) {
  check_verifiable(card, gate);
  const std::string& path = c.path;
  if (card.size && c.size != *card.size) {
    throw Error(ErrorCode::kChecksumMismatch,
                path + " is " + std::to_string(c.size) + " bytes but '" + card.id + "' is " +
                    std::to_string(*card.size) + " bytes (incomplete or a different file)");
  }
  std::optional<std::string> actual;
  if (!rehash) {
    if (const auto s = load_stamp(path, c.id); s && s->fresh) actual = s->sha256;
  }
  if (!actual) {
    log(Level::kInfo, "verifying " + path + " (SHA-256)");
    actual = c.hash();
  }
  if (!card.sha256) {
    log(Level::kWarn, "unverified weights for '" + card.id + "': sha256 " + *actual + " (" + path +
                          "); add it to the card to pin this file");
    write_stamp(path, c.id, *actual, card.id);
    return *actual;
  }
  if (*actual != *card.sha256) {
    throw Error(ErrorCode::kChecksumMismatch,
                "checksum mismatch for " + path + " ('" + card.id + "')\n  expected sha256 " +
                    *card.sha256 + "\n  actual   sha256 " + *actual +
                    "\n  the file is corrupt or not the one the card describes; it was not used");
  }
  write_stamp(path, c.id, *actual, card.id);
  return *actual;
}
}  // namespace

std::string verify_weights(const Card& card, const std::string& path, const GateOptions& gate,
                           bool rehash) {
  return verify_content(card, Content::of_file(path), gate, rehash);
}

std::optional<Card> card_for_file_name(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  for (auto& c : list_cards()) {
    if (c.file == name) return c;
  }
  return std::nullopt;
}

namespace {

// The cards with a pinned hash whose file has `size` bytes: only such a file needs hashing to be
// recognised.
std::vector<Card> cards_of_size(std::uint64_t size) {
  std::vector<Card> out;
  for (auto& c : list_cards()) {
    if (c.size && *c.size == size && c.sha256) out.push_back(std::move(c));
  }
  return out;
}

std::string accept_hint(const std::string& path) {
  return "`sapiens-seg models verify " + path + "` (or `python -m sapiens_seg models verify " +
         path + "`), or delete " + stamp_path(path).string();
}

}  // namespace

namespace {
Identified identify_content(const Content& c, bool always_hash) {
  const std::string& path = c.path;
  const std::vector<Card> same_size = cards_of_size(c.size);
  Identified out;
  if (same_size.empty() && !always_hash) return out;  // nothing to match, no hash asked for

  const std::optional<Stamp> stamp = load_stamp(path, c.id);
  if (stamp && stamp->fresh) {
    out.sha256 = stamp->sha256;
  } else {
    log(Level::kInfo, "hashing " + path + " (SHA-256)");
    out.sha256 = c.hash();
  }
  for (const Card& card : same_size) {
    if (*card.sha256 == out.sha256) {
      out.card = card;
      out.by_content = true;
      if (!stamp || !stamp->fresh || stamp->card != card.id) {
        log(Level::kInfo, path + " is the file of model '" + card.id +
                              "' (same size and SHA-256): its card's licence applies");
        write_stamp(path, c.id, out.sha256, card.id);
      }
      return out;
    }
  }
  if (stamp && stamp->fresh) return out;
  // A file of no card is held to the content it had when it was first used here: a later change
  // under the same path (noticed when its size, mtime or inode change) is refused.
  if (stamp && stamp->sha256 != out.sha256) {
    throw Error(ErrorCode::kChecksumMismatch,
                "the content of " + path + " changed since it was first used here:\n  sha256 " +
                    stamp->sha256 + " then" +
                    (stamp->card.empty() ? "" : " (" + stamp->card + ")") + "\n  sha256 " +
                    out.sha256 +
                    " now\n  a checkpoint without a model card is held to the hash of its first "
                    "use. If you replaced the file on purpose, accept its new content with " +
                    accept_hint(path) + "; otherwise the file is damaged: restore it.");
  }
  if (!stamp) {
    log(Level::kWarn, path + " matches no model card; its SHA-256 is " + out.sha256 +
                          ", recorded now: a later change of its content under this path is "
                          "refused until you accept it with `sapiens-seg models verify " +
                          path + "`");
  }
  write_stamp(path, c.id, out.sha256, "");
  return out;
}
}  // namespace

Identified identify_by_content(const std::string& path, bool always_hash) {
  return identify_content(Content::of_file(path), always_hash);
}

Obtained obtain_file(const Card& card, const GateOptions& gate, const FetchOptions& fetch) {
  if (auto found = find_weights(card)) {
    if (!found->not_a_file.empty()) refuse_not_a_file(card, *found);
    return {found->path, std::nullopt};
  }
  const std::string url = download_url(card);
  if (offline()) {
    throw Error(ErrorCode::kOffline,
                "weights for '" + card.id +
                    "' are not on this machine and offline mode "
                    "(SAPIENS_SEG_OFFLINE / HF_HUB_OFFLINE) forbids downloading them." +
                    placement_hint(card));
  }
  if (url.empty()) {
    throw Error(ErrorCode::kNotFound, "weights for '" + card.id +
                                          "' are not on this machine and the card has no URL." +
                                          placement_hint(card));
  }
  check_verifiable(card, gate);  // before any transfer
  DownloadRequest req;
  req.url = url;
  req.dest = weights_target(card);
  req.size = card.size;
  req.sha256 = card.sha256;
  req.label = card.file;
  req.use_hf_token = fetch.use_hf_token;
  req.cancel = fetch.cancel;
  ProgressBar bar;
  if (fetch.progress) {
    req.progress = fetch.progress;
  } else if (::isatty(fileno(stderr)) && log_level() <= Level::kWarn) {
    req.progress = [&bar](const DownloadProgress& p) { return bar(p); };
  }
  log(Level::kInfo, "downloading " + card.file + " from " + url);
  try {
    const DownloadResult r = download(req);
    if (r.transferred) {
      write_stamp(req.dest, r.sha256, card.id);
      if (!card.sha256) {
        log(Level::kWarn, "unverified weights for '" + card.id + "': sha256 " + r.sha256 +
                              "; add it to the card to pin this file");
      }
      return {req.dest, r.sha256};
    }
  } catch (const Error& e) {
    // A cancel (Ctrl-C) is no failure to work around by hand.
    if (e.code() != ErrorCode::kDownloadFailed || (fetch.cancel && fetch.cancel->load())) throw;
    throw Error(e.code(),
                std::string(e.what()) + "\n  to place the file by hand:" + placement_hint(card));
  }
  // Another process finished the download while this one waited for the lock.
  return {req.dest, std::nullopt};
}

Verified obtain_weights(const Card& card, const GateOptions& gate, const FetchOptions& fetch) {
  const Obtained o = obtain_file(card, gate, fetch);
  return {o.path, o.sha256 ? *o.sha256 : verify_weights(card, o.path, gate)};
}

// ---- loading ---------------------------------------------------------------------------------

namespace {

bool looks_like_path(const std::string& s) {
  std::error_code ec;
  if (fs::exists(s, ec) || s.find('/') != std::string::npos) return true;
  for (const std::string_view ext : {".pt2", ".pt", ".safetensors"}) {
    if (s.size() > ext.size() && s.compare(s.size() - ext.size(), ext.size(), ext) == 0) {
      return true;
    }
  }
  return false;
}

// A card may be used only when its licence is accepted and its file can be verified; said as
// soon as the card is known (before anything is downloaded or hashed for a named card).
void admit(const Card& card, const GateOptions& gate) {
  check_license(card, gate);
  check_verifiable(card, gate);
}

// The family of a card, or of a file no card claims by what its bytes are: a zip archive is a
// Sapiens v1 TorchScript export; anything else is read as safetensors (Sapiens2), whose reader
// reports a file that is neither.
core::Family family_of(const std::optional<Card>& card, const std::string& path,
                       const core::MappedFile& bytes) {
  if (card) {
    const core::FamilyTraits* t = core::family_named(card->family);
    if (t == nullptr) {
      throw Error(ErrorCode::kFormatError, "card " + card->id + ": unknown family " + card->family);
    }
    return t->family;
  }
  if (bytes.size >= 4 && std::memcmp(bytes.data, "PK\x03\x04", 4) == 0) {
    return core::Family::kSapiensV1;
  }
  const std::string ext = fs::path(path).extension().string();
  // A .pt2 that is no zip archive: the TorchScript reader says what is wrong with it.
  if (ext == ".pt2" || ext == ".pt") return core::Family::kSapiensV1;
  return core::Family::kSapiens2;
}

}  // namespace

OpenedCheckpoint open_checkpoint(const std::string& id_or_path, const GateOptions& gate,
                                 const FetchOptions& fetch) {
  OpenedCheckpoint out;
  // 1. The name: a card id ("@revision" allowed), or a file, which a card claims when the file
  //    bears its file name. Nothing is read yet.
  const bool given_as_path = looks_like_path(id_or_path);
  if (given_as_path) {
    out.path = id_or_path;
    out.card = card_for_file_name(out.path);
  } else {
    out.card = find_card(id_or_path);
  }
  if (out.card) admit(*out.card, gate);

  // 2. The file: a path must be a regular file (a FIFO would block the read, a folder is not a
  //    checkpoint); a card's file is found in the caches or downloaded (hashed on the way).
  std::optional<std::string> downloaded_sha;
  if (given_as_path) {
    core::check_regular_file(out.path, "checkpoint");
  } else {
    Obtained got = obtain_file(*out.card, gate, fetch);
    out.path = std::move(got.path);
    downloaded_sha = std::move(got.sha256);
  }

  // 3. Read once: everything after this works on these bytes, never on the file again.
  out.bytes = core::map_file(out.path, "checkpoint");

  // 4. Verify what was read: a card's file against the card (its stamp when the stamp fits the
  //    file that was read, else a hash of the bytes). A file no card's name claims is still a
  //    card's file when its size and hash are (a renamed copy), and its licence is checked now.
  //    Safetensors carry no checksum of their own, so a bare one is always hashed and held to its
  //    first hash; TorchScript records carry CRC-32s, which the archive reader checks.
  const Content content = Content::of_bytes(out.path, out.bytes);
  if (out.card) {
    out.sha256 = downloaded_sha ? *downloaded_sha : verify_content(*out.card, content, gate, false);
  } else {
    const bool bare_safetensors =
        family_of(std::nullopt, out.path, out.bytes) == core::Family::kSapiens2;
    const Identified found = identify_content(content, bare_safetensors);
    out.sha256 = found.sha256;
    if (found.card) {
      out.card = found.card;
      admit(*out.card, gate);
    }
  }
  out.family = &core::traits_of(family_of(out.card, out.path, out.bytes));
  if (out.card) {
    const Card& c = *out.card;
    out.card_facts = core::CardFacts{c.id,          c.source, c.heads,      c.input_height,
                                     c.input_width, c.patch,  c.num_classes};
    show_license_notice(c);
  }
  return out;
}

}  // namespace sapiens_seg::io

namespace sapiens_seg {
namespace fs = std::filesystem;

std::string cache_dir() {
  return io::cache_dir();
}

WeightsStatus weights_status(const std::string& id) {
  const Card card = find_card(id);
  WeightsStatus s;
  s.id = card.id;
  s.path = io::weights_target(card);
  if (auto found = io::find_weights(card)) {
    s.path = found->path;
    s.location = found->location;
    s.present = true;
    if (!found->not_a_file.empty()) {
      s.problem = "not a file: it is " + found->not_a_file;
      return s;
    }
    std::error_code ec;
    s.size = fs::file_size(s.path, ec);
    if (card.size && s.size != *card.size) {
      s.problem = "wrong size: " + std::to_string(s.size) + " bytes, the card says " +
                  std::to_string(*card.size) + " (incomplete or another file)";
    } else if (card.sha256) {
      // No hashing here: only a stamp that still fits the file says it is verified.
      const auto stamped = io::read_stamp(s.path);
      s.verified = stamped && *stamped == *card.sha256;
      if (stamped && !s.verified) s.problem = "its last verification failed";
    }
  }
  return s;
}

std::string fetch(const std::string& id, const FetchOptions& options) {
  const Card card = find_card(id);
  // Fetching is not using: the licence gate applies at load time. The unverified gate does not
  // apply here either: the computed hash is reported so it can be pinned.
  return io::obtain_weights(card, {.accept_noncommercial = true, .allow_unverified = true}, options)
      .path;
}

WeightsStatus verify(const std::string& id) {
  const Card card = find_card(id);
  if (const auto found = io::find_weights(card); found && !found->not_a_file.empty()) {
    io::refuse_not_a_file(card, *found);
  }
  WeightsStatus s = weights_status(id);
  if (!s.present) {
    throw Error(ErrorCode::kNotFound,
                "weights for '" + card.id + "' are not on this machine (" + s.path + ")");
  }
  s.sha256 = io::verify_weights(card, s.path, {.allow_unverified = true}, /*rehash=*/true);
  s.verified = card.sha256.has_value();
  return s;
}

WeightsStatus verify_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw Error(ErrorCode::kNotFound, "checkpoint not found (or not a file): " + path);
  }
  WeightsStatus s;
  s.path = path;
  s.location = "path";
  s.present = true;
  s.size = fs::file_size(path, ec);
  if (auto card = io::card_for_file_name(path)) {
    // Its name makes it a card's file: held to that card, as at load time.
    s.id = card->id;
    s.sha256 = io::verify_weights(*card, path, {.allow_unverified = true}, /*rehash=*/true);
    s.verified = card->sha256.has_value();
    return s;
  }
  // Whatever the stamp says, hash again and record the file's content as it is now.
  io::remove_stamp(path);
  const io::Identified found = io::identify_by_content(path, /*always_hash=*/true);
  s.sha256 = found.sha256;
  if (found.card) {
    s.id = found.card->id;
    s.verified = true;
  }
  return s;
}

bool remove_weights(const std::string& id) {
  const Card card = find_card(id);
  const std::string target = io::weights_target(card);
  std::error_code ec;
  bool removed = false;
  io::remove_stamp(target);
  for (const std::string& p : {target, target + ".part"}) {
    if (fs::exists(p, ec)) {
      fs::remove(p, ec);
      if (ec) throw Error(ErrorCode::kIo, "cannot remove " + p + ": " + ec.message());
      removed = true;
    }
  }
  fs::remove(target + ".lock", ec);
  return removed;
}

void check_license(const Card& card, bool accept_noncommercial) {
  io::check_license(card, io::GateOptions{accept_noncommercial, false});
}

}  // namespace sapiens_seg
