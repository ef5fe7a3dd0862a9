// sapiens_seg::as_error: what LibTorch, OpenCV and the standard library throw, as library errors.
// Allocation failures in particular must get their own code (out of memory), never "internal".
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <opencv2/core.hpp>

#include "sapiens_seg/error.hpp"
#include "sapiens_seg/sapiens_seg.hpp"
#include "test_util.hpp"

#if __has_include(<oneapi/dnnl/dnnl_common.hpp>)
#include <oneapi/dnnl/dnnl_common.hpp>
#endif

using namespace sapiens_seg;

namespace {

template <typename E>
Error convert(const E& e, const std::string& context = "ctx") {
  try {
    throw e;
  } catch (...) {
    return as_error(std::current_exception(), context);
  }
}

bool contains(const Error& e, const std::string& part) {
  return std::string(e.what()).find(part) != std::string::npos;
}

}  // namespace

TEST(UnitErrors, OutOfMemoryHasItsOwnCodeAndName) {
  EXPECT_EQ(static_cast<int>(ErrorCode::kOutOfMemory), 11);
  EXPECT_EQ(to_string(ErrorCode::kOutOfMemory), "out_of_memory");
}

TEST(UnitNames, EveryCodeIsNamedAndExitsAtTenPlusItsValue) {
  const std::vector<ErrorCode> codes = error_codes();
  ASSERT_EQ(codes.size(), 11u);
  for (std::size_t k = 0; k < codes.size(); ++k) {
    EXPECT_EQ(static_cast<int>(codes[k]), static_cast<int>(k) + 1);
    EXPECT_NE(to_string(codes[k]), "unknown");
    EXPECT_EQ(exit_status(codes[k]), 11 + static_cast<int>(k));
  }
  EXPECT_EQ(exit_status(ErrorCode::kInvalidInput), 17);
}

// Each option's names parse back to the value they name, every value has a distinct name, and
// the first name is the library's default (what the CLI and Python show as the default).
template <class E>
void expect_round_trip(const std::vector<std::string>& names, E (*parse)(std::string_view),
                       E default_value) {
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(parse(names.front()), default_value);
  std::vector<std::string> seen;
  for (const auto& n : names) {
    EXPECT_EQ(to_string(parse(n)), n);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), n), 0) << n;
    seen.push_back(n);
  }
}

TEST(UnitNames, OptionNamesRoundTripAndStartWithTheDefault) {
  const LoadOptions d;
  expect_round_trip(mode_names(), &parse_mode, d.mode);
  expect_round_trip(dtype_names(), &parse_dtype, d.dtype);
  expect_round_trip(normalization_names(), &parse_normalization, d.normalization);
  expect_round_trip(pipeline_names(), &parse_pipeline, d.pipeline);
  expect_round_trip(cubic_names(), &parse_cubic, d.cubic);
  EXPECT_EQ(mode_names(), (std::vector<std::string>{"auto", "portable", "kernels", "original"}));
  EXPECT_EQ(dtype_names(), (std::vector<std::string>{"default", "float32", "float16", "bfloat16"}));
}

TEST(UnitNames, AnUnknownNameIsInvalidInputListingTheChoices) {
  try {
    (void)parse_mode("fast");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    EXPECT_TRUE(contains(e, "mode 'fast' is not one of auto, portable, kernels, original"))
        << e.what();
  }
  EXPECT_THROW((void)parse_cubic("Wheel"), Error);  // names are exact, as the CLI takes them
}

// ---- the option table -----------------------------------------------------------------------

// The number of fields of an aggregate: the most initialisers of a type that converts to
// anything that T{...} accepts. A field added to an options struct changes it, so the test below
// fails until the table has a row for the field.
struct AnyField {
  template <class T>
  operator T() const;  // NOLINT(google-explicit-constructor): declared only, never called
};
template <class T, class... Fields>
constexpr std::size_t field_count() {
  if constexpr (requires { T{Fields{}..., AnyField{}}; }) {
    return field_count<T, Fields..., AnyField>();
  } else {
    return sizeof...(Fields);
  }
}

std::size_t rows_of(OptionGroup g) {
  return option_specs(g).size();
}

TEST(UnitNames, TheOptionTableHasARowForEveryFieldOfTheOptionStructs) {
  // LoadOptions' `fetch` is FetchOptions, whose progress callback and cancel flag are not text
  // options (a program sets them); its use_hf_token is a row of the load group.
  constexpr std::size_t kFetchCallbacks = 2;
  EXPECT_EQ(rows_of(OptionGroup::kLoad),
            field_count<LoadOptions>() - 1 + field_count<FetchOptions>() - kFetchCallbacks);
  EXPECT_EQ(rows_of(OptionGroup::kSegment), field_count<SegmentOptions>());
  EXPECT_EQ(rows_of(OptionGroup::kRun), field_count<RunOptions>());
  // Sanity of the counter itself, on structs whose fields are known.
  EXPECT_EQ(field_count<ImageView>(), 4u);
  EXPECT_EQ(field_count<Backend>(), 3u);
}

TEST(UnitNames, EveryOptionRoundTripsItsDefaultAndItsValues) {
  std::set<std::string> names;
  for (const OptionSpec& spec : option_specs()) {
    EXPECT_TRUE(names.insert(spec.name).second) << "two rows named " << spec.name;
    EXPECT_FALSE(spec.help.empty()) << spec.name;
    std::vector<std::string> values = {spec.default_value};
    if (spec.type == OptionType::kChoice) {
      ASSERT_FALSE(spec.choices.empty()) << spec.name;
      EXPECT_EQ(spec.choices.front(), spec.default_value) << spec.name << ": default first";
      values = spec.choices;
    } else if (spec.type == OptionType::kBool) {
      values = {"true", "false"};
    } else if (spec.type == OptionType::kInt) {
      values = {std::to_string(spec.min_value), std::to_string(spec.max_value)};
    } else {
      values.push_back("cpu");
    }
    for (const std::string& v : values) {
      LoadOptions l;
      SegmentOptions s;
      RunOptions r;
      std::string got;
      // The default object gives the default text.
      if (spec.group == OptionGroup::kLoad) {
        EXPECT_EQ(get_option(l, spec.name), spec.default_value) << spec.name;
        set_option(l, spec.name, v);
        got = get_option(l, spec.name);
      } else if (spec.group == OptionGroup::kSegment) {
        EXPECT_EQ(get_option(s, spec.name), spec.default_value) << spec.name;
        set_option(s, spec.name, v);
        got = get_option(s, spec.name);
      } else {
        EXPECT_EQ(get_option(r, spec.name), spec.default_value) << spec.name;
        set_option(r, spec.name, v);
        got = get_option(r, spec.name);
      }
      EXPECT_EQ(got, v) << spec.name;
    }
  }
  // Each row writes its own field: a few spot checks against the structs.
  LoadOptions l;
  set_option(l, "use_hf_token", "true");
  EXPECT_TRUE(l.fetch.use_hf_token);
  set_option(l, "input_width", "640");
  EXPECT_EQ(l.input_width, 640);
  EXPECT_EQ(l.input_height, 0);
  set_option(l, "mode", "original");
  EXPECT_EQ(l.mode, Mode::kOriginal);
  SegmentOptions s;
  set_option(s, "raw_logits", "1");
  EXPECT_TRUE(s.raw_logits);
  EXPECT_FALSE(s.logits);
  RunOptions r;
  set_option(r, "batch_size", "16");
  EXPECT_EQ(r.batch_size, 16);
}

TEST(UnitNames, ABadOptionValueOrNameIsInvalidInputSayingWhatItTakes) {
  LoadOptions l;
  const auto expect_refused = [&](const char* name, const char* value, const char* says) {
    try {
      set_option(l, name, value);
      FAIL() << name << "=" << value << " was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
      EXPECT_TRUE(contains(e, says)) << e.what();
    }
  };
  expect_refused("threads", "-1", "an integer from 0 to");
  expect_refused("threads", "2x", "an integer from 0 to");
  expect_refused("accept_noncommercial", "yes", "true or false");
  expect_refused("dtype", "fp16", "is not one of");
  expect_refused("batch_size", "4", "not an option of loading");
  RunOptions r;
  EXPECT_THROW(set_option(r, "batch_size", "0"), Error);
  EXPECT_EQ(default_model(), "sapiens-seg-0.3b-goliath");
}

TEST(UnitErrors, AllocationFailuresBecomeOutOfMemory) {
  EXPECT_EQ(convert(std::bad_alloc()).code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(convert(std::bad_array_new_length()).code(), ErrorCode::kOutOfMemory);
  const Error thread = convert(
      std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again), "thread"));
  EXPECT_EQ(thread.code(), ErrorCode::kOutOfMemory) << thread.what();
  const Error cv_oom =
      convert(cv::Exception(cv::Error::StsNoMem, "Failed to allocate 1 bytes", "f", "file", 1));
  EXPECT_EQ(cv_oom.code(), ErrorCode::kOutOfMemory) << cv_oom.what();
  const Error cuda = convert(std::runtime_error("CUDA error: out of memory"));
  EXPECT_EQ(cuda.code(), ErrorCode::kOutOfMemory);
  EXPECT_TRUE(contains(cuda, "ctx: "));
}

// What LibTorch really throws when an allocation fails on the CPU (a plain c10::Error whose
// text says so), and its CUDA out-of-memory class.
TEST(UnitErrors, LibTorchAllocationFailuresBecomeOutOfMemory) {
  Error e(ErrorCode::kInternal, "");
  try {
    (void)at::empty({std::int64_t{1} << 62}, at::kByte);  // 4 EiB: no allocator has that
    FAIL() << "a 4 EiB tensor was allocated";
  } catch (...) {
    e = as_error(std::current_exception(), "a huge tensor");
  }
  EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
  EXPECT_TRUE(contains(e, "a huge tensor: out of memory")) << e.what();
  const Error cuda = convert(c10::OutOfMemoryError({"f", "file", 1}, "CUDA out of memory."));
  EXPECT_EQ(cuda.code(), ErrorCode::kOutOfMemory) << cuda.what();
}

TEST(UnitErrors, OtherExceptionsBecomeInternalAndErrorsStayAsTheyAre) {
  const Error mine = convert(Error(ErrorCode::kInvalidInput, "bad image"));
  EXPECT_EQ(mine.code(), ErrorCode::kInvalidInput);
  EXPECT_STREQ(mine.what(), "bad image");
  const Error c10 = convert(c10::Error({"f", "file", 1}, "shape mismatch"));
  EXPECT_EQ(c10.code(), ErrorCode::kInternal);
  EXPECT_TRUE(contains(c10, "ctx: shape mismatch")) << c10.what();
  EXPECT_EQ(convert(cv::Exception(cv::Error::StsBadArg, "bad", "f", "file", 1)).code(),
            ErrorCode::kInternal);
  EXPECT_EQ(convert(std::logic_error("bug")).code(), ErrorCode::kInternal);
  EXPECT_EQ(convert(42).code(), ErrorCode::kInternal);
  EXPECT_EQ(as_error(nullptr, "x").code(), ErrorCode::kInternal);
}

// What the CLI's out-of-memory test once met on a test machine: under an address-space cap, oneDNN
// (LibTorch's float32 convolutions) cannot build a primitive and throws its own exception type,
// whose text, "could not create a primitive", does not say why. A float32 convolution of a shape
// never run before is called under caps rising from what the process already uses until it
// fits: every failure on the way must be out_of_memory, and the tightest caps must reach oneDNN
// itself (else this test would not guard that path).
TEST(UnitErrors, OneDnnFailuresUnderAnAddressSpaceCapAreOutOfMemory) {
  if (!at::hasMKLDNN()) GTEST_SKIP() << "this LibTorch has no oneDNN";
  // One thread: OpenMP's pool does not survive fork, and a single-threaded call needs no pool.
  at::set_num_threads(1);
  const at::Tensor x = at::randn({8, 64, 96, 96});
  const at::Tensor w = at::randn({64, 64, 3, 3});
  (void)at::conv2d(x.slice(0, 0, 1), w, {}, 1, 1);  // oneDNN's one-time set-up, batch 1 only

  std::vector<std::size_t> caps;
  for (std::size_t kib = 0; kib < 2048; kib += 32) caps.push_back(kib << 10);
  for (std::size_t mib = 2; mib <= 128; ++mib) caps.push_back(mib << 20);
  int failures = 0;
  int from_onednn = 0;
  bool fitted = false;
  for (const std::size_t slack : caps) {
    // The child answers "ok", or the failure's code and text.
    const std::optional<std::string> answer = test::in_child_process([&]() -> std::string {
      if (!test::cap_address_space(slack)) return "no cap";
      try {
        (void)at::conv2d(x, w, {}, 1, 1);
        return "ok";
      } catch (...) {
        const Error e = as_error(std::current_exception(), "capped");
        return std::to_string(static_cast<int>(e.code())) + " " + e.what();
      }
    });
    ASSERT_TRUE(answer) << "the capped child died (slack " << slack << " bytes)";
    ASSERT_NE(*answer, "no cap");
    if (*answer == "ok") {
      fitted = true;
      break;
    }
    ++failures;
    EXPECT_EQ(answer->substr(0, answer->find(' ')),
              std::to_string(static_cast<int>(ErrorCode::kOutOfMemory)))
        << slack << ": " << *answer;
    if (answer->find("oneDNN") != std::string::npos) ++from_onednn;
  }
  EXPECT_TRUE(fitted) << "the convolution never fitted under a cap of +128 MiB";
  EXPECT_GT(failures, 0);
  EXPECT_GT(from_onednn, 0) << "no cap made oneDNN itself fail; " << failures
                            << " failures, all in LibTorch's allocator";
}

TEST(UnitErrors, OneDnnStatusesOtherThanMemoryStayInternal) {
#if __has_include(<oneapi/dnnl/dnnl_common.hpp>)
  const Error oom = convert(dnnl::error(dnnl_out_of_memory, "could not create a primitive"));
  EXPECT_EQ(oom.code(), ErrorCode::kOutOfMemory) << oom.what();
  EXPECT_TRUE(contains(oom, "could not create a primitive")) << oom.what();
  const Error bad = convert(dnnl::error(dnnl_invalid_arguments, "could not create a primitive"));
  EXPECT_EQ(bad.code(), ErrorCode::kInternal) << bad.what();
  EXPECT_TRUE(contains(bad, "oneDNN")) << bad.what();
#else
  GTEST_SKIP() << "LibTorch ships no oneDNN header here";
#endif
}

// The public functions that call LibTorch or allocate turn what those throw into the library's
// Error: resize under an address-space limit reports out_of_memory (it let std::bad_alloc
// through), in a child process.
TEST(UnitErrors, ResizeReportsAnAllocationFailureAsOutOfMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::vector<std::uint8_t> px(32 * 32 * 3, 7);
  EXPECT_EXIT(test::exit_under_memory_limit(std::size_t{64} << 20, ErrorCode::kOutOfMemory,
                                            [&] {
                                              resize(ImageView{px.data(), 32, 32, 0}, 16000, 16000);
                                            }),
              ::testing::ExitedWithCode(0), "");
  EXPECT_NO_THROW(system_info());
}
