// How options and error codes are spelled in text (command lines, Python arguments, JSON): one
// table that the CLI, the Python binding and the benchmarks all read, so a name is written once.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sapiens_seg/error.hpp"
#include "sapiens_seg/export.hpp"
#include "sapiens_seg/options.hpp"

namespace sapiens_seg {

// "auto", "portable", "kernels", "original".
SAPIENS_SEG_API std::string_view to_string(Mode m) noexcept;
// "default", "float32", "float16", "bfloat16".
SAPIENS_SEG_API std::string_view to_string(DType d) noexcept;
// "demo", "training".
SAPIENS_SEG_API std::string_view to_string(Normalization n) noexcept;
// "auto", "host", "device".
SAPIENS_SEG_API std::string_view to_string(Pipeline p) noexcept;
// "wheel", "opencv".
SAPIENS_SEG_API std::string_view to_string(CubicResize c) noexcept;

// Every value's name, in the order of the enum (the first is the default).
SAPIENS_SEG_API std::vector<std::string> mode_names();
SAPIENS_SEG_API std::vector<std::string> dtype_names();
SAPIENS_SEG_API std::vector<std::string> normalization_names();
SAPIENS_SEG_API std::vector<std::string> pipeline_names();
SAPIENS_SEG_API std::vector<std::string> cubic_names();

// The value of a name as to_string() spells it; an Error (kInvalidInput) that lists the names
// otherwise.
SAPIENS_SEG_API Mode parse_mode(std::string_view name);
SAPIENS_SEG_API DType parse_dtype(std::string_view name);
SAPIENS_SEG_API Normalization parse_normalization(std::string_view name);
SAPIENS_SEG_API Pipeline parse_pipeline(std::string_view name);
SAPIENS_SEG_API CubicResize parse_cubic(std::string_view name);

// ---- every option as text ------------------------------------------------------------------
// One row per field of LoadOptions (FetchOptions::use_hf_token included; its callbacks are not
// text), SegmentOptions and RunOptions. The CLI makes its flags from these rows, the Python
// binding its keyword arguments, the Ray driver and the server theirs, so an option has one
// name and one default everywhere.

enum class OptionGroup { kLoad, kSegment, kRun };
enum class OptionType { kChoice, kText, kInt, kBool };

struct OptionSpec {
  std::string name;  // as Python and JSON spell it ("accept_noncommercial"); the command line
                     // spells it with dashes ("--accept-noncommercial")
  OptionGroup group = OptionGroup::kLoad;
  OptionType type = OptionType::kText;
  std::string default_value;               // as text: "auto", "0", "false"
  std::vector<std::string> choices;        // kChoice: every accepted value, the default first
  long long min_value = 0, max_value = 0;  // kInt: the accepted range
  std::string help;                        // one line, for --help and docstrings
};

SAPIENS_SEG_API const std::vector<OptionSpec>& option_specs();
// The rows of one group, in the table's order.
SAPIENS_SEG_API std::vector<OptionSpec> option_specs(OptionGroup group);

// The model the command-line tools load when none is named.
SAPIENS_SEG_API std::string_view default_model() noexcept;

// Sets the option `name` from its text: a choice by name, an integer in decimal, a boolean as
// "true"/"false" (also "1"/"0"). Error(kInvalidInput) naming the option and what it takes for a
// bad value or a name that is not an option of that struct.
SAPIENS_SEG_API void set_option(LoadOptions& options, std::string_view name,
                                std::string_view value);
SAPIENS_SEG_API void set_option(SegmentOptions& options, std::string_view name,
                                std::string_view value);
SAPIENS_SEG_API void set_option(RunOptions& options, std::string_view name, std::string_view value);
// The option's value as set_option() takes it.
SAPIENS_SEG_API std::string get_option(const LoadOptions& options, std::string_view name);
SAPIENS_SEG_API std::string get_option(const SegmentOptions& options, std::string_view name);
SAPIENS_SEG_API std::string get_option(const RunOptions& options, std::string_view name);

// Every error code, in the order of the enum.
SAPIENS_SEG_API std::vector<ErrorCode> error_codes();

// The exit status of the command-line tools for a failure of this code: 10 + the code (11 for
// not_found ... 21 for out_of_memory), so a script can branch on it.
SAPIENS_SEG_API int exit_status(ErrorCode code) noexcept;

}  // namespace sapiens_seg
