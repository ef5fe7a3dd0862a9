// The configuration in one place: the table of environment variables against
// docs/configuration.md and against the reader, no getenv outside the reader, each variable's
// parsing and read time, and the public log API (level, callback, threads).
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/settings.hpp"
#include "io/log.hpp"
#include "sapiens_seg/log.hpp"
#include "sapiens_seg/settings.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using sapiens_seg::LogLevel;
using sapiens_seg::test::expect_error;
using sapiens_seg::test::with_env;

namespace {

const fs::path kSource = SAPIENS_SEG_SOURCE_DIR;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string table_row(const sapiens_seg::EnvironmentVariable& v) {
  return "| `" + v.name + "` | " + v.meaning + " | " + v.default_value + " | " + v.read + " |";
}

// The rows between the markers of docs/configuration.md.
std::vector<std::string> docs_rows() {
  std::istringstream in(read_text(kSource / "docs" / "configuration.md"));
  std::vector<std::string> rows;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line == "<!-- environment-variables:begin -->") {
      inside = true;
    } else if (line == "<!-- environment-variables:end -->") {
      inside = false;
    } else if (inside && line.rfind("| `", 0) == 0) {
      rows.push_back(line);
    }
  }
  return rows;
}

// Lines delivered to the log callback.
struct Captured {
  std::mutex mu;
  std::vector<std::pair<LogLevel, std::string>> lines;
  void operator()(LogLevel level, std::string_view line) {
    std::lock_guard<std::mutex> lock(mu);
    lines.emplace_back(level, std::string(line));
  }
};

// Restores stderr as the log's target and the given level when a test ends.
struct LogReset {
  LogLevel level;
  ~LogReset() {
    sapiens_seg::set_log_callback({});
    sapiens_seg::set_log_level(level);
  }
};

}  // namespace

// ---- the table -------------------------------------------------------------------------------

TEST(UnitSettings, DocsTableIsTheLibrarysTable) {
  std::vector<std::string> want;
  for (const auto& v : sapiens_seg::environment_variables()) want.push_back(table_row(v));
  std::string expected;
  for (const auto& r : want) expected += r + "\n";
  EXPECT_EQ(docs_rows(), want)
      << "docs/configuration.md's table differs from sapiens_seg::environment_variables() "
         "(src/core/settings.cpp); the rows it should hold:\n"
      << expected;
}

TEST(UnitSettings, EveryVariableIsDescribedOnce) {
  std::set<std::string> names;
  for (const auto& v : sapiens_seg::environment_variables()) {
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " twice";
    EXPECT_FALSE(v.meaning.empty() || v.default_value.empty() || v.read.empty()) << v.name;
    for (const std::string* cell : {&v.meaning, &v.default_value, &v.read}) {
      EXPECT_EQ(cell->find('|'), std::string::npos) << v.name << ": a '|' breaks the table";
    }
  }
}

// The reader reads each variable of the table, and only those (a name outside the table makes
// read_settings() throw, which every test below would show).
TEST(UnitSettings, ReaderReadsExactlyTheTable) {
  const std::string source = read_text(kSource / "src" / "core" / "settings.cpp");
  const std::regex use(R"re(env\.(text|flag|get)\("([A-Z0-9_]+)"\))re");
  std::set<std::string> names_read;
  for (auto it = std::sregex_iterator(source.begin(), source.end(), use);
       it != std::sregex_iterator(); ++it) {
    names_read.insert((*it)[2]);
  }
  std::set<std::string> table;
  for (const auto& v : sapiens_seg::environment_variables()) table.insert(v.name);
  EXPECT_EQ(names_read, table);
  EXPECT_NO_THROW(sapiens_seg::core::read_settings());
}

// No file of the library or the binding reads the environment but the reader.
TEST(UnitSettings, NoGetenvOutsideTheReader) {
  const std::regex reads(R"(\b(secure_getenv|getenv|environ)\b)");
  std::vector<std::string> offenders;
  int files = 0;
  for (const char* root : {"src", "python/src", "kernels"}) {
    if (!fs::is_directory(kSource / root)) continue;
    for (const auto& e : fs::recursive_directory_iterator(kSource / root)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() ||
          !(ext == ".cpp" || ext == ".hpp" || ext == ".h" || ext == ".cu" || ext == ".cuh")) {
        continue;
      }
      ++files;
      const fs::path rel = fs::relative(e.path(), kSource);
      if (rel == fs::path("src/core/settings.cpp")) continue;
      std::istringstream in(read_text(e.path()));
      int n = 0;
      for (std::string line; std::getline(in, line);) {
        ++n;
        if (std::regex_search(line, reads)) {
          offenders.push_back(rel.string() + ":" + std::to_string(n) + ": " + line);
        }
      }
    }
  }
  EXPECT_GT(files, 50);
  std::string list;
  for (const auto& o : offenders) list += "\n  " + o;
  EXPECT_TRUE(offenders.empty())
      << "read the environment through core::read_settings() (src/core/settings.hpp) and add the "
         "variable to its table and docs/configuration.md:"
      << list;
}

// ---- the reader --------------------------------------------------------------------------------

TEST(UnitSettings, ReadsTheEnvironmentAsItIsNow) {
  with_env("SAPIENS_SEG_HOME", "/tmp/a", [] {
    EXPECT_EQ(sapiens_seg::core::read_settings().cache_home, fs::path("/tmp/a"));
    with_env("SAPIENS_SEG_HOME", "/tmp/b",
             [] { EXPECT_EQ(sapiens_seg::core::read_settings().cache_home, fs::path("/tmp/b")); });
  });
  with_env("SAPIENS_SEG_CARDS", ":/x::/y/z:", [] {
    const auto dirs = sapiens_seg::core::read_settings().card_dirs;
    EXPECT_EQ(dirs, (std::vector<fs::path>{"/x", "/y/z"}));
  });
}

TEST(UnitSettings, FlagsAreOneTrueYesOnInAnyCase) {
  for (const char* on : {"1", "true", "TRUE", "Yes", "on"}) {
    with_env("SAPIENS_SEG_OFFLINE", on,
             [&] { EXPECT_TRUE(sapiens_seg::core::read_settings().offline) << on; });
  }
  for (const char* off : {"0", "", "false", "no", "off", "2", " 1"}) {
    with_env("SAPIENS_SEG_OFFLINE", off,
             [&] { EXPECT_FALSE(sapiens_seg::core::read_settings().offline) << off; });
  }
}

TEST(UnitSettings, WholeNumbersAreCheckedWhereUsed) {
  with_env("SAPIENS_SEG_DOWNLOAD_RETRIES", "5x", [] {
    const auto s = sapiens_seg::core::read_settings();  // reading does not throw
    expect_error([&] { (void)s.download_retries.value(); }, sapiens_seg::ErrorCode::kInvalidInput,
                 {"SAPIENS_SEG_DOWNLOAD_RETRIES='5x'", "from 0 to 100"});
    EXPECT_EQ(s.retry_base_ms.value(), 1000);  // the others keep their defaults
  });
  with_env("SAPIENS_SEG_LOW_SPEED_TIME", "0", [] {
    expect_error([] { (void)sapiens_seg::core::read_settings().low_speed_time.value(); },
                 sapiens_seg::ErrorCode::kInvalidInput, {"from 1 to 86400"});
  });
  with_env("SAPIENS_SEG_RETRY_BASE_MS", "250",
           [] { EXPECT_EQ(sapiens_seg::core::read_settings().retry_base_ms.value(), 250); });
}

TEST(UnitSettings, CpuOverridesKeepSetButEmptyApart) {
  with_env("SAPIENS_SEG_CPU_FLAGS", "", [] {
    const auto s = sapiens_seg::core::read_settings();
    ASSERT_TRUE(s.cpu_flags.has_value());  // set to nothing: a CPU without the flags
    EXPECT_EQ(*s.cpu_flags, "");
  });
  ::unsetenv("SAPIENS_SEG_CPU_VENDOR");
  EXPECT_FALSE(sapiens_seg::core::read_settings().cpu_vendor.has_value());
}

// ---- the log -----------------------------------------------------------------------------------

// First of the log tests: until set_log_level() is called the level is SAPIENS_SEG_LOG's, read
// at each line.
TEST(UnitLog, LevelFollowsTheEnvironmentUntilSet) {
  with_env("SAPIENS_SEG_LOG", "error",
           [] { EXPECT_EQ(sapiens_seg::log_level(), LogLevel::kError); });
  with_env("SAPIENS_SEG_LOG", "debug",
           [] { EXPECT_EQ(sapiens_seg::log_level(), LogLevel::kDebug); });
  with_env("SAPIENS_SEG_LOG", "INFO", [] { EXPECT_EQ(sapiens_seg::log_level(), LogLevel::kWarn); });
  with_env("SAPIENS_SEG_LOG", "quiet",
           [] { EXPECT_EQ(sapiens_seg::log_level(), LogLevel::kQuiet); });
  ::unsetenv("SAPIENS_SEG_LOG");
  EXPECT_EQ(sapiens_seg::log_level(), LogLevel::kWarn);

  LogReset reset{LogLevel::kWarn};
  sapiens_seg::set_log_level(LogLevel::kInfo);
  with_env("SAPIENS_SEG_LOG", "error",
           [] { EXPECT_EQ(sapiens_seg::log_level(), LogLevel::kInfo); });
}

TEST(UnitLog, NamesRoundTrip) {
  for (LogLevel l :
       {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError, LogLevel::kQuiet}) {
    EXPECT_EQ(sapiens_seg::parse_log_level(sapiens_seg::to_string(l)), l);
  }
  EXPECT_EQ(sapiens_seg::to_string(LogLevel::kWarn), "warn");
  expect_error([] { sapiens_seg::parse_log_level("verbose"); },
               sapiens_seg::ErrorCode::kInvalidInput,
               {"'verbose'", "debug, info, warn, error, quiet"});
}

TEST(UnitLog, CallbackGetsTheLinesAtOrAboveTheLevel) {
  LogReset reset{LogLevel::kWarn};
  auto captured = std::make_shared<Captured>();
  sapiens_seg::set_log_callback([captured](LogLevel l, std::string_view s) { (*captured)(l, s); });
  sapiens_seg::set_log_level(LogLevel::kInfo);
  sapiens_seg::io::log(LogLevel::kDebug, "dropped");
  sapiens_seg::io::log(LogLevel::kInfo, "kept info");
  sapiens_seg::io::log(LogLevel::kError, "kept error");
  sapiens_seg::io::log(LogLevel::kQuiet, "never a line");
  sapiens_seg::set_log_level(LogLevel::kQuiet);
  sapiens_seg::io::log(LogLevel::kError, "quiet drops errors too");
  const std::vector<std::pair<LogLevel, std::string>> want{{LogLevel::kInfo, "kept info"},
                                                           {LogLevel::kError, "kept error"}};
  EXPECT_EQ(captured->lines, want);
}

TEST(UnitLog, EmptyCallbackMeansStderrAsBefore) {
  LogReset reset{LogLevel::kWarn};
  sapiens_seg::set_log_level(LogLevel::kWarn);
  sapiens_seg::set_log_callback([](LogLevel, std::string_view) {});
  sapiens_seg::set_log_callback({});
  testing::internal::CaptureStderr();
  sapiens_seg::io::log(LogLevel::kWarn, "to stderr");
  sapiens_seg::io::log(LogLevel::kInfo, "below the level");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "sapiens-seg warning: to stderr\n");
}

// The callback runs without a library lock held: it may log (here one level deep) and may throw
// (the exception is dropped, the caller goes on).
TEST(UnitLog, CallbackMayLogAndThrow) {
  LogReset reset{LogLevel::kWarn};
  auto captured = std::make_shared<Captured>();
  sapiens_seg::set_log_callback([captured](LogLevel l, std::string_view s) {
    (*captured)(l, s);
    if (s == "outer") sapiens_seg::io::log(LogLevel::kError, "inner");
    if (s == "throw") throw std::runtime_error("a callback's error");
  });
  sapiens_seg::io::log(LogLevel::kWarn, "outer");
  EXPECT_NO_THROW(sapiens_seg::io::log(LogLevel::kWarn, "throw"));
  ASSERT_EQ(captured->lines.size(), 3u);
  EXPECT_EQ(captured->lines[1].second, "inner");
}

TEST(UnitLog, LinesFromManyThreadsAllArrive) {
  LogReset reset{LogLevel::kWarn};
  std::atomic<int> count{0};
  const sapiens_seg::LogCallback counting = [&count](LogLevel, std::string_view) { ++count; };
  sapiens_seg::set_log_callback(counting);
  std::vector<std::thread> threads;
  threads.reserve(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, &counting] {
      for (int i = 0; i < 500; ++i) {
        sapiens_seg::io::log(LogLevel::kWarn, std::to_string(t) + "/" + std::to_string(i));
        // Setting the level and the callback while others log must be safe too.
        if (i % 100 == 0) {
          sapiens_seg::set_log_level(LogLevel::kWarn);
          sapiens_seg::set_log_callback(counting);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(count.load(), 8 * 500);
}
