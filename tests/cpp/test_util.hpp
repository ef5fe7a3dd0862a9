// Shared helpers of the C++ tests: fixture paths, reading the reference .npy files, and running
// a piece of a test in a child process under a memory cap.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::test {

// An empty folder of this process under the system's temporary folder, named for `name`
// (removed first when a previous run left it).
std::filesystem::path scratch_dir(const std::string& name);

// $SAPIENS_SEG_FIXTURES (set by ctest), with a skip message when absent.
std::string fixtures_dir();
std::string fixture(const std::string& relative);  // fixtures_dir()/relative

struct Array {
  std::string dtype;  // NumPy descr, e.g. "<f4", "|u1"
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;
  std::int64_t numel() const;
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
};
// Reads a C-order little-endian .npy written by NumPy (format 1.0-3.0).
Array read_npy(const std::string& path);

// Expects `fn` to throw Error with `code` and a message containing every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, ErrorCode code, std::initializer_list<std::string> parts) {
  try {
    fn();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "'" << p << "' not in: " << e.what();
  }
}

// fn() with environment variable `name` set to `value`, its previous state restored afterwards
// (also when fn throws).
template <typename Fn>
auto with_env(const char* name, const std::string& value, Fn fn) {
  const char* old = std::getenv(name);
  struct Restore {
    const char* name;
    std::optional<std::string> old;
    ~Restore() { old ? ::setenv(name, old->c_str(), 1) : ::unsetenv(name); }
  } restore{name, old ? std::optional<std::string>(old) : std::nullopt};
  ::setenv(name, value.c_str(), 1);
  return fn();
}

// fn() with the portable network's CPU attention forced to LibTorch's scaled_dot_product_attention
// (SAPIENS_SEG_CPU_ATTENTION=libtorch), the reference the library's attention kernel is held to.
template <typename Fn>
auto with_libtorch_attention(Fn fn) {
  return with_env("SAPIENS_SEG_CPU_ATTENTION", "libtorch", fn);
}

// fn() in a forked child process, its answer brought back through a pipe; std::nullopt when the
// child died or ran past `timeout` (then it is killed). For tests that must leave the test
// process untouched, such as running out of memory on purpose. The child inherits only the
// calling thread: set LibTorch to one thread first (an OpenMP pool does not survive fork).
std::optional<std::string> in_child_process(
    const std::function<std::string()>& fn,
    std::chrono::seconds timeout = std::chrono::seconds(60));

// Caps this process's address space at what it has mapped now plus `slack` bytes (false if the
// kernel refused), or lifts the cap again. Meant for a child of in_child_process.
bool cap_address_space(std::size_t slack);
bool lift_address_space_cap();

// In a death-test child (EXPECT_EXIT): runs `fn` with the address space capped at `extra` bytes
// above what the process has mapped, and exits 0 when it throws Error(`code`); 2 when it
// returns, 3 for an Error of another code, 4 for any other exception, 5 when the cap was refused.
template <typename Fn>
[[noreturn]] void exit_under_memory_limit(std::size_t extra, ErrorCode code, Fn fn) {
  if (!cap_address_space(extra)) std::_Exit(5);
  try {
    fn();
    std::_Exit(2);
  } catch (const Error& e) {
    std::_Exit(e.code() == code ? 0 : 3);
  } catch (...) {
    std::_Exit(4);
  }
}

}  // namespace sapiens_seg::test
