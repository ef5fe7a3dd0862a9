// What the CRC-32 check of a TorchScript archive's records costs at load time: opens the archive
// (directory, data.pkl, tensor views) with and without the check, alternating, and prints the
// median of each. A measurement tool, not a test (docs/models.md quotes its output):
//
//   build/bin/archive_crc_cost FILE.pt2 [ROUNDS]
//
// Run it on a warm page cache (it reads the file once first): what it measures is the CRC
// computation, not the disk.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <zlib.h>

#include "core/checkpoint/mapped_file.hpp"
#include "core/checkpoint/torchscript_archive.hpp"
#include "core/checkpoint/zip_codec.hpp"
#include "sapiens_seg/error.hpp"

namespace {

double open_ms(const std::string& path, bool verify) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto a = sapiens_seg::core::TorchScriptArchive::open(path, {.verify_crc = verify});
  const auto tensors = a.all();
  const auto t1 = std::chrono::steady_clock::now();
  if (tensors.empty()) std::fprintf(stderr, "no tensors in %s\n", path.c_str());
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// Faulting in every page of a fresh mapping (one byte read per 4 KiB, on the same threads): the
// part of the check's cost that the first forward pass pays anyway when the views are used in
// place.
double touch_ms(const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto m = sapiens_seg::core::map_file(path, "checkpoint");
  std::vector<unsigned> sums(static_cast<std::size_t>(at::get_num_threads()) * 16, 0);
  const std::int64_t pages = static_cast<std::int64_t>(m.size / 4096);
  at::parallel_for(0, pages, 1024, [&](std::int64_t lo, std::int64_t hi) {
    unsigned s = 0;
    for (std::int64_t p = lo; p < hi; ++p) s += m.data[static_cast<std::size_t>(p) * 4096];
    sums[static_cast<std::size_t>(at::get_thread_num()) * 16] += s;
  });
  const auto t1 = std::chrono::steady_clock::now();
  unsigned total = 0;
  for (unsigned s : sums) total += s;
  if (total == 1) std::fprintf(stderr, "\n");  // keeps the reads
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// The CRC-32 of the whole file on one thread, by zlib or by this build's crc32 (ISA-L where
// found), on a fresh mapping: the two libraries side by side on the same bytes.
double whole_file_ms(const std::string& path, bool with_zlib, std::uint32_t* crc) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto m = sapiens_seg::core::map_file(path, "checkpoint");
  *crc = with_zlib ? static_cast<std::uint32_t>(::crc32_z(0, m.data, m.size))
                   : sapiens_seg::core::crc32(m.data, m.size);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE.pt2 [ROUNDS]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 7;
  open_ms(path, true);  // warms the page cache and checks the file once
  std::vector<double> with, without, touch, by_zlib, by_build;
  std::uint32_t crc_zlib = 0, crc_build = 0;
  for (int r = 0; r < rounds; ++r) {
    without.push_back(open_ms(path, false));
    with.push_back(open_ms(path, true));
    touch.push_back(touch_ms(path));
    by_zlib.push_back(whole_file_ms(path, true, &crc_zlib));
    by_build.push_back(whole_file_ms(path, false, &crc_build));
  }
  if (crc_zlib != crc_build) std::fprintf(stderr, "the two CRC-32s differ!\n");
  const double w = median(with), wo = median(without), t = median(touch);
  std::printf("file %s\nthreads %d, crc32 by %s, %d rounds alternating\n", path.c_str(),
              at::get_num_threads(), sapiens_seg::core::crc32_implementation().c_str(), rounds);
  std::printf(
      "open without CRC check: %.1f ms (median)\nopen with CRC check:    %.1f ms (median)\n"
      "cost of the check:      %.1f ms\n"
      "of which page faults:   %.1f ms (every page of a fresh mapping touched, median)\n",
      wo, w, w - wo, t);
  std::printf("whole file, 1 thread:   zlib %s %.1f ms, %s %.1f ms\n", zlibVersion(),
              median(by_zlib), sapiens_seg::core::crc32_implementation().c_str(), median(by_build));
  return 0;
} catch (const sapiens_seg::Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
