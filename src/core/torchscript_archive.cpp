#include "torchscript_archive.hpp"

#include <bit>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include "mapped_file.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core {
namespace {

// Records hold little-endian data that the views reinterpret in place.
static_assert(std::endian::native == std::endian::little,
              "TorchScript archive views need a little-endian host");

[[noreturn]] void malformed(const std::string& source, const std::string& what) {
  throw Error(ErrorCode::kFormatError, "malformed TorchScript archive " + source + ": " + what);
}

std::uint16_t u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
std::uint32_t u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
std::uint64_t u64(const std::uint8_t* p) {
  return static_cast<std::uint64_t>(u32(p)) | (static_cast<std::uint64_t>(u32(p + 4)) << 32);
}

// ---- the unpickler ---------------------------------------------------------------------------

// The subset of Python objects that data.pkl builds. Storages and tensors are descriptions only:
// no bytes are touched while unpickling.
struct Value;
using Ref = std::shared_ptr<Value>;
struct Value {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kStr,
    kTuple,
    kList,
    kDict,
    kGlobal,
    kObject,
    kStorage,
    kTensor
  };
  Kind kind = Kind::kNone;
  std::int64_t i = 0;  // kBool, kInt; kStorage: numel
  double f = 0;
  std::string s;                             // kStr; kGlobal: "module.name"; kStorage: key
  std::vector<Ref> items;                    // kTuple, kList
  std::vector<std::pair<Ref, Ref>> entries;  // kDict
  Ref cls, state;                            // kObject
  at::ScalarType dtype = at::kFloat;         // kStorage
  std::shared_ptr<ArchiveTensor> tensor;     // kTensor
};

Ref make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

std::optional<at::ScalarType> storage_dtype(const std::string& global) {
  static const std::map<std::string, at::ScalarType> kTypes = {
      {"torch.FloatStorage", at::kFloat}, {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},   {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},   {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort}, {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},   {"torch.BoolStorage", at::kBool},
  };
  auto it = kTypes.find(global);
  if (it == kTypes.end()) return std::nullopt;
  return it->second;
}

class Unpickler {
 public:
  Unpickler(const std::uint8_t* data, std::size_t size, const std::string& source)
      : p_(data), size_(size), source_(source) {}

  Ref run() {
    while (true) {
      const std::size_t at = pos_;
      const std::uint8_t op = byte();
      switch (op) {
        case 0x80:  // PROTO
          byte();
          break;
        case 0x95:  // FRAME: a length hint only
          take(8);
          break;
        case '.':  // STOP
          if (stack_.size() != 1 || !marks_.empty()) fail("unbalanced stack at STOP", at);
          return stack_.back();
        case '(':  // MARK
          marks_.push_back(stack_.size());
          break;
        case 'N':
          push(make(Value::Kind::kNone));
          break;
        case 0x88:    // NEWTRUE
        case 0x89: {  // NEWFALSE
          auto v = make(Value::Kind::kBool);
          v->i = op == 0x88;
          push(v);
          break;
        }
        case 'K':  // BININT1
          push_int(byte());
          break;
        case 'M':  // BININT2
          push_int(u16(take(2)));
          break;
        case 'J':  // BININT
          push_int(static_cast<std::int32_t>(u32(take(4))));
          break;
        case 0x8a: {  // LONG1
          const std::size_t n = byte();
          if (n > 8) fail("integer wider than 64 bits", at);
          const std::uint8_t* b = take(n);
          std::uint64_t v = 0;
          for (std::size_t k = 0; k < n; ++k) v |= static_cast<std::uint64_t>(b[k]) << (8 * k);
          if (n > 0 && n < 8 && (b[n - 1] & 0x80)) v |= ~std::uint64_t{0} << (8 * n);
          push_int(static_cast<std::int64_t>(v));
          break;
        }
        case 'G': {  // BINFLOAT, big-endian
          const std::uint8_t* b = take(8);
          std::uint64_t bits = 0;
          for (int k = 0; k < 8; ++k) bits = (bits << 8) | b[k];
          auto v = make(Value::Kind::kFloat);
          v->f = std::bit_cast<double>(bits);
          push(v);
          break;
        }
        case 'X':  // BINUNICODE
        case 'B':  // BINBYTES
          push_str(u32(take(4)));
          break;
        case 'T': {  // BINSTRING (signed length)
          const auto n = static_cast<std::int32_t>(u32(take(4)));
          if (n < 0) fail("negative string length", at);
          push_str(static_cast<std::uint64_t>(n));
          break;
        }
        case 0x8c:  // SHORT_BINUNICODE
        case 'U':   // SHORT_BINSTRING
        case 'C':   // SHORT_BINBYTES
          push_str(byte());
          break;
        case 0x8d:  // BINUNICODE8
        case 0x8e:  // BINBYTES8
          push_str(u64(take(8)));
          break;
        case ')':
          push(make(Value::Kind::kTuple));
          break;
        case ']':
          push(make(Value::Kind::kList));
          break;
        case '}':
          push(make(Value::Kind::kDict));
          break;
        case 't': {  // TUPLE
          auto v = make(Value::Kind::kTuple);
          v->items = pop_to_mark(at);
          push(v);
          break;
        }
        case 'l': {  // LIST
          auto v = make(Value::Kind::kList);
          v->items = pop_to_mark(at);
          push(v);
          break;
        }
        case 'd': {  // DICT
          auto v = make(Value::Kind::kDict);
          set_items(v, pop_to_mark(at), at);
          push(v);
          break;
        }
        case 0x85:  // TUPLE1..3
        case 0x86:
        case 0x87: {
          const std::size_t n = op - 0x84;
          auto v = make(Value::Kind::kTuple);
          if (stack_.size() < n + base()) fail("stack underflow", at);
          v->items.assign(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
          stack_.resize(stack_.size() - n);
          push(v);
          break;
        }
        case 'a': {  // APPEND
          Ref item = pop(at);
          Ref& list = top(at);
          if (list->kind != Value::Kind::kList) fail("APPEND to a non-list", at);
          list->items.push_back(std::move(item));
          break;
        }
        case 'e': {  // APPENDS
          auto items = pop_to_mark(at);
          Ref& list = top(at);
          if (list->kind != Value::Kind::kList) fail("APPENDS to a non-list", at);
          for (auto& x : items) list->items.push_back(std::move(x));
          break;
        }
        case 's': {  // SETITEM
          Ref value = pop(at), key = pop(at);
          Ref& dict = top(at);
          if (dict->kind != Value::Kind::kDict) fail("SETITEM on a non-dict", at);
          dict->entries.emplace_back(std::move(key), std::move(value));
          break;
        }
        case 'u': {  // SETITEMS
          auto items = pop_to_mark(at);
          set_items(top(at), std::move(items), at);
          break;
        }
        case 'q':  // BINPUT
          memo_[byte()] = top(at);
          break;
        case 'r':  // LONG_BINPUT
          memo_[u32(take(4))] = top(at);
          break;
        case 0x94:  // MEMOIZE
          memo_[static_cast<std::uint32_t>(memo_.size())] = top(at);
          break;
        case 'h':  // BINGET
          push(memo(byte(), at));
          break;
        case 'j':  // LONG_BINGET
          push(memo(u32(take(4)), at));
          break;
        case 'c': {  // GLOBAL "module\nname\n"
          const std::string module = line(at), name = line(at);
          push(global(module, name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          Ref name = pop(at), module = pop(at);
          if (name->kind != Value::Kind::kStr || module->kind != Value::Kind::kStr) {
            fail("STACK_GLOBAL without strings", at);
          }
          push(global(module->s, name->s));
          break;
        }
        case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
          Ref args = pop(at), cls = pop(at);
          if (cls->kind != Value::Kind::kGlobal) fail("NEWOBJ of a non-class", at);
          auto v = make(Value::Kind::kObject);
          v->cls = std::move(cls);
          push(v);
          break;
        }
        case 'R': {  // REDUCE: callable(*args)
          Ref args = pop(at), fn = pop(at);
          if (fn->kind != Value::Kind::kGlobal || args->kind != Value::Kind::kTuple) {
            fail("REDUCE needs a global and a tuple", at);
          }
          push(reduce(fn->s, args->items, at));
          break;
        }
        case 'b': {  // BUILD: obj.__setstate__(state)
          Ref state = pop(at);
          Ref& obj = top(at);
          if (obj->kind == Value::Kind::kObject) obj->state = std::move(state);
          break;
        }
        case 'Q': {  // BINPERSID: torch's storage references
          Ref pid = pop(at);
          push(persistent(pid, at));
          break;
        }
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          fail(std::string("unsupported pickle opcode ") + hex, at);
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what, std::size_t at) const {
    malformed(source_, "data.pkl: " + what + " at byte " + std::to_string(at));
  }
  std::uint8_t byte() { return *take(1); }
  const std::uint8_t* take(std::size_t n) {
    if (n > size_ - pos_) fail("unexpected end of the pickle", pos_);
    const std::uint8_t* r = p_ + pos_;
    pos_ += n;
    return r;
  }
  std::string line(std::size_t at) {
    const void* nl = std::memchr(p_ + pos_, '\n', size_ - pos_);
    if (!nl) fail("unterminated GLOBAL", at);
    const auto* end = static_cast<const std::uint8_t*>(nl);
    std::string s(reinterpret_cast<const char*>(p_ + pos_),
                  static_cast<std::size_t>(end - p_) - pos_);
    pos_ = static_cast<std::size_t>(end - p_) + 1;
    return s;
  }
  std::size_t base() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(Ref v) { stack_.push_back(std::move(v)); }
  void push_int(std::int64_t i) {
    auto v = make(Value::Kind::kInt);
    v->i = i;
    push(v);
  }
  void push_str(std::uint64_t n) {
    if (n > size_ - pos_) fail("string longer than the rest of the pickle", pos_);
    const std::uint8_t* b = take(static_cast<std::size_t>(n));
    auto v = make(Value::Kind::kStr);
    v->s.assign(reinterpret_cast<const char*>(b), static_cast<std::size_t>(n));
    push(v);
  }
  Ref pop(std::size_t at) {
    if (stack_.size() <= base()) fail("stack underflow", at);
    Ref v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  Ref& top(std::size_t at) {
    if (stack_.size() <= base()) fail("stack underflow", at);
    return stack_.back();
  }
  std::vector<Ref> pop_to_mark(std::size_t at) {
    if (marks_.empty()) fail("no MARK", at);
    const std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Ref> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  void set_items(const Ref& dict, std::vector<Ref> items, std::size_t at) {
    if (dict->kind != Value::Kind::kDict) fail("SETITEMS on a non-dict", at);
    if (items.size() % 2 != 0) fail("odd number of dict items", at);
    for (std::size_t k = 0; k < items.size(); k += 2) {
      dict->entries.emplace_back(std::move(items[k]), std::move(items[k + 1]));
    }
  }
  Ref memo(std::uint32_t key, std::size_t at) const {
    auto it = memo_.find(key);
    if (it == memo_.end()) fail("reference to an unknown memo entry", at);
    return it->second;
  }
  static Ref global(const std::string& module, const std::string& name) {
    auto v = make(Value::Kind::kGlobal);
    v->s = module + "." + name;
    return v;
  }

  Ref persistent(const Ref& pid, std::size_t at) {
    // ('storage', <dtype>Storage, key, location, numel)
    const auto& t = pid->items;
    if (pid->kind != Value::Kind::kTuple || t.size() != 5 || t[0]->kind != Value::Kind::kStr ||
        t[0]->s != "storage") {
      fail("persistent id is not a storage reference", at);
    }
    if (t[1]->kind != Value::Kind::kGlobal) fail("storage type is not a class", at);
    const auto dtype = storage_dtype(t[1]->s);
    if (!dtype) fail("unsupported storage type " + t[1]->s, at);
    if (t[2]->kind != Value::Kind::kStr || t[4]->kind != Value::Kind::kInt || t[4]->i < 0) {
      fail("malformed storage reference", at);
    }
    auto v = make(Value::Kind::kStorage);
    v->dtype = *dtype;
    v->s = t[2]->s;
    v->i = t[4]->i;
    return v;
  }

  std::vector<std::int64_t> ints(const Ref& tuple, const char* what, std::size_t at) const {
    if (tuple->kind != Value::Kind::kTuple) fail(std::string(what) + " is not a tuple", at);
    std::vector<std::int64_t> out;
    for (const auto& x : tuple->items) {
      if (x->kind != Value::Kind::kInt || x->i < 0) {
        fail(std::string(what) + " holds a non-integer or negative value", at);
      }
      out.push_back(x->i);
    }
    return out;
  }

  Ref reduce(const std::string& fn, const std::vector<Ref>& args, std::size_t at) {
    if (fn == "torch._utils._rebuild_tensor_v2" || fn == "torch._utils._rebuild_tensor") {
      // (storage, storage_offset, size, stride[, requires_grad, backward_hooks[, metadata]])
      if (args.size() < 4 || args[0]->kind != Value::Kind::kStorage ||
          args[1]->kind != Value::Kind::kInt || args[1]->i < 0) {
        fail("malformed " + fn + " arguments", at);
      }
      auto t = std::make_shared<ArchiveTensor>();
      t->dtype = args[0]->dtype;
      t->storage_key = args[0]->s;
      t->storage_numel = args[0]->i;
      t->storage_offset = args[1]->i;
      t->sizes = ints(args[2], "tensor size", at);
      t->strides = ints(args[3], "tensor stride", at);
      if (t->sizes.size() != t->strides.size()) fail("tensor size and stride differ in rank", at);
      auto v = make(Value::Kind::kTensor);
      v->tensor = std::move(t);
      return v;
    }
    if (fn == "torch._utils._rebuild_parameter" ||
        fn == "torch._utils._rebuild_parameter_with_state") {
      if (args.empty() || args[0]->kind != Value::Kind::kTensor) {
        fail("malformed " + fn + " arguments", at);
      }
      return args[0];
    }
    if (fn == "collections.OrderedDict") return make(Value::Kind::kDict);
    if (fn.rfind("torch._utils._rebuild_", 0) == 0) {
      fail("unsupported tensor kind " + fn + " (quantized, sparse or other special tensors)", at);
    }
    // Anything else (a device, a dtype, ...) stays an inert object; it is never called.
    auto v = make(Value::Kind::kObject);
    v->cls = global(fn, "");
    return v;
  }

  const std::uint8_t* p_;
  std::size_t size_;
  std::size_t pos_ = 0;
  const std::string& source_;
  std::vector<Ref> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint32_t, Ref> memo_;
};

// The tensor attributes of the module tree, by dotted path.
void collect(const Ref& obj, const std::string& prefix, int depth, PickledModule& out,
             const std::string& source) {
  if (depth > 64) malformed(source, "data.pkl: module tree deeper than 64 levels");
  if (!obj->state || obj->state->kind != Value::Kind::kDict) return;
  for (const auto& [key, value] : obj->state->entries) {
    if (key->kind != Value::Kind::kStr) continue;
    const std::string name = prefix.empty() ? key->s : prefix + "." + key->s;
    if (value->kind == Value::Kind::kTensor) {
      ArchiveTensor t = *value->tensor;
      t.name = name;
      out.tensors.push_back(std::move(t));
    } else if (value->kind == Value::Kind::kObject && value->cls) {
      out.module_classes[name] = value->cls->s;
      collect(value, name, depth + 1, out, source);
    }
  }
}

// Reads records through LibTorch's own zip reader, over the bytes we already hold; used only for
// the few compressed records (the serialized code), never for tensor data.
class MemoryAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  MemoryAdapter(const std::uint8_t* p, std::size_t n) : p_(p), n_(n) {}
  size_t size() const override { return n_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= n_) return 0;
    n = std::min<std::size_t>(n, n_ - static_cast<std::size_t>(pos));
    std::memcpy(buf, p_ + pos, n);
    return n;
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

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

}  // namespace

PickledModule unpickle_module_tree(const std::uint8_t* data, std::size_t size,
                                   const std::string& source) {
  Ref root = Unpickler(data, size, source).run();
  if (root->kind != Value::Kind::kObject) malformed(source, "data.pkl does not hold a module");
  PickledModule out;
  out.module_classes[""] = root->cls ? root->cls->s : "";
  collect(root, "", 0, out, source);
  std::map<std::string, int> seen;
  for (const auto& t : out.tensors) {
    if (seen[t.name]++) malformed(source, "data.pkl: tensor '" + t.name + "' appears twice");
  }
  return out;
}

TorchScriptArchive TorchScriptArchive::open(const std::string& path) {
  MappedFile m = map_file(path, "checkpoint");
  if (m.size < 22) malformed(path, "the file is only " + std::to_string(m.size) + " bytes");
  TorchScriptArchive a;
  a.owner_ = std::move(m.owner);  // every tensor view holds the mapping
  a.source_ = path;
  a.base_ = m.data;
  a.size_ = m.size;
  a.parse();
  return a;
}

TorchScriptArchive TorchScriptArchive::from_buffer(
    std::shared_ptr<const std::vector<std::uint8_t>> bytes, std::string source) {
  if (!bytes) throw Error(ErrorCode::kInvalidInput, "archive buffer " + source + " is null");
  TorchScriptArchive a;
  a.source_ = std::move(source);
  a.base_ = bytes->data();
  a.size_ = bytes->size();
  a.owner_ = std::move(bytes);
  a.parse();
  return a;
}

void TorchScriptArchive::parse() {
  const std::uint8_t* b = base_;
  if (size_ < 22 || std::memcmp(b, "PK\x03\x04", 4) != 0) {
    malformed(source_, "no zip signature at the start");
  }
  // End of central directory: the last 22 bytes plus a comment of up to 64 KiB.
  std::size_t eocd = std::string::npos;
  const std::size_t lowest = size_ - 22 > 65535 ? size_ - 22 - 65535 : 0;
  for (std::size_t k = size_ - 22 + 1; k-- > lowest;) {
    if (std::memcmp(b + k, "PK\x05\x06", 4) == 0) {
      eocd = k;
      break;
    }
  }
  if (eocd == std::string::npos) {
    malformed(source_, "truncated (no end-of-central-directory record)");
  }
  std::uint64_t entries = u16(b + eocd + 10), cd_size = u32(b + eocd + 12),
                cd_offset = u32(b + eocd + 16);
  if (entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    // Zip64 (archives over 4 GiB, e.g. the 1B checkpoint): a locator precedes the record.
    if (eocd < 20 || std::memcmp(b + eocd - 20, "PK\x06\x07", 4) != 0) {
      malformed(source_, "zip64 end-of-central-directory locator missing");
    }
    const std::uint64_t z = u64(b + eocd - 20 + 8);
    if (z > eocd - 20 || eocd - 20 - z < 56 || std::memcmp(b + z, "PK\x06\x06", 4) != 0) {
      malformed(source_, "zip64 end-of-central-directory record missing");
    }
    entries = u64(b + z + 32);
    cd_size = u64(b + z + 40);
    cd_offset = u64(b + z + 48);
  }
  if (cd_offset > size_ || cd_size > size_ - cd_offset || cd_offset + cd_size > eocd) {
    malformed(source_, "central directory outside the file (truncated?)");
  }
  records_.clear();
  by_name_.clear();
  std::size_t pos = cd_offset;
  const std::size_t cd_end = cd_offset + cd_size;
  for (std::uint64_t e = 0; e < entries; ++e) {
    if (cd_end - pos < 46 || std::memcmp(b + pos, "PK\x01\x02", 4) != 0) {
      malformed(source_, "central directory entry " + std::to_string(e) + " is damaged");
    }
    const std::uint16_t flags = u16(b + pos + 8), method = u16(b + pos + 10);
    std::uint64_t csize = u32(b + pos + 20), usize = u32(b + pos + 24);
    const std::size_t nlen = u16(b + pos + 28), elen = u16(b + pos + 30), clen = u16(b + pos + 32);
    std::uint64_t lho = u32(b + pos + 42);
    if (cd_end - pos - 46 < nlen + elen + clen) {
      malformed(source_, "central directory entry " + std::to_string(e) + " is cut short");
    }
    std::string name(reinterpret_cast<const char*>(b + pos + 46), nlen);
    // Zip64 extra field: 64-bit values for the fields saturated above, in this order.
    const std::uint8_t* x = b + pos + 46 + nlen;
    for (std::size_t k = 0; k + 4 <= elen;) {
      const std::uint16_t id = u16(x + k), len = u16(x + k + 2);
      if (k + 4 + len > elen) break;
      if (id == 0x0001) {
        std::size_t q = k + 4;
        auto next = [&](std::uint64_t& field) {
          if (field != 0xFFFFFFFF) return;
          if (q + 8 > k + 4 + len) malformed(source_, "zip64 field of '" + name + "' is short");
          field = u64(x + q);
          q += 8;
        };
        next(usize);
        next(csize);
        next(lho);
      }
      k += 4 + len;
    }
    pos += 46 + nlen + elen + clen;
    if (flags & 1) malformed(source_, "record '" + name + "' is encrypted");
    if (method != 0 && method != 8) {
      malformed(source_, "record '" + name + "' uses compression method " + std::to_string(method) +
                             " (only stored and deflated are read)");
    }
    const auto slash = name.find('/');
    if (slash == std::string::npos) malformed(source_, "record '" + name + "' has no top folder");
    if (root_.empty()) root_ = name.substr(0, slash);
    if (name.compare(0, slash, root_) != 0 || slash != root_.size()) {
      malformed(source_, "record '" + name + "' is outside the archive folder " + root_);
    }
    if (lho > cd_offset || cd_offset - lho < 30 || std::memcmp(b + lho, "PK\x03\x04", 4) != 0) {
      malformed(source_, "local header of record '" + name + "' is missing");
    }
    const std::uint64_t data = lho + 30 + u16(b + lho + 26) + u16(b + lho + 28);
    if (data > cd_offset || csize > cd_offset - data) {
      malformed(source_, "record '" + name + "' is truncated (" + std::to_string(csize) +
                             " bytes declared, " +
                             std::to_string(data > cd_offset ? 0 : cd_offset - data) +
                             " available before the directory)");
    }
    if (method == 0 && csize != usize) {
      malformed(source_, "stored record '" + name + "' has differing sizes");
    }
    ArchiveRecord r{name.substr(slash + 1), method, data, csize, usize};
    by_name_[r.name] = records_.size();
    records_.push_back(std::move(r));
  }

  if (const auto* bo = find_record("byteorder")) {
    const std::string order = read_record(bo->name);
    if (order != "little") {
      malformed(source_, "tensors are stored " + order + "-endian; only little-endian is read");
    }
  }
  if (!find_record("data.pkl")) malformed(source_, "no data.pkl record (not a TorchScript module)");
  const std::string pkl = read_record("data.pkl");
  PickledModule tree =
      unpickle_module_tree(reinterpret_cast<const std::uint8_t*>(pkl.data()), pkl.size(), source_);
  for (const auto& t : tree.tensors) {
    const ArchiveRecord* r = find_record("data/" + t.storage_key);
    const std::string what = "tensor '" + t.name + "'";
    if (!r) malformed(source_, what + ": its storage record data/" + t.storage_key + " is missing");
    if (r->method != 0) malformed(source_, what + ": its storage record is compressed");
    const std::size_t es = c10::elementSize(t.dtype);
    if (static_cast<std::uint64_t>(t.storage_numel) > r->size / es) {
      malformed(source_, what + ": storage of " + std::to_string(t.storage_numel) + " " +
                             c10::toString(t.dtype) + " elements but a record of " +
                             std::to_string(r->size) + " bytes");
    }
    // The highest element the view reaches must lie inside the storage.
    std::int64_t extent = t.storage_offset, numel = 1;
    for (std::size_t d = 0; d < t.sizes.size(); ++d) {
      numel *= t.sizes[d];
      if (t.sizes[d] > 0) extent += (t.sizes[d] - 1) * t.strides[d];
    }
    if (numel > 0 && extent >= t.storage_numel) {
      malformed(source_, what + " reaches past its storage (" + std::to_string(extent + 1) + " > " +
                             std::to_string(t.storage_numel) + " elements)");
    }
  }
  tensors_ = std::move(tree.tensors);
  module_classes_ = std::move(tree.module_classes);
}

const ArchiveRecord* TorchScriptArchive::find_record(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &records_[it->second];
}

std::string TorchScriptArchive::read_record(const std::string& name) const {
  const ArchiveRecord* r = find_record(name);
  if (!r) malformed(source_, "no record '" + name + "'");
  if (r->method == 0) return std::string(reinterpret_cast<const char*>(base_ + r->offset), r->size);
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<MemoryAdapter>(base_, size_));
    auto [ptr, n] = reader.getRecord(name);
    return std::string(static_cast<const char*>(ptr.get()), n);
  } catch (const c10::Error& e) {
    std::string why = e.what_without_backtrace();
    malformed(source_, "cannot inflate record '" + name + "': " + why.substr(0, why.find('\n')));
  }
}

at::Tensor TorchScriptArchive::tensor(const ArchiveTensor& t) const {
  const ArchiveRecord* r = find_record("data/" + t.storage_key);  // checked by parse()
  const auto options = at::TensorOptions().dtype(t.dtype).device(at::kCPU);
  const std::size_t es = c10::elementSize(t.dtype);
  const std::uint8_t* p = base_ + r->offset + static_cast<std::size_t>(t.storage_offset) * es;
  if (reinterpret_cast<std::uintptr_t>(p) % es == 0 && t.dtype != at::kBool) {
    // The deleter only keeps the mapping alive as long as the tensor; from_blob wants a mutable
    // pointer, see the header about writing through views.
    return at::from_blob(
        const_cast<std::uint8_t*>(p), t.sizes, t.strides, [keep = owner_](void*) {}, options);
  }
  // A writer that does not align records (torch always does), or bools whose bytes need a
  // check: copy through a byte view.
  const std::int64_t bytes = (t.storage_numel - t.storage_offset) * static_cast<std::int64_t>(es);
  at::Tensor raw = at::empty({bytes}, at::kByte);
  std::memcpy(raw.data_ptr(), p, static_cast<std::size_t>(bytes));
  if (t.dtype == at::kBool && raw.gt(1).any().item<bool>()) {
    malformed(source_, "tensor '" + t.name + "': bool bytes other than 0 and 1");
  }
  return raw.view(t.dtype).as_strided(t.sizes, t.strides).clone();
}

TensorMap TorchScriptArchive::all() const {
  TensorMap out;
  for (const auto& t : tensors_) out.emplace(t.name, tensor(t));
  return out;
}

std::optional<int> TorchScriptArchive::attention_heads(const std::string& module_path) const {
  auto it = module_classes_.find(module_path);
  if (it == module_classes_.end()) return std::nullopt;
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
