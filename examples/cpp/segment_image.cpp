// Segments one image and writes the colour overlay (palette over the photo) as a PNG.
//
//   segment_image MODEL IMAGE OUT.png [OPACITY]
//
// MODEL is a card id ("sapiens2-seg-0.4b"; downloaded on first use) or a checkpoint path. The
// Sapiens v1 weights (sapiens-seg-*-goliath) are CC-BY-NC-4.0: set SAPIENS_SEG_NONCOMMERCIAL=1
// to accept that licence.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sapiens_seg/sapiens_seg.hpp>

namespace ss = sapiens_seg;

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) {
    std::fprintf(stderr, "usage: %s MODEL IMAGE OUT.png [OPACITY]\n", argv[0]);
    return 2;
  }
  const float opacity = argc == 5 ? std::strtof(argv[4], nullptr) : 0.5f;
  try {
    const ss::Model model = ss::load(argv[1]);
    // Decoded once here (EXIF orientation applied, as the model would decode it), so that the
    // same pixels are segmented and drawn on.
    const ss::Image image = ss::read_image(argv[2]);
    const ss::Result r = model.segment(ss::Input::rgb(image.view()));
    const ss::Image blended = ss::overlay(r, image.view(), opacity);

    cv::Mat bgr;
    cv::cvtColor(cv::Mat(blended.height, blended.width, CV_8UC3,
                         const_cast<std::uint8_t*>(blended.rgb.data())),
                 bgr, cv::COLOR_RGB2BGR);
    if (!cv::imwrite(argv[3], bgr)) {
      std::fprintf(stderr, "error: cannot write %s\n", argv[3]);
      return 1;
    }

    std::vector<std::size_t> pixels(r.classes.size(), 0);
    for (std::uint8_t label : r.labels) ++pixels[label];
    std::printf("%s: %dx%d, %s/%s/%s, %.1f ms -> %s\n", argv[2], r.width, r.height,
                r.backend.mode.c_str(), r.backend.device.c_str(), r.backend.dtype.c_str(),
                r.timings.total, argv[3]);
    for (std::size_t k = 1; k < pixels.size(); ++k) {
      if (pixels[k] > 0) {
        std::printf("  %-20s %5.1f %%\n", r.classes[k].c_str(),
                    100.0 * static_cast<double>(pixels[k]) / static_cast<double>(r.labels.size()));
      }
    }
    return 0;
  } catch (const ss::Error& e) {
    std::fprintf(stderr, "error [%s]: %s\n", std::string(ss::to_string(e.code())).c_str(),
                 e.what());
    return 1;
  }
}
