// sapiens_seg::as_error: what LibTorch, OpenCV and the standard library throw, as library errors.
// Allocation failures in particular must get their own code (out of memory), never "internal".
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <new>
#include <string>
#include <system_error>

#include <ATen/ATen.h>
#include <opencv2/core.hpp>

#include "sapiens_seg/error.hpp"

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
