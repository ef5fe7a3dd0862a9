// Segments a video file, a stream URL or a camera frame by frame and reports frames per second.
//
//   segment_video MODEL SOURCE [--show] [--out OVERLAY.mp4] [--max-frames N]
//
// SOURCE is a camera index (0, 1, ...), a file, or a URL that OpenCV's FFmpeg reads (rtsp://,
// http://...). --show opens a window with the overlay (Esc or q stops); --out writes the overlay
// video (H.264 where OpenCV's FFmpeg can encode it, else MPEG-4 Part 2). Ctrl-C stops a camera.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <opencv2/highgui.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>
#include <sapiens_seg/sapiens_seg.hpp>

namespace ss = sapiens_seg;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_sigint(int) {
  g_stop = true;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.size() < 4 && s.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL SOURCE [--show] [--out OVERLAY.mp4] [--max-frames N]\n",
                 argv[0]);
    return 2;
  }
  const std::string source = argv[2];
  bool show = false;
  std::string out;
  long max_frames = -1;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--show") {
      show = true;
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--max-frames" && i + 1 < argc) {
      max_frames = std::strtol(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::signal(SIGINT, on_sigint);
  try {
    cv::VideoCapture cap;
    if (is_index(source)) {
      cap.open(std::stoi(source));
    } else {
      cap.open(source);
    }
    if (!cap.isOpened()) {
      std::fprintf(stderr, "error: cannot open %s %s\n", is_index(source) ? "camera" : "video",
                   source.c_str());
      return 1;
    }
    const ss::Model model = ss::load(argv[1]);
    std::fprintf(stderr, "%s: %s/%s/%s\n", source.c_str(), model.info().backend.mode.c_str(),
                 model.info().backend.device.c_str(), model.info().backend.dtype.c_str());

    cv::VideoWriter writer;
    const double fps_in = cap.get(cv::CAP_PROP_FPS) > 0 ? cap.get(cv::CAP_PROP_FPS) : 25.0;
    cv::Mat frame, rgb, bgr;
    long frames = 0;
    double network_ms = 0;
    const auto start = Clock::now();
    auto last_report = start;
    while (!g_stop && (max_frames < 0 || frames < max_frames) && cap.read(frame)) {
      cv::cvtColor(frame, rgb, cv::COLOR_BGR2RGB);
      const ss::ImageView view{rgb.data, rgb.rows, rgb.cols, rgb.step[0]};
      const ss::Result r = model.segment(ss::Input::rgb(view));
      network_ms += r.timings.network;
      const ss::Image blended = ss::overlay(r, view, 0.5f);
      cv::cvtColor(cv::Mat(blended.height, blended.width, CV_8UC3,
                           const_cast<std::uint8_t*>(blended.rgb.data())),
                   bgr, cv::COLOR_RGB2BGR);
      ++frames;

      const auto now = Clock::now();
      const double secs = std::chrono::duration<double>(now - start).count();
      const double fps = static_cast<double>(frames) / secs;
      if (!out.empty()) {
        if (!writer.isOpened()) {
          // avc1 (H.264) plays in browsers; mp4v is the fallback every FFmpeg build has.
          if (!writer.open(out, cv::CAP_FFMPEG, cv::VideoWriter::fourcc('a', 'v', 'c', '1'), fps_in,
                           bgr.size()) &&
              !writer.open(out, cv::VideoWriter::fourcc('m', 'p', '4', 'v'), fps_in, bgr.size())) {
            std::fprintf(stderr, "error: cannot write %s\n", out.c_str());
            return 1;
          }
        }
        writer.write(bgr);
      }
      if (show) {
        cv::putText(bgr, cv::format("%.1f frames/s", fps), {10, 30}, cv::FONT_HERSHEY_SIMPLEX, 0.8,
                    {255, 255, 255}, 2);
        cv::imshow("sapiens-seg", bgr);
        const int key = cv::waitKey(1);
        if (key == 27 || key == 'q') break;
      }
      if (now - last_report > std::chrono::seconds(1)) {
        last_report = now;
        std::fprintf(stderr, "\r%ld frames, %.1f frames/s", frames, fps);
        std::fflush(stderr);
      }
    }
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    if (frames == 0) {
      std::fprintf(stderr, "error: no frame could be read from %s\n", source.c_str());
      return 1;
    }
    std::fprintf(stderr, "\n");
    std::printf("%ld frames in %.2f s: %.1f frames/s (network %.1f ms/frame)%s%s\n", frames, secs,
                static_cast<double>(frames) / secs, network_ms / static_cast<double>(frames),
                out.empty() ? "" : " -> ", out.c_str());
    return 0;
  } catch (const ss::Error& e) {
    std::fprintf(stderr, "error [%s]: %s\n", std::string(ss::to_string(e.code())).c_str(),
                 e.what());
    return 1;
  }
}
