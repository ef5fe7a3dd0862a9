// File paths in the CLI's JSON (stdout lines and summary.json). Paths are bytes; JSON text is
// UTF-8. A path that is valid UTF-8 is written as it is. Any other path is written as text with
// each byte that is not part of a valid UTF-8 sequence shown as the four characters \xNN (for
// people), and next to it, under the same key plus "_hex", the path's exact bytes in lowercase
// hexadecimal (for programs: bytes.fromhex(entry["input_hex"]) in Python). So every path is
// recoverable, and no file name can make the JSON invalid or stop a run.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace sapiens_seg::cli {

bool is_valid_utf8(std::string_view s) noexcept;

// Valid UTF-8 unchanged; every other byte as \xNN (uppercase hex digits).
std::string display_text(std::string_view s);

// For plain (non-JSON) stdout and stderr lines: display_text, and also every control character
// (C0, DEL, C1) and the Unicode line separators and bidirectional overrides as \xNN of their
// UTF-8 bytes, so that one name is one line and no escape sequence reaches a terminal. With
// `keep_newlines`, '\n' is kept (messages that are several lines by design).
std::string plain_text(std::string_view s, bool keep_newlines = false);

// Sets obj[key] to the path (display_text) and, when it is not valid UTF-8, obj[key + "_hex"]
// to its bytes in hex.
void put_path(nlohmann::json& obj, const std::string& key, const std::string& path);

// The exact bytes of a path written by put_path (from "_hex" when present); "" when absent.
std::string get_path(const nlohmann::json& obj, const std::string& key);

// dump() that cannot throw: strings are expected to be valid UTF-8 already (put_path,
// display_text); anything that is not is replaced by U+FFFD rather than stopping the run.
std::string dump_json(const nlohmann::json& j, int indent = -1);

}  // namespace sapiens_seg::cli
