#include "torchscript_archive.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <exception>
#include <mutex>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "mapped_file.hpp"
#include "sapiens_seg/error.hpp"
#include "zip_codec.hpp"

namespace sapiens_seg::core {
namespace {

// Records hold little-endian data that the views reinterpret in place.
static_assert(std::endian::native == std::endian::little,
              "TorchScript archive views need a little-endian host");

[[noreturn]] void malformed(const std::string& source, const std::string& what) {
  throw Error(ErrorCode::kFormatError, "malformed TorchScript archive " + source + ": " + what);
}

bool is_int_literal(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

// The CRC pass is split into pieces of this size so that records of any size spread over the
// threads; crc32_combine joins the pieces of a record.
constexpr std::size_t kCrcPiece = std::size_t{8} << 20;

}  // namespace

at::ScalarType to_scalar_type(ArchiveDtype dtype) noexcept {
  switch (dtype) {
    case ArchiveDtype::kF64:
      return at::kDouble;
    case ArchiveDtype::kF32:
      return at::kFloat;
    case ArchiveDtype::kF16:
      return at::kHalf;
    case ArchiveDtype::kBF16:
      return at::kBFloat16;
    case ArchiveDtype::kI64:
      return at::kLong;
    case ArchiveDtype::kI32:
      return at::kInt;
    case ArchiveDtype::kI16:
      return at::kShort;
    case ArchiveDtype::kI8:
      return at::kChar;
    case ArchiveDtype::kU8:
      return at::kByte;
    case ArchiveDtype::kBool:
      return at::kBool;
  }
  return at::kByte;
}

TorchScriptArchive TorchScriptArchive::open(const std::string& path,
                                            const ArchiveOptions& options) {
  return from_mapped(map_file(path, "checkpoint"), path, options);
}

TorchScriptArchive TorchScriptArchive::from_mapped(MappedFile m, std::string source,
                                                   const ArchiveOptions& options) {
  if (m.size < 22) malformed(source, "the file is only " + std::to_string(m.size) + " bytes");
  TorchScriptArchive a;
  a.owner_ = std::move(m.owner);  // every tensor view holds the bytes
  a.source_ = std::move(source);
  a.base_ = m.data;
  a.size_ = m.size;
  a.layout_ = parse_torchscript_archive(a.base_, a.size_, a.source_);
  a.load_storages(options);
  return a;
}

TorchScriptArchive TorchScriptArchive::from_buffer(
    std::shared_ptr<const std::vector<std::uint8_t>> bytes, std::string source,
    const ArchiveOptions& options) {
  if (!bytes) throw Error(ErrorCode::kInvalidInput, "archive buffer " + source + " is null");
  TorchScriptArchive a;
  a.source_ = std::move(source);
  a.base_ = bytes->data();
  a.size_ = bytes->size();
  a.owner_ = std::move(bytes);
  a.layout_ = parse_torchscript_archive(a.base_, a.size_, a.source_);
  a.load_storages(options);
  return a;
}

void TorchScriptArchive::load_storages(const ArchiveOptions& options) {
  // The storage records the tensors use, each once.
  std::vector<const ArchiveRecord*> stored, deflated;
  std::map<std::string, bool> seen;
  for (const auto& t : layout_.tensors) {
    if (seen[t.storage_key]) continue;
    seen[t.storage_key] = true;
    const ArchiveRecord* r = layout_.find("data/" + t.storage_key);  // checked by the parser
    (r->method == 0 ? stored : deflated).push_back(r);
  }

  // Deflated records (an archive re-zipped with compression): inflated into owned memory, which
  // read_record checks against the CRC as it goes. An allocation the machine cannot make is an
  // error of its own, not an abort.
  for (const ArchiveRecord* r : deflated) {
    at::Tensor buf;
    try {
      buf = at::empty({static_cast<std::int64_t>(r->uncompressed)}, at::kByte);
    } catch (const std::exception&) {
      throw Error(ErrorCode::kOutOfMemory,
                  "out of memory: cannot allocate " + std::to_string(r->uncompressed) +
                      " bytes to inflate record '" + r->name + "' of " + source_);
    }
    core::read_record(base_, *r, buf.data_ptr<std::uint8_t>(), source_);
    inflated_.emplace(r->name.substr(5), std::move(buf));
  }
  if (!options.verify_crc || stored.empty()) return;

  // Stored records are used in place; their CRC-32 is computed here, in pieces spread over the
  // intra-op threads, so that a damaged byte anywhere is refused at load time.
  struct Piece {
    std::size_t record;
    std::uint64_t begin, size;
    std::uint32_t crc = 0;
  };
  std::vector<Piece> pieces;
  for (std::size_t i = 0; i < stored.size(); ++i) {
    const std::uint64_t n = stored[i]->size;
    if (n == 0) pieces.push_back({i, 0, 0});
    for (std::uint64_t b = 0; b < n; b += kCrcPiece) {
      pieces.push_back({i, b, std::min<std::uint64_t>(kCrcPiece, n - b)});
    }
  }
  at::parallel_for(0, static_cast<std::int64_t>(pieces.size()), 1,
                   [&](std::int64_t lo, std::int64_t hi) {
                     for (std::int64_t k = lo; k < hi; ++k) {
                       Piece& p = pieces[static_cast<std::size_t>(k)];
                       p.crc = crc32(base_ + stored[p.record]->offset + p.begin, p.size);
                     }
                   });
  std::vector<std::uint32_t> crc(stored.size(), 0);
  for (const Piece& p : pieces) {
    crc[p.record] = p.begin == 0 ? p.crc : crc32_combine(crc[p.record], p.crc, p.size);
  }
  for (std::size_t i = 0; i < stored.size(); ++i) check_record_crc(*stored[i], crc[i], source_);
}

std::string TorchScriptArchive::read_record(const std::string& name) const {
  const ArchiveRecord* r = find_record(name);
  if (!r) malformed(source_, "no record '" + name + "'");
  return core::read_record(base_, *r, source_);
}

at::Tensor TorchScriptArchive::tensor(const ArchiveTensor& t) const {
  const ArchiveRecord* r = find_record("data/" + t.storage_key);  // checked by the parser
  const at::ScalarType dtype = to_scalar_type(t.dtype);
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  const std::size_t es = element_size(t.dtype);
  std::shared_ptr<const void> keep = owner_;
  const std::uint8_t* record = base_ + r->offset;
  if (auto it = inflated_.find(t.storage_key); it != inflated_.end()) {
    record = it->second.data_ptr<std::uint8_t>();
    keep = std::shared_ptr<const void>(record, [buf = it->second](const void*) {});
  }
  std::int64_t numel = 1;
  for (const std::int64_t n : t.sizes) numel *= n;  // the parser checked it fits
  if (numel == 0) return at::empty(t.sizes, options);
  const std::uint8_t* p = record + static_cast<std::size_t>(t.storage_offset) * es;
  if (reinterpret_cast<std::uintptr_t>(p) % es == 0 && t.dtype != ArchiveDtype::kBool) {
    // The deleter only keeps the bytes alive as long as the tensor; from_blob wants a mutable
    // pointer, see the header about writing through views.
    return at::from_blob(
        const_cast<std::uint8_t*>(p), t.sizes, t.strides, [keep](void*) {}, options);
  }
  // A writer that does not align records (torch always does), or bools whose bytes need a
  // check: copy through a byte view.
  const std::int64_t bytes = (t.storage_numel - t.storage_offset) * static_cast<std::int64_t>(es);
  at::Tensor raw = at::empty({bytes}, at::kByte);
  if (bytes > 0) std::memcpy(raw.data_ptr(), p, static_cast<std::size_t>(bytes));
  if (t.dtype == ArchiveDtype::kBool && raw.gt(1).any().item<bool>()) {
    malformed(source_, "tensor '" + t.name + "': bool bytes other than 0 and 1");
  }
  return raw.view(dtype).as_strided(t.sizes, t.strides).clone();
}

TensorMap TorchScriptArchive::all() const {
  TensorMap out;
  for (const auto& t : layout_.tensors) out.emplace(t.name, tensor(t));
  return out;
}

std::optional<int> TorchScriptArchive::attention_heads(const std::string& module_path) const {
  auto it = layout_.module_classes.find(module_path);
  if (it == layout_.module_classes.end()) return std::nullopt;
  // "__torch__.pkg.mod.Class" lives in code/__torch__/pkg/mod.py as "class Class(Module):".
  const std::string& qualified = it->second;
  const auto dot = qualified.rfind('.');
  if (dot == std::string::npos) return std::nullopt;
  std::string file = "code/" + qualified.substr(0, dot) + ".py";
  for (std::size_t k = 5; k < file.size() - 3; ++k)
    if (file[k] == '.') file[k] = '/';
  if (!find_record(file)) return std::nullopt;
  const std::string code = read_record(file);
  const std::string head = "class " + qualified.substr(dot + 1) + "(";
  std::size_t begin = code.rfind(head, 0) == 0 ? 0 : code.find("\n" + head);
  if (begin == std::string::npos) return std::nullopt;
  const std::size_t end = std::min(code.size(), code.find("\nclass ", begin + 1));
  // The traced reshape writes its target shape as a literal list: [B, N, 3, heads, head_dim],
  // where B and N are names (dynamic) and the rest integers.
  for (std::size_t open = code.find('[', begin); open < end; open = code.find('[', open + 1)) {
    const std::size_t close = code.find_first_of("[]", open + 1);
    if (close == std::string::npos || close > end || code[close] != ']') continue;
    std::vector<std::string> items;
    const std::string inner = code.substr(open + 1, close - open - 1);
    for (std::size_t s = 0;;) {
      const std::size_t c = inner.find(',', s);
      items.push_back(trim(inner.substr(s, c == std::string::npos ? c : c - s)));
      if (c == std::string::npos) break;
      s = c + 1;
    }
    if (items.size() == 5 && items[2] == "3" && is_int_literal(items[3]) &&
        is_int_literal(items[4])) {
      const int heads = std::stoi(items[3]);
      if (heads > 0) return heads;
    }
  }
  return std::nullopt;
}

}  // namespace sapiens_seg::core
