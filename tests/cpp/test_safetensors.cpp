// Unit tests of the safetensors reader: files built byte by byte here (so every refusal can be
// provoked), and one file written by the real `safetensors` Python package as a cross-check.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <sys/wait.h>

#include <ATen/ATen.h>

#include "core/checkpoint/safetensors.hpp"
#include "sapiens_seg/error.hpp"
#include "test_util.hpp"

using namespace sapiens_seg;
using core::SafetensorsFile;

using sapiens_seg::test::expect_error;

namespace {

using Bytes = std::vector<std::uint8_t>;

// 8-byte little-endian length, the header text, then the data section.
Bytes make_file(const std::string& header, const Bytes& data = {}) {
  Bytes out;
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out.push_back(static_cast<std::uint8_t>(n & 0xff));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

template <typename T>
void append(Bytes& b, std::initializer_list<T> values) {
  for (const T v : values) {
    const std::size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
  }
}

std::string write_temp(const std::string& name, const Bytes& bytes) {
  std::string path = ::testing::TempDir() + "st_" + name;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  return path;
}

SafetensorsFile from_bytes(const Bytes& bytes, const std::string& source = "mem.safetensors") {
  return SafetensorsFile::from_buffer(std::make_shared<const Bytes>(bytes), source);
}

bool points_into(const at::Tensor& t, const SafetensorsFile& f) {
  const auto* p = static_cast<const std::uint8_t*>(t.data_ptr());
  return p >= f.data() && p < f.data() + f.size();
}

}  // namespace

TEST(UnitSafetensors, ReadsEveryDtypeAndMetadata) {
  Bytes data;
  append<double>(data, {1.5, -2.25});           // F64 [2]       0..16
  append<float>(data, {0, 1, 2, 3, 4, 5});      // F32 [2,3]     16..40
  append<std::int64_t>(data, {-7, 1LL << 40});  // I64 [2]       40..56
  append<std::int32_t>(data, {-3, 70000});      // I32 [2]       56..64
  append<std::int16_t>(data, {-300, 300});      // I16 [2]       64..68
  append<std::int8_t>(data, {-100, 100});       // I8 [2]        68..70
  append<std::uint8_t>(data, {200, 7});         // U8 [2]        70..72
  append<std::uint8_t>(data, {1, 0, 1});        // BOOL [3]      72..75
  const std::string header =
      R"({"__metadata__":{"format":"pt","note":"héllo"},)"
      R"("d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
      R"("f":{"dtype":"F32","shape":[2,3],"data_offsets":[16,40]},)"
      R"("l":{"dtype":"I64","shape":[2],"data_offsets":[40,56]},)"
      R"("i":{"dtype":"I32","shape":[2],"data_offsets":[56,64]},)"
      R"("s":{"dtype":"I16","shape":[2],"data_offsets":[64,68]},)"
      R"("c":{"dtype":"I8","shape":[2],"data_offsets":[68,70]},)"
      R"("b":{"dtype":"U8","shape":[2],"data_offsets":[70,72]},)"
      R"("m":{"dtype":"BOOL","shape":[3],"data_offsets":[72,75],"extra":"ignored"}})";
  const auto path = write_temp("dtypes.safetensors", make_file(header, data));
  const auto f = SafetensorsFile::open(path);

  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "héllo");
  ASSERT_EQ(f.tensors().size(), 8u);
  EXPECT_EQ(f.tensors().front().name, "d");  // ordered by position in the data section
  EXPECT_EQ(f.tensors().back().name, "m");
  EXPECT_EQ(f.info("f").shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(f.info("f").begin, 16u);
  EXPECT_EQ(f.info("f").end, 40u);

  EXPECT_TRUE(f.tensor("d").equal(at::tensor({1.5, -2.25}, at::kDouble)));
  EXPECT_TRUE(f.tensor("f").equal(at::arange(6, at::kFloat).reshape({2, 3})));
  EXPECT_TRUE(
      f.tensor("l").equal(at::tensor({std::int64_t{-7}, std::int64_t{1} << 40}, at::kLong)));
  EXPECT_TRUE(f.tensor("i").equal(at::tensor({-3, 70000}, at::kInt)));
  EXPECT_TRUE(f.tensor("s").equal(at::tensor({-300, 300}, at::kShort)));
  EXPECT_TRUE(f.tensor("c").equal(at::tensor({-100, 100}, at::kChar)));
  EXPECT_TRUE(f.tensor("b").equal(at::tensor({200, 7}, at::kByte)));
  EXPECT_TRUE(f.tensor("m").equal(at::tensor({1, 0, 1}, at::kByte).to(at::kBool)));
  const auto all = f.all();
  EXPECT_EQ(all.size(), 8u);
  EXPECT_TRUE(all.at("f").equal(f.tensor("f")));
}

TEST(UnitSafetensors, AlignedTensorsAreViewsThatKeepTheMappingAlive) {
  Bytes data;
  append<float>(data, {1, 2, 3, 4});
  // Header padded with spaces to 8 bytes, as the reference writer does, so data starts aligned.
  std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  const auto path = write_temp("view.safetensors", make_file(header, data));
  at::Tensor t;
  {
    const auto f = SafetensorsFile::open(path);
    t = f.tensor("w");
    EXPECT_TRUE(points_into(t, f)) << "expected a zero-copy view";
    EXPECT_TRUE(t.is_contiguous());
  }
  // The file object is gone; the view still holds the mapping.
  EXPECT_TRUE(t.equal(at::tensor({1.f, 2.f, 3.f, 4.f})));
  EXPECT_TRUE(t.add(1).equal(at::tensor({2.f, 3.f, 4.f, 5.f})));
}

TEST(UnitSafetensors, MisalignedTensorsAreCopied) {
  Bytes data{9};                    // U8 [1] at 0..1
  append<float>(data, {-1.5f, 8});  // F32 [2] at 1..9: misaligned for float
  std::string header = R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("w":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  const auto f =
      SafetensorsFile::open(write_temp("misaligned.safetensors", make_file(header, data)));
  const at::Tensor w = f.tensor("w");
  EXPECT_FALSE(points_into(w, f)) << "a misaligned float must be copied";
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(w.data_ptr()) % alignof(float), 0u);
  EXPECT_TRUE(w.equal(at::tensor({-1.5f, 8.f})));
  EXPECT_TRUE(points_into(f.tensor("u"), f));  // bytes are always aligned
  EXPECT_EQ(f.tensor("u").item<std::uint8_t>(), 9);
}

TEST(UnitSafetensors, ConvertsHalfAndBfloat16ToFloat) {
  Bytes data;
  // BF16 1.0, -2.5, 0.1015625, 3.0 and F16 1.0, -2.0, 0.5, 65504 (bit patterns by hand).
  append<std::uint16_t>(data, {0x3F80, 0xC020, 0x3DD0, 0x4040});
  append<std::uint16_t>(data, {0x3C00, 0xC000, 0x3800, 0x7BFF});
  append<float>(data, {0.25f, 1e-3f});
  append<std::int64_t>(data, {5});
  const std::string header = R"({"bf":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},)"
                             R"("h":{"dtype":"F16","shape":[2,2],"data_offsets":[8,16]},)"
                             R"("f":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
                             R"("n":{"dtype":"I64","shape":[1],"data_offsets":[24,32]}})";
  const auto f = from_bytes(make_file(header, data));
  EXPECT_EQ(f.tensor("bf").scalar_type(), at::kBFloat16);
  EXPECT_EQ(f.tensor("h").scalar_type(), at::kHalf);

  const at::Tensor bf = f.tensor_as("bf", at::kFloat);
  EXPECT_EQ(bf.scalar_type(), at::kFloat);
  EXPECT_TRUE(bf.equal(at::tensor({1.f, -2.5f, 0.1015625f, 3.f})));
  const at::Tensor h = f.tensor_as("h", at::kFloat);
  EXPECT_TRUE(h.equal(at::tensor({1.f, -2.f, 0.5f, 65504.f}).reshape({2, 2})));
  EXPECT_TRUE(f.tensor_as("f", at::kBFloat16).equal(at::tensor({0.25f, 1e-3f}).to(at::kBFloat16)));
  EXPECT_TRUE(f.tensor_as("bf", at::kHalf).equal(bf.to(at::kHalf)));
  EXPECT_TRUE(f.tensor_as("f", at::kFloat).equal(f.tensor("f")));

  expect_error([&] { f.tensor_as("n", at::kFloat); }, ErrorCode::kFormatError,
               {"mem.safetensors", "'n'", "I64", "not a floating dtype"});
  expect_error([&] { f.tensor_as("bf", at::kDouble); }, ErrorCode::kInvalidInput,
               {"only float32, bfloat16 and float16"});
}

TEST(UnitSafetensors, EmptyScalarAndNoTensors) {
  Bytes data;
  append<float>(data, {42.f});
  const std::string header = R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                             R"("e2":{"dtype":"I64","shape":[3,0,2],"data_offsets":[0,0]}})";
  const auto f = from_bytes(make_file(header, data));
  const at::Tensor s = f.tensor("s");
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<float>(), 42.f);
  EXPECT_EQ(f.info("s").numel, 1);
  const at::Tensor e = f.tensor("e");
  EXPECT_EQ(e.sizes(), at::IntArrayRef({0}));
  EXPECT_EQ(f.tensor("e2").sizes(), at::IntArrayRef({3, 0, 2}));
  EXPECT_EQ(f.info("e2").numel, 0);

  // No tensors at all, with and without metadata, with the space padding of the writer.
  const auto none = from_bytes(make_file("{}      "));
  EXPECT_TRUE(none.tensors().empty());
  EXPECT_TRUE(none.metadata().empty());
  EXPECT_TRUE(none.all().empty());
  const auto meta_only = SafetensorsFile::open(
      write_temp("meta_only.safetensors", make_file(R"({"__metadata__":{"a":"b"}})")));
  EXPECT_TRUE(meta_only.tensors().empty());
  EXPECT_EQ(meta_only.metadata().at("a"), "b");
}

TEST(UnitSafetensors, GapsBetweenTensorsAreAccepted) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})";
  const auto f = from_bytes(make_file(header, {1, 2, 0, 0, 3, 4, 0, 0}));
  EXPECT_TRUE(f.tensor("b").equal(at::tensor({3, 4}, at::kByte)));
}

TEST(UnitSafetensors, MissingFilesAndNames) {
  expect_error([] { SafetensorsFile::open(::testing::TempDir() + "st_does_not_exist"); },
               ErrorCode::kNotFound, {"st_does_not_exist"});
  expect_error([] { SafetensorsFile::open(::testing::TempDir()); }, ErrorCode::kInvalidInput,
               {"is a directory, not a regular file"});
  const auto f = from_bytes(make_file("{}"));
  EXPECT_FALSE(f.contains("x"));
  expect_error([&] { f.tensor("x"); }, ErrorCode::kFormatError,
               {"mem.safetensors", "no tensor 'x'"});
}

TEST(UnitSafetensors, BoolBytesMustBeZeroOrOne) {
  const auto f =
      from_bytes(make_file(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", {1, 2}));
  expect_error([&] { f.tensor("m"); }, ErrorCode::kFormatError, {"'m'", "neither 0 nor 1"});
}

// Every malformed input gets kFormatError and its own message naming the file (and the tensor).
TEST(UnitSafetensors, RefusesMalformedFiles) {
  struct Case {
    const char* what;
    Bytes bytes;
    std::vector<std::string> parts;
  };
  const auto entry = [](const std::string& body) { return "{\"w\":" + body + "}"; };
  const auto ok_f32 = [&](const std::string& shape, const std::string& offsets) {
    return entry(R"({"dtype":"F32","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}");
  };
  Bytes huge_len = make_file("{}");
  huge_len[0] = 0xe8, huge_len[1] = 0x03;  // 1000
  Bytes absurd = make_file("{}");
  append<std::uint8_t>(absurd, {0});
  absurd[0] = 0x01, absurd[1] = 0xe1, absurd[2] = 0xf5, absurd[3] = 0x05;  // 100'000'001
  const std::vector<Case> cases = {
      {"short file", {1, 0, 0}, {"3 bytes, shorter than the 8-byte header length"}},
      {"empty file", {}, {"0 bytes, shorter than"}},
      {"header past end",
       huge_len,
       {"header length 1000 runs past the end of the file (10 bytes)"}},
      {"absurd header", absurd, {"header length 100000001 is absurdly large"}},
      {"not json", make_file("{\"w\": nope}"), {"header is not valid JSON"}},
      {"trailing garbage", make_file("{} x"), {"header is not valid JSON"}},
      {"invalid utf-8", make_file("{\"\xff\xfe\":{}}"), {"header is not valid JSON"}},
      {"truncated utf-8", make_file("{\"\xc3\":{}}"), {"header is not valid JSON"}},
      {"not an object", make_file("[1,2]"), {"the header is not a JSON object"}},
      {"too deep", make_file(R"({"w":{"shape":[[1]]}})"), {"nested too deeply"}},
      {"entry not object", make_file(entry("[1]")), {"tensor 'w': entry is not a JSON object"}},
      {"no dtype", make_file(entry(R"({"shape":[],"data_offsets":[0,0]})")), {"'w': no \"dtype\""}},
      {"dtype not string",
       make_file(entry(R"({"dtype":5,"shape":[],"data_offsets":[0,0]})")),
       {"'w': \"dtype\" is not a string"}},
      {"unknown dtype",
       make_file(entry(R"({"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]})"), {0}),
       {"'w': unsupported dtype 'F8_E4M3'"}},
      {"lower-case dtype",
       make_file(entry(R"({"dtype":"f32","shape":[],"data_offsets":[0,4]})")),
       {"unsupported dtype 'f32'"}},
      {"no shape",
       make_file(entry(R"({"dtype":"F32","data_offsets":[0,4]})")),
       {"'w': no \"shape\""}},
      {"shape not array", make_file(ok_f32("3", "[0,12]")), {"'w': \"shape\" is not an array"}},
      {"negative dim", make_file(ok_f32("[2,-1]", "[0,0]")), {"'w': \"shape\" holds -1, not a"}},
      {"float dim", make_file(ok_f32("[2.5]", "[0,10]")), {"'w': \"shape\" holds 2.5, not a"}},
      {"string dim", make_file(ok_f32("[\"2\"]", "[0,8]")), {"\"shape\" holds a string"}},
      {"dim too large",
       make_file(ok_f32("[9223372036854775808]", "[0,0]")),
       {"shape dimension 9223372036854775808 is too large"}},
      {"shape overflow",
       make_file(ok_f32("[4294967296,4294967296]", "[0,0]")),
       {"'w': the product of the shape overflows 64 bits"}},
      {"byte overflow",
       make_file(ok_f32("[4611686018427387904]", "[0,0]")),
       {"'w': the byte size of the shape overflows 64 bits"}},
      {"no offsets",
       make_file(entry(R"({"dtype":"F32","shape":[]})")),
       {"'w': no \"data_offsets\""}},
      {"one offset", make_file(ok_f32("[]", "[4]")), {"'w': \"data_offsets\" is not two"}},
      {"three offsets", make_file(ok_f32("[]", "[0,4,8]")), {"\"data_offsets\" is not two"}},
      {"negative offset", make_file(ok_f32("[]", "[-4,0]")), {"\"data_offsets\" is not two"}},
      {"string offset", make_file(ok_f32("[]", "[\"0\",4]")), {"\"data_offsets\" is not two"}},
      {"offsets not array", make_file(ok_f32("[]", "{}")), {"\"data_offsets\" is not two"}},
      {"begin after end",
       make_file(ok_f32("[0]", "[8,4]"), Bytes(8)),
       {"'w': data_offsets begin 8 is after its end 4"}},
      {"byte count",
       make_file(ok_f32("[3]", "[0,8]"), Bytes(12)),
       {"'w': data_offsets span 8 bytes but F32 of this shape needs 12"}},
      {"past data end",
       make_file(ok_f32("[3]", "[0,12]"), Bytes(11)),
       {"'w': data_offsets end 12 is past the end of the data section (11 bytes)"}},
      {"overlap",
       make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[3,7]}})",
                 Bytes(7)),
       {"tensors 'a' and 'b' overlap in the data section"}},
      {"same range",
       make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})",
                 Bytes(4)),
       {"overlap in the data section"}},
      {"duplicate name",
       make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                 R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                 Bytes(2)),
       {"duplicate tensor name 'a' in the header"}},
      {"duplicate field",
       make_file(entry(R"({"dtype":"U8","dtype":"F32","shape":[],"data_offsets":[0,4]})"),
                 Bytes(4)),
       {"duplicate key 'dtype' in a header entry"}},
      {"metadata not object",
       make_file(R"({"__metadata__":["x"]})"),
       {"\"__metadata__\" is not a JSON object"}},
      {"metadata not string",
       make_file(R"({"__metadata__":{"k":1}})"),
       {"metadata 'k' is not a string"}},
  };
  // nlohmann quotes the bytes it read; the message must not pass invalid UTF-8 on.
  try {
    from_bytes(make_file("{\"\xff\xfe\":{}}"));
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const char ch : std::string(e.what())) EXPECT_LT(static_cast<unsigned char>(ch), 0x80);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<std::string> parts = c.parts;
    expect_error([&] { from_bytes(c.bytes, "bad.safetensors"); }, ErrorCode::kFormatError,
                 {"bad.safetensors: malformed safetensors file: ", parts.front()});
  }
  // Through the file path too (mmap), including the files too short to map.
  expect_error([] { SafetensorsFile::open(write_temp("empty", {})); }, ErrorCode::kFormatError,
               {"st_empty", "shorter than the 8-byte header length"});
  expect_error(
      [] {
        SafetensorsFile::open(
            write_temp("dup", make_file(R"({"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]},)"
                                        R"("a":{"dtype":"U8","shape":[],"data_offsets":[1,2]}})",
                                        Bytes(2))));
      },
      ErrorCode::kFormatError, {"st_dup", "duplicate tensor name 'a'"});
}

// A file written by the reference implementation (the `safetensors` package pinned in
// tools/setup.sh), read back here: names, dtypes, values, metadata, and zero-copy views thanks to
// the writer's 8-byte header padding.
TEST(UnitSafetensors, ReadsFilesWrittenByTheSafetensorsPackage) {
  const char* py = std::getenv("SAPIENS_SEG_PYTHON");
  if (py == nullptr || *py == '\0') GTEST_SKIP() << "SAPIENS_SEG_PYTHON is not set";
  const std::string dir = ::testing::TempDir();
  const std::string script = dir + "st_write.py";
  const std::string out = dir + "st_python.safetensors";
  std::ofstream(script) << R"(import sys
try:
    import torch
    from safetensors.torch import save_file
except ImportError as e:
    print(e)
    sys.exit(3)
t = {
    "backbone.rope_embed.periods": torch.tensor([1.0, 1.3359375, 1.78125, 2.375], dtype=torch.bfloat16),
    "w32": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4,
    "h": torch.tensor([1.0, -2.0, 0.5, 65504.0], dtype=torch.float16),
    "i": torch.tensor([-(2**40), 3], dtype=torch.int64),
    "u": torch.tensor([255, 0, 7], dtype=torch.uint8),
    "m": torch.tensor([True, False]),
    "scalar": torch.tensor(2.5, dtype=torch.float64),
    "empty": torch.zeros(0, 4, dtype=torch.float32),
}
save_file(t, sys.argv[1], metadata={"format": "pt", "k": "v"})
)";
  const int rc = std::system(("'" + std::string(py) + "' '" + script + "' '" + out + "'").c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
    GTEST_SKIP() << "the safetensors package is not installed for " << py
                 << " (tools/setup.sh pins it)";
  }
  ASSERT_EQ(rc, 0) << "writing " << out << " with " << py << " failed";

  const auto f = SafetensorsFile::open(out);
  EXPECT_EQ(f.tensors().size(), 8u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("k"), "v");
  const at::Tensor periods = f.tensor("backbone.rope_embed.periods");
  EXPECT_EQ(periods.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(f.tensor_as("backbone.rope_embed.periods", at::kFloat)
                  .equal(at::tensor({1.0f, 1.3359375f, 1.78125f, 2.375f})));
  EXPECT_TRUE(f.tensor("w32").equal(at::arange(6, at::kFloat).reshape({2, 3}) / 4));
  EXPECT_TRUE(f.tensor_as("h", at::kFloat).equal(at::tensor({1.f, -2.f, 0.5f, 65504.f})));
  EXPECT_TRUE(
      f.tensor("i").equal(at::tensor({-(std::int64_t{1} << 40), std::int64_t{3}}, at::kLong)));
  EXPECT_TRUE(f.tensor("u").equal(at::tensor({255, 0, 7}, at::kByte)));
  EXPECT_TRUE(f.tensor("m").equal(at::tensor({1, 0}, at::kByte).to(at::kBool)));
  EXPECT_EQ(f.tensor("scalar").dim(), 0);
  EXPECT_EQ(f.tensor("scalar").item<double>(), 2.5);
  EXPECT_EQ(f.tensor("empty").sizes(), at::IntArrayRef({0, 4}));
  for (const char* name : {"w32", "h", "i", "u", "scalar", "backbone.rope_embed.periods"}) {
    EXPECT_TRUE(points_into(f.tensor(name), f)) << name << " should be a zero-copy view";
  }
}
