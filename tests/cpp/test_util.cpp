#include "test_util.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace sapiens_seg::test {

std::string fixtures_dir() {
  const char* d = std::getenv("SAPIENS_SEG_FIXTURES");
  if (d == nullptr || *d == '\0') {
    throw std::runtime_error("SAPIENS_SEG_FIXTURES is not set: run the tests through ctest");
  }
  return d;
}

std::string fixture(const std::string& relative) {
  return fixtures_dir() + "/" + relative;
}

std::int64_t Array::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

Array read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.size() < 12 || all.compare(0, 6, "\x93NUMPY") != 0) {
    throw std::runtime_error(path + ": not an .npy file");
  }
  std::size_t hlen = 0, start = 0;
  if (all[6] == 1) {
    hlen = static_cast<unsigned char>(all[8]) | (static_cast<unsigned char>(all[9]) << 8);
    start = 10;
  } else {
    for (int i = 3; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(all[8 + i]);
    start = 12;
  }
  const std::string h = all.substr(start, hlen);
  Array a;
  const auto d = h.find("'descr': '") + 10;
  a.dtype = h.substr(d, h.find('\'', d) - d);
  if (h.find("'fortran_order': False") == std::string::npos) {
    throw std::runtime_error(path + ": Fortran order is not supported");
  }
  const auto s = h.find("'shape': (") + 10;
  std::stringstream ss(h.substr(s, h.find(')', s) - s));
  for (std::string tok; std::getline(ss, tok, ',');) {
    if (tok.find_first_not_of(' ') != std::string::npos) a.shape.push_back(std::stoll(tok));
  }
  a.bytes.assign(all.begin() + static_cast<std::ptrdiff_t>(start + hlen), all.end());
  return a;
}

namespace {

// The address space this process has mapped now (what RLIMIT_AS counts).
std::size_t address_space_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0;
  statm >> pages;
  return pages * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

std::filesystem::path scratch_dir(const std::string& name) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() /
                                  ("sapiens_seg_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::optional<std::string> in_child_process(const std::function<std::string()>& fn,
                                            std::chrono::seconds timeout) {
  int fds[2];
  if (pipe(fds) != 0) return std::nullopt;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string answer;
    try {
      answer = fn();
    } catch (const std::exception& e) {
      answer = std::string("exception: ") + e.what();
    } catch (...) {
      answer = "exception";
    }
    for (std::size_t done = 0; done < answer.size();) {
      const ssize_t n = write(fds[1], answer.data() + done, answer.size() - done);
      if (n <= 0) _exit(2);
      done += static_cast<std::size_t>(n);
    }
    _exit(0);  // no atexit handlers, no destructors of the parent's objects
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return std::nullopt;
  }
  // The pipe is drained while the child runs, so an answer longer than its buffer cannot block
  // the child's write.
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  std::string answer;
  char buf[4096];
  const auto drain = [&] {
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) {
      answer.append(buf, static_cast<std::size_t>(n));
    }
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    drain();
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      close(fds[0]);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  drain();
  close(fds[0]);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return answer;
}

bool cap_address_space(std::size_t slack) {
  const rlimit lim{static_cast<rlim_t>(address_space_bytes() + slack), RLIM_INFINITY};
  return setrlimit(RLIMIT_AS, &lim) == 0;
}

bool lift_address_space_cap() {
  const rlimit lim{RLIM_INFINITY, RLIM_INFINITY};
  return setrlimit(RLIMIT_AS, &lim) == 0;
}

}  // namespace sapiens_seg::test
