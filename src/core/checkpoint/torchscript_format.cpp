#include "torchscript_format.hpp"

#include <bit>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>

#include "sapiens_seg/error.hpp"
#include "zip_codec.hpp"

namespace sapiens_seg::core {
namespace {

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
  ArchiveDtype dtype = ArchiveDtype::kF32;   // kStorage
  std::shared_ptr<ArchiveTensor> tensor;     // kTensor
};

Ref make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

std::optional<ArchiveDtype> storage_dtype(const std::string& global) {
  static const std::map<std::string, ArchiveDtype> kTypes = {
      {"torch.FloatStorage", ArchiveDtype::kF32}, {"torch.DoubleStorage", ArchiveDtype::kF64},
      {"torch.HalfStorage", ArchiveDtype::kF16},  {"torch.BFloat16Storage", ArchiveDtype::kBF16},
      {"torch.LongStorage", ArchiveDtype::kI64},  {"torch.IntStorage", ArchiveDtype::kI32},
      {"torch.ShortStorage", ArchiveDtype::kI16}, {"torch.CharStorage", ArchiveDtype::kI8},
      {"torch.ByteStorage", ArchiveDtype::kU8},   {"torch.BoolStorage", ArchiveDtype::kBool},
  };
  auto it = kTypes.find(global);
  if (it == kTypes.end()) return std::nullopt;
  return it->second;
}

class Unpickler {
 public:
  Unpickler(const std::uint8_t* data, std::size_t size, const std::string& source)
      : p_(data), size_(size), source_(source) {}

  // Runs data.pkl to its STOP and returns the one object left on the stack.
  Ref run() {
    while (true) {
      const std::size_t at = pos_;
      const std::uint8_t op = byte();
      if (op == '.') {  // STOP
        if (stack_.size() != 1 || !marks_.empty()) fail("unbalanced stack at STOP", at);
        return stack_.back();
      }
      if (!scalar(op, at) && !container(op, at) && !memo_op(op, at) && !object(op, at)) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        fail(std::string("unsupported pickle opcode ") + hex, at);
      }
    }
  }

 private:
  // Each opcode group below returns false for an opcode that is not its own.

  // Framing, marks and the values that push themselves: None, bools, ints, floats, strings.
  bool scalar(std::uint8_t op, std::size_t at) {
    switch (op) {
      case 0x80:  // PROTO
        byte();
        return true;
      case 0x95:  // FRAME: a length hint only
        take(8);
        return true;
      case '(':  // MARK
        marks_.push_back(stack_.size());
        return true;
      case 'N':
        push(make(Value::Kind::kNone));
        return true;
      case 0x88:    // NEWTRUE
      case 0x89: {  // NEWFALSE
        auto v = make(Value::Kind::kBool);
        v->i = op == 0x88;
        push(v);
        return true;
      }
      case 'K':  // BININT1
        push_int(byte());
        return true;
      case 'M':  // BININT2
        push_int(u16(take(2)));
        return true;
      case 'J':  // BININT
        push_int(static_cast<std::int32_t>(u32(take(4))));
        return true;
      case 0x8a: {  // LONG1
        const std::size_t n = byte();
        if (n > 8) fail("integer wider than 64 bits", at);
        const std::uint8_t* b = take(n);
        std::uint64_t v = 0;
        for (std::size_t k = 0; k < n; ++k) v |= static_cast<std::uint64_t>(b[k]) << (8 * k);
        if (n > 0 && n < 8 && (b[n - 1] & 0x80)) v |= ~std::uint64_t{0} << (8 * n);
        push_int(static_cast<std::int64_t>(v));
        return true;
      }
      case 'G': {  // BINFLOAT, big-endian
        const std::uint8_t* b = take(8);
        std::uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | b[k];
        auto v = make(Value::Kind::kFloat);
        v->f = std::bit_cast<double>(bits);
        push(v);
        return true;
      }
      case 'X':  // BINUNICODE
      case 'B':  // BINBYTES
        push_str(u32(take(4)));
        return true;
      case 'T': {  // BINSTRING (signed length)
        const auto n = static_cast<std::int32_t>(u32(take(4)));
        if (n < 0) fail("negative string length", at);
        push_str(static_cast<std::uint64_t>(n));
        return true;
      }
      case 0x8c:  // SHORT_BINUNICODE
      case 'U':   // SHORT_BINSTRING
      case 'C':   // SHORT_BINBYTES
        push_str(byte());
        return true;
      case 0x8d:  // BINUNICODE8
      case 0x8e:  // BINBYTES8
        push_str(u64(take(8)));
        return true;
      default:
        return false;
    }
  }

  // Tuples, lists and dicts: made empty, from the stack, or filled in place.
  bool container(std::uint8_t op, std::size_t at) {
    switch (op) {
      case ')':
        push(make(Value::Kind::kTuple));
        return true;
      case ']':
        push(make(Value::Kind::kList));
        return true;
      case '}':
        push(make(Value::Kind::kDict));
        return true;
      case 't': {  // TUPLE
        auto v = make(Value::Kind::kTuple);
        v->items = pop_to_mark(at);
        push(v);
        return true;
      }
      case 'l': {  // LIST
        auto v = make(Value::Kind::kList);
        v->items = pop_to_mark(at);
        push(v);
        return true;
      }
      case 'd': {  // DICT
        auto v = make(Value::Kind::kDict);
        set_items(v, pop_to_mark(at), at);
        push(v);
        return true;
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
        return true;
      }
      case 'a': {  // APPEND
        Ref item = pop(at);
        Ref& list = top(at);
        if (list->kind != Value::Kind::kList) fail("APPEND to a non-list", at);
        list->items.push_back(std::move(item));
        return true;
      }
      case 'e': {  // APPENDS
        auto items = pop_to_mark(at);
        Ref& list = top(at);
        if (list->kind != Value::Kind::kList) fail("APPENDS to a non-list", at);
        for (auto& x : items) list->items.push_back(std::move(x));
        return true;
      }
      case 's': {  // SETITEM
        Ref value = pop(at), key = pop(at);
        Ref& dict = top(at);
        if (dict->kind != Value::Kind::kDict) fail("SETITEM on a non-dict", at);
        dict->entries.emplace_back(std::move(key), std::move(value));
        return true;
      }
      case 'u': {  // SETITEMS
        auto items = pop_to_mark(at);
        set_items(top(at), std::move(items), at);
        return true;
      }
      default:
        return false;
    }
  }

  // The memo: shared objects stored once and referred to again.
  bool memo_op(std::uint8_t op, std::size_t at) {
    switch (op) {
      case 'q':  // BINPUT
        memo_[byte()] = top(at);
        return true;
      case 'r':  // LONG_BINPUT
        memo_[u32(take(4))] = top(at);
        return true;
      case 0x94:  // MEMOIZE
        memo_[static_cast<std::uint32_t>(memo_.size())] = top(at);
        return true;
      case 'h':  // BINGET
        push(memo(byte(), at));
        return true;
      case 'j':  // LONG_BINGET
        push(memo(u32(take(4)), at));
        return true;
      default:
        return false;
    }
  }

  // Classes, objects and torch's storage references. Nothing is ever called: globals are names,
  // objects keep their class and state.
  bool object(std::uint8_t op, std::size_t at) {
    switch (op) {
      case 'c': {  // GLOBAL "module\nname\n"
        const std::string module = line(at), name = line(at);
        push(global(module, name));
        return true;
      }
      case 0x93: {  // STACK_GLOBAL
        Ref name = pop(at), module = pop(at);
        if (name->kind != Value::Kind::kStr || module->kind != Value::Kind::kStr) {
          fail("STACK_GLOBAL without strings", at);
        }
        push(global(module->s, name->s));
        return true;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
        Ref args = pop(at), cls = pop(at);
        if (cls->kind != Value::Kind::kGlobal) fail("NEWOBJ of a non-class", at);
        auto v = make(Value::Kind::kObject);
        v->cls = std::move(cls);
        push(v);
        return true;
      }
      case 'R': {  // REDUCE: callable(*args)
        Ref args = pop(at), fn = pop(at);
        if (fn->kind != Value::Kind::kGlobal || args->kind != Value::Kind::kTuple) {
          fail("REDUCE needs a global and a tuple", at);
        }
        push(reduce(fn->s, args->items, at));
        return true;
      }
      case 'b': {  // BUILD: obj.__setstate__(state)
        Ref state = pop(at);
        Ref& obj = top(at);
        if (obj->kind == Value::Kind::kObject) obj->state = std::move(state);
        return true;
      }
      case 'Q': {  // BINPERSID: torch's storage references
        Ref pid = pop(at);
        push(persistent(pid, at));
        return true;
      }
      default:
        return false;
    }
  }

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

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// a * b and a + b on non-negative 64-bit values, nullopt past int64's range.
std::optional<std::int64_t> mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
std::optional<std::int64_t> add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// DEFLATE cannot expand data by more than about 1032:1 (a 258-byte match per bit or two); a
// record declaring more is damaged or a decompression bomb, and is refused before anything is
// allocated for it.
constexpr std::uint64_t kMaxDeflateRatio = 1032;

// Where the zip's central directory lies and how many entries it has.
struct CentralDirectory {
  std::uint64_t entries = 0, size = 0, offset = 0;
};

CentralDirectory find_central_directory(const std::uint8_t* b, std::size_t size,
                                        const std::string& source) {
  if (size < 22 || std::memcmp(b, "PK\x03\x04", 4) != 0) {
    malformed(source, "no zip signature at the start");
  }
  // End of central directory: the last 22 bytes plus a comment of up to 64 KiB.
  std::size_t eocd = std::string::npos;
  const std::size_t lowest = size - 22 > 65535 ? size - 22 - 65535 : 0;
  for (std::size_t k = size - 22 + 1; k-- > lowest;) {
    if (std::memcmp(b + k, "PK\x05\x06", 4) == 0) {
      eocd = k;
      break;
    }
  }
  if (eocd == std::string::npos) {
    malformed(source, "truncated (no end-of-central-directory record)");
  }
  CentralDirectory cd{u16(b + eocd + 10), u32(b + eocd + 12), u32(b + eocd + 16)};
  if (cd.entries == 0xFFFF || cd.size == 0xFFFFFFFF || cd.offset == 0xFFFFFFFF) {
    // Zip64 (archives over 4 GiB, e.g. the 1B checkpoint): a locator precedes the record.
    if (eocd < 20 || std::memcmp(b + eocd - 20, "PK\x06\x07", 4) != 0) {
      malformed(source, "zip64 end-of-central-directory locator missing");
    }
    const std::uint64_t z = u64(b + eocd - 20 + 8);
    if (z > eocd - 20 || eocd - 20 - z < 56 || std::memcmp(b + z, "PK\x06\x06", 4) != 0) {
      malformed(source, "zip64 end-of-central-directory record missing");
    }
    cd.entries = u64(b + z + 32);
    cd.size = u64(b + z + 40);
    cd.offset = u64(b + z + 48);
  }
  if (cd.offset > size || cd.size > size - cd.offset || cd.offset + cd.size > eocd) {
    malformed(source, "central directory outside the file (truncated?)");
  }
  return cd;
}

// The zip64 extra field of an entry: 64-bit values for the fields saturated in the entry, in
// this order.
void read_zip64_extra(const std::uint8_t* x, std::size_t elen, const std::string& name,
                      std::uint64_t& usize, std::uint64_t& csize, std::uint64_t& lho,
                      const std::string& source) {
  for (std::size_t k = 0; k + 4 <= elen;) {
    const std::uint16_t id = u16(x + k), len = u16(x + k + 2);
    if (k + 4 + len > elen) break;
    if (id == 0x0001) {
      std::size_t q = k + 4;
      auto next = [&](std::uint64_t& field) {
        if (field != 0xFFFFFFFF) return;
        if (q + 8 > k + 4 + len) malformed(source, "zip64 field of '" + name + "' is short");
        field = u64(x + q);
        q += 8;
      };
      next(usize);
      next(csize);
      next(lho);
    }
    k += 4 + len;
  }
}

// Reads central-directory entry `e` at `pos` (and moves `pos` past it), checks its record against
// the archive (one top folder, stored or deflated, inside the file, sizes DEFLATE can produce)
// and adds it to `out`.
void add_record(const std::uint8_t* b, const CentralDirectory& cd, std::uint64_t e,
                std::size_t& pos, ArchiveLayout& out, const std::string& source) {
  const std::size_t cd_end = cd.offset + cd.size;
  if (cd_end - pos < 46 || std::memcmp(b + pos, "PK\x01\x02", 4) != 0) {
    malformed(source, "central directory entry " + std::to_string(e) + " is damaged");
  }
  const std::uint16_t flags = u16(b + pos + 8), method = u16(b + pos + 10);
  const std::uint32_t crc = u32(b + pos + 16);
  std::uint64_t csize = u32(b + pos + 20), usize = u32(b + pos + 24);
  const std::size_t nlen = u16(b + pos + 28), elen = u16(b + pos + 30), clen = u16(b + pos + 32);
  std::uint64_t lho = u32(b + pos + 42);
  if (cd_end - pos - 46 < nlen + elen + clen) {
    malformed(source, "central directory entry " + std::to_string(e) + " is cut short");
  }
  std::string name(reinterpret_cast<const char*>(b + pos + 46), nlen);
  read_zip64_extra(b + pos + 46 + nlen, elen, name, usize, csize, lho, source);
  pos += 46 + nlen + elen + clen;
  if (flags & 1) malformed(source, "record '" + name + "' is encrypted");
  if (method != 0 && method != 8) {
    malformed(source, "record '" + name + "' uses compression method " + std::to_string(method) +
                          " (only stored and deflated are read)");
  }
  const auto slash = name.find('/');
  if (slash == std::string::npos) malformed(source, "record '" + name + "' has no top folder");
  if (out.root.empty()) out.root = name.substr(0, slash);
  if (name.compare(0, slash, out.root) != 0 || slash != out.root.size()) {
    malformed(source, "record '" + name + "' is outside the archive folder " + out.root);
  }
  if (lho > cd.offset || cd.offset - lho < 30 || std::memcmp(b + lho, "PK\x03\x04", 4) != 0) {
    malformed(source, "local header of record '" + name + "' is missing");
  }
  const std::uint64_t data = lho + 30 + u16(b + lho + 26) + u16(b + lho + 28);
  if (data > cd.offset || csize > cd.offset - data) {
    malformed(source, "record '" + name + "' is truncated (" + std::to_string(csize) +
                          " bytes declared, " +
                          std::to_string(data > cd.offset ? 0 : cd.offset - data) +
                          " available before the directory)");
  }
  if (method == 0 && csize != usize) {
    malformed(source, "stored record '" + name + "' has differing sizes");
  }
  if (method == 8 && usize / kMaxDeflateRatio > csize + 1) {
    malformed(source, "deflated record '" + name + "' declares " + std::to_string(usize) +
                          " bytes from " + std::to_string(csize) +
                          " compressed bytes, more than DEFLATE can produce");
  }
  ArchiveRecord r{name.substr(slash + 1), method, flags, data, csize, usize, crc};
  if (out.by_name.count(r.name)) malformed(source, "record '" + name + "' appears twice");
  out.by_name[r.name] = out.records.size();
  out.records.push_back(std::move(r));
}

// A tensor's view must lie inside its storage, and its storage inside its record.
void check_tensor_view(const ArchiveTensor& t, const ArchiveLayout& layout,
                       const std::string& source) {
  const ArchiveRecord* r = layout.find("data/" + t.storage_key);
  const std::string what = "tensor '" + t.name + "'";
  if (!r) malformed(source, what + ": its storage record data/" + t.storage_key + " is missing");
  const std::size_t es = element_size(t.dtype);
  if (static_cast<std::uint64_t>(t.storage_numel) > r->uncompressed / es) {
    malformed(source, what + ": storage of " + std::to_string(t.storage_numel) + " " +
                          to_string(t.dtype) + " elements but a record of " +
                          std::to_string(r->uncompressed) + " bytes");
  }
  if (t.storage_offset > t.storage_numel) {
    malformed(source, what + ": storage offset " + std::to_string(t.storage_offset) +
                          " past its storage of " + std::to_string(t.storage_numel) + " elements");
  }
  // The highest element the view reaches must lie inside the storage.
  std::optional<std::int64_t> extent = t.storage_offset, numel = 1;
  for (std::size_t d = 0; d < t.sizes.size() && extent && numel; ++d) {
    numel = mul(*numel, t.sizes[d]);
    if (t.sizes[d] > 0) {
      const auto step = mul(t.sizes[d] - 1, t.strides[d]);
      extent = step ? add(*extent, *step) : std::nullopt;
    }
  }
  if (!extent || !numel) malformed(source, what + ": its sizes and strides overflow");
  if (*numel > 0 && *extent >= t.storage_numel) {
    malformed(source, what + " reaches past its storage (" + std::to_string(*extent + 1) + " > " +
                          std::to_string(t.storage_numel) + " elements)");
  }
}

}  // namespace

std::size_t element_size(ArchiveDtype dtype) noexcept {
  switch (dtype) {
    case ArchiveDtype::kF64:
    case ArchiveDtype::kI64:
      return 8;
    case ArchiveDtype::kF32:
    case ArchiveDtype::kI32:
      return 4;
    case ArchiveDtype::kF16:
    case ArchiveDtype::kBF16:
    case ArchiveDtype::kI16:
      return 2;
    case ArchiveDtype::kI8:
    case ArchiveDtype::kU8:
    case ArchiveDtype::kBool:
      return 1;
  }
  return 1;
}

const char* to_string(ArchiveDtype dtype) noexcept {
  switch (dtype) {
    case ArchiveDtype::kF64:
      return "Double";
    case ArchiveDtype::kF32:
      return "Float";
    case ArchiveDtype::kF16:
      return "Half";
    case ArchiveDtype::kBF16:
      return "BFloat16";
    case ArchiveDtype::kI64:
      return "Long";
    case ArchiveDtype::kI32:
      return "Int";
    case ArchiveDtype::kI16:
      return "Short";
    case ArchiveDtype::kI8:
      return "Char";
    case ArchiveDtype::kU8:
      return "Byte";
    case ArchiveDtype::kBool:
      return "Bool";
  }
  return "?";
}

const ArchiveRecord* ArchiveLayout::find(const std::string& name) const {
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : &records[it->second];
}

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

void check_record_crc(const ArchiveRecord& record, std::uint32_t computed,
                      const std::string& source) {
  if (!record.has_crc() || computed == record.crc32) return;
  throw Error(ErrorCode::kChecksumMismatch,
              "corrupt checkpoint " + source + ": record '" + record.name +
                  "' fails its CRC-32 check (the archive says " + hex32(record.crc32) +
                  ", its bytes give " + hex32(computed) +
                  "); the file was damaged after it was written (an interrupted or faulty copy "
                  "or download, or a failing disk): fetch it again");
}

void read_record(const std::uint8_t* data, const ArchiveRecord& r, std::uint8_t* out,
                 const std::string& source) {
  if (r.method == 0) {
    if (r.size > 0) std::memcpy(out, data + r.offset, r.size);
  } else {
    const std::string why = inflate_raw(data + r.offset, r.size, out, r.uncompressed);
    if (!why.empty()) malformed(source, "cannot inflate record '" + r.name + "': " + why);
  }
  check_record_crc(r, crc32(out, r.uncompressed), source);
}

std::string read_record(const std::uint8_t* data, const ArchiveRecord& r,
                        const std::string& source) {
  std::string s;
  try {
    s.assign(r.uncompressed, '\0');
  } catch (const std::exception&) {  // std::bad_alloc, std::length_error
    throw Error(ErrorCode::kOutOfMemory, "out of memory: cannot allocate " +
                                             std::to_string(r.uncompressed) +
                                             " bytes to read record '" + r.name + "' of " + source);
  }
  read_record(data, r, reinterpret_cast<std::uint8_t*>(s.data()), source);
  return s;
}

ArchiveLayout parse_torchscript_archive(const std::uint8_t* b, std::size_t size,
                                        const std::string& source) {
  const CentralDirectory cd = find_central_directory(b, size, source);
  ArchiveLayout out;
  std::size_t pos = cd.offset;
  for (std::uint64_t e = 0; e < cd.entries; ++e) add_record(b, cd, e, pos, out, source);

  if (const auto* bo = out.find("byteorder")) {
    if (bo->uncompressed > 64) malformed(source, "the byteorder record is too long");
    const std::string order = read_record(b, *bo, source);
    if (order != "little") {
      malformed(source, "tensors are stored " + order + "-endian; only little-endian is read");
    }
  }
  const ArchiveRecord* pkl_record = out.find("data.pkl");
  if (!pkl_record) malformed(source, "no data.pkl record (not a TorchScript module)");
  const std::string pkl = read_record(b, *pkl_record, source);
  PickledModule tree =
      unpickle_module_tree(reinterpret_cast<const std::uint8_t*>(pkl.data()), pkl.size(), source);
  for (const auto& t : tree.tensors) check_tensor_view(t, out, source);
  out.tensors = std::move(tree.tensors);
  out.module_classes = std::move(tree.module_classes);
  return out;
}

}  // namespace sapiens_seg::core
