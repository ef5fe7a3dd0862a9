// Every environment variable the library reads, with what it means, its default and when it is
// read: the same table as docs/configuration.md (a test holds the two equal).
//
//   for (const auto& v : sapiens_seg::environment_variables()) std::cout << v.name << "\n";
#pragma once

#include <string>
#include <vector>

#include "sapiens_seg/export.hpp"

namespace sapiens_seg {

struct EnvironmentVariable {
  std::string name;           // "SAPIENS_SEG_HOME"
  std::string meaning;        // what it changes
  std::string default_value;  // what holds when it is unset
  // When the library reads it: "each call" (anew by every call that needs it, so a change is
  // seen by the next call), "once per process" (the first time it is needed, then kept), or
  // a sentence where it is neither.
  std::string read;
};

// In the order of docs/configuration.md: weights and cards, downloads, the log, the CPU.
SAPIENS_SEG_API std::vector<EnvironmentVariable> environment_variables();

}  // namespace sapiens_seg
