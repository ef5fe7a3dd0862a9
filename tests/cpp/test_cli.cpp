// Pieces of the CLI: how paths that are not UTF-8 are written into JSON.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "cli/json_paths.hpp"

using namespace sapiens_seg::cli;

TEST(UnitCliJson, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("plain/ascii.png"));
  EXPECT_TRUE(is_valid_utf8("caf\xC3\xA9.png"));                // é
  EXPECT_TRUE(is_valid_utf8("\xE2\x82\xAC \xF0\x9F\x98\x80"));  // € and an emoji
  EXPECT_FALSE(is_valid_utf8("caf\xE9.png"));                   // Latin-1 é
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));                      // overlong '/'
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));                  // a UTF-16 surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));              // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xE2\x82"));                      // cut short
}

TEST(UnitCliJson, DisplayTextEscapesOnlyInvalidBytes) {
  EXPECT_EQ(display_text("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(display_text("caf\xE9.png"), "caf\\xE9.png");
  EXPECT_EQ(display_text("\xFF\xC3\xA9\xC3"), "\\xFF\xC3\xA9\\xC3");
}

TEST(UnitCliJson, PathsRoundTripThroughJsonText) {
  std::mt19937 rng(5);
  std::vector<std::string> paths = {"out/a.png", "out/caf\xE9.png", "d\\xE9.png", "\xFF",
                                    std::string("nul\0inside", 10)};
  for (int c = 0; c < 256; ++c) paths.push_back("x" + std::string(1, static_cast<char>(c)));
  for (int i = 0; i < 500; ++i) {
    std::string p(rng() % 40, '\0');
    for (auto& ch : p) ch = static_cast<char>(rng() % 256);
    paths.push_back(p);
  }
  for (const auto& p : paths) {
    nlohmann::json entry = nlohmann::json::object();
    put_path(entry, "input", p);
    EXPECT_EQ(entry.contains("input_hex"), !is_valid_utf8(p));
    const std::string text = entry.dump();  // throws on invalid UTF-8: it must not
    EXPECT_EQ(get_path(nlohmann::json::parse(text), "input"), p);
  }
  // A name that is valid UTF-8 but looks like an escape is kept as it is.
  nlohmann::json e = nlohmann::json::object();
  put_path(e, "input", "d\\xE9.png");
  EXPECT_EQ(e["input"], "d\\xE9.png");
  EXPECT_FALSE(e.contains("input_hex"));
}

TEST(UnitCliJson, DumpNeverThrows) {
  const nlohmann::json j = {{"bad", std::string("\xE9")}};
  EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);
  EXPECT_EQ(dump_json(j), "{\"bad\":\"\xEF\xBF\xBD\"}");
}
