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

// Every error code, in the order of the enum.
SAPIENS_SEG_API std::vector<ErrorCode> error_codes();

// The exit status of the command-line tools for a failure of this code: 10 + the code (11 for
// not_found ... 21 for out_of_memory), so a script can branch on it.
SAPIENS_SEG_API int exit_status(ErrorCode code) noexcept;

}  // namespace sapiens_seg
