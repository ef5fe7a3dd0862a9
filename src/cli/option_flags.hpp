// The library's option table (names.hpp) as command-line flags: every subcommand that loads a
// model (`segment`, `serve`) takes the same flags, with the names and defaults the Python binding,
// the Ray driver and the server take, because all of them are made from the same rows.
#pragma once

#include <initializer_list>
#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include "sapiens_seg/names.hpp"
#include "sapiens_seg/options.hpp"

namespace sapiens_seg::cli {

// What the flags were given, by option name; rows left out keep the library's default.
struct OptionValues {
  std::map<std::string, std::string> text;  // choice, text and integer rows
  std::map<std::string, bool> flags;        // boolean rows (a flag sets true)
};

// One flag per row of `groups`: "--" + the name with dashes ("--accept-noncommercial"), choices
// checked against the table, integers against its range, the default shown in --help.
// "batch_size" is also "--batch". `values` must outlive the parse.
void add_option_flags(CLI::App& app, std::initializer_list<OptionGroup> groups,
                      OptionValues& values);

// The given values applied to the library's defaults (set_option, row by row).
LoadOptions load_options(const OptionValues& values);
SegmentOptions segment_options(const OptionValues& values);
RunOptions run_options(const OptionValues& values);

// "accept_noncommercial" -> "--accept-noncommercial".
std::string flag_name(const std::string& option);

}  // namespace sapiens_seg::cli
