// Segments one image with a checkpoint given on the command line and prints what it found.
#include <cstdio>
#include <vector>

#include <sapiens_seg/sapiens_seg.hpp>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: consumer CHECKPOINT IMAGE\n");
    return 2;
  }
  try {
    const sapiens_seg::Model model = sapiens_seg::load(argv[1]);
    const sapiens_seg::Result r = model.segment(sapiens_seg::Input::file(argv[2]));
    // segment() is prepare() then run(): the two halves give the same labels.
    const std::vector<sapiens_seg::Prepared> ready{
        model.prepare(sapiens_seg::Input::file(argv[2]))};
    if (model.run(ready).front().labels != r.labels) {
      std::fprintf(stderr, "prepare + run gave other labels than segment\n");
      return 1;
    }
    std::size_t fg = 0;
    for (auto v : r.foreground()) fg += v;
    std::printf("sapiens_seg %s: %dx%d, %zu foreground pixels, %zu classes, backend %s/%s/%s\n",
                sapiens_seg::version(), r.width, r.height, fg, r.classes.size(),
                r.backend.mode.c_str(), r.backend.device.c_str(), r.backend.dtype.c_str());
    return 0;
  } catch (const sapiens_seg::Error& e) {
    std::fprintf(stderr, "error [%s]: %s\n", std::string(sapiens_seg::to_string(e.code())).c_str(),
                 e.what());
    return 1;
  }
}
