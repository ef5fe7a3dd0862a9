// Segments every image of a folder in batches and writes one label map per image
// (<name>_seg.png: 8-bit grey, value = class index), with a progress line on stderr.
//
//   segment_folder MODEL FOLDER OUT_DIR [BATCH]
//
// A batch is one network call over images of any sizes. An image that cannot be decoded is
// reported and skipped; the others go on.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <sapiens_seg/sapiens_seg.hpp>

namespace fs = std::filesystem;
namespace ss = sapiens_seg;

namespace {

bool is_image(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  for (const char* e : {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}) {
    if (ext == e) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) {
    std::fprintf(stderr, "usage: %s MODEL FOLDER OUT_DIR [BATCH]\n", argv[0]);
    return 2;
  }
  const std::size_t batch_size = argc == 5 ? std::max(1L, std::strtol(argv[4], nullptr, 10)) : 4;
  try {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(argv[2])) {
      if (entry.is_regular_file() && is_image(entry.path())) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      std::fprintf(stderr, "error: no images in %s\n", argv[2]);
      return 1;
    }
    fs::create_directories(argv[3]);

    const ss::Model model = ss::load(argv[1]);
    const auto start = std::chrono::steady_clock::now();
    std::size_t done = 0, failed = 0;
    for (std::size_t first = 0; first < files.size(); first += batch_size) {
      const std::size_t last = std::min(files.size(), first + batch_size);
      std::vector<ss::Input> batch;
      std::vector<fs::path> names;
      for (std::size_t i = first; i < last; ++i) {
        try {
          // Decoding first (rather than Input::file) keeps one bad file out of the batch.
          batch.push_back(ss::Input::rgb_copy(ss::read_image(files[i].string()).view()));
          names.push_back(files[i]);
        } catch (const ss::Error& e) {
          std::fprintf(stderr, "\nskipped %s: %s\n", files[i].c_str(), e.what());
          ++failed;
        }
      }
      if (!batch.empty()) {
        const std::vector<ss::Result> results = model.segment(batch);
        for (std::size_t j = 0; j < results.size(); ++j) {
          const ss::Result& r = results[j];
          const fs::path out = fs::path(argv[3]) / (names[j].stem().string() + "_seg.png");
          const cv::Mat labels(r.height, r.width, CV_8U,
                               const_cast<std::uint8_t*>(r.labels.data()));
          if (!cv::imwrite(out.string(), labels)) {
            std::fprintf(stderr, "\nerror: cannot write %s\n", out.c_str());
            return 1;
          }
        }
      }
      done = last;
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "\r%zu/%zu images, %.1f images/s", done, files.size(),
                   secs > 0 ? static_cast<double>(done) / secs : 0.0);
      std::fflush(stderr);
    }
    std::fprintf(stderr, "\n");
    std::printf("%zu images segmented into %s (%zu skipped), batches of %zu\n", done - failed,
                argv[3], failed, batch_size);
    return failed == 0 ? 0 : 1;
  } catch (const ss::Error& e) {
    std::fprintf(stderr, "\nerror [%s]: %s\n", std::string(ss::to_string(e.code())).c_str(),
                 e.what());
    return 1;
  } catch (const fs::filesystem_error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
