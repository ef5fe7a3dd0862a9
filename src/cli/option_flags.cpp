#include "cli/option_flags.hpp"

#include <algorithm>

namespace sapiens_seg::cli {

std::string flag_name(const std::string& option) {
  std::string out = "--" + option;
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

void add_option_flags(CLI::App& app, std::initializer_list<OptionGroup> groups,
                      OptionValues& values) {
  for (const OptionGroup group : groups) {
    for (const OptionSpec& spec : option_specs(group)) {
      std::string names = flag_name(spec.name);
      if (spec.name == "batch_size") names += ",--batch";
      if (spec.type == OptionType::kBool) {
        bool& flag = values.flags[spec.name];
        flag = spec.default_value == "true";
        app.add_flag(names, flag, spec.help);
        continue;
      }
      std::string& text = values.text[spec.name];
      text = spec.default_value;
      CLI::Option* opt = app.add_option(names, text, spec.help);
      opt->type_name(spec.type == OptionType::kInt ? "INT" : "TEXT");
      if (!spec.default_value.empty()) opt->capture_default_str();
      if (spec.type == OptionType::kChoice) {
        opt->check(CLI::IsMember(spec.choices));
      } else if (spec.type == OptionType::kInt) {
        opt->check(CLI::Range(spec.min_value, spec.max_value));
      }
    }
  }
}

namespace {
template <class Struct>
Struct apply(const OptionValues& values, OptionGroup group) {
  Struct out;
  for (const OptionSpec& spec : option_specs(group)) {
    if (spec.type == OptionType::kBool) {
      if (const auto it = values.flags.find(spec.name); it != values.flags.end()) {
        set_option(out, spec.name, it->second ? "true" : "false");
      }
    } else if (const auto it = values.text.find(spec.name); it != values.text.end()) {
      set_option(out, spec.name, it->second);
    }
  }
  return out;
}
}  // namespace

LoadOptions load_options(const OptionValues& values) {
  return apply<LoadOptions>(values, OptionGroup::kLoad);
}
SegmentOptions segment_options(const OptionValues& values) {
  return apply<SegmentOptions>(values, OptionGroup::kSegment);
}
RunOptions run_options(const OptionValues& values) {
  return apply<RunOptions>(values, OptionGroup::kRun);
}

}  // namespace sapiens_seg::cli
