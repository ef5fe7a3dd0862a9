// speed_check: load time, speed and peak memory of every mode beside the original, measured in
// the same run on the same machine (the protocol of the project's design, section 7).
//
// Every column runs in its own worker process (this program with --worker, original_python.py
// --worker for the authors' pipeline in Python, peers_python.py --worker for the runtimes a CPU
// user would pick instead: ONNX Runtime and OpenVINO on the project's ONNX export, Hugging Face
// transformers for Sapiens2), so that each one's peak memory is its own and no column inherits
// another's caches; the parent (parent.cpp) drives them in lock step.
//
// The library's columns go through library.hpp: the public API in the normal build, the
// library's own IO-free steps in the build without the IO layer (the GPU machine). What only a
// benchmark needs and the API does not give (the original under autocast, CUDA-graph counts, the
// backbone/head split, CUDA peaks) is gpu_extras.hpp, on the library's internals on purpose.
#include <signal.h>

#include <iostream>

#include "options.hpp"
#include "parent.hpp"
#include "worker.hpp"

int main(int argc, char** argv) {
  // A worker that dies (e.g. killed for memory) closes its pipe; writing the next request must
  // fail with EPIPE and mark that column failed, not kill the whole run with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  std::string command;
  try {
    speed_check::Options o = speed_check::parse_args(argc, argv, command);
    if (o.worker) {
      if (o.worker_mode.empty()) o.worker_mode = "portable";
      if (o.worker_dtype.empty()) o.worker_dtype = "float32";
      return speed_check::run_worker(o);
    }
    return speed_check::run_parent(o, command, argv[0]);
  } catch (const std::exception& e) {
    std::cerr << "speed_check: " << e.what() << "\n";
    return 2;
  }
}
