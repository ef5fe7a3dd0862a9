#include "child.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace speed_check {

namespace {
std::vector<char*> c_args(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  return args;
}
}  // namespace

Child::Child(const std::vector<std::string>& argv) {
  int to_child[2], from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  std::vector<char*> args = c_args(argv);
  const int rc = ::posix_spawnp(&pid_, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (rc != 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  in_ = ::fdopen(to_child[1], "w");
  out_ = ::fdopen(from_child[0], "r");
}

Child::~Child() {
  if (in_) {
    std::fputs("{\"cmd\":\"quit\"}\n", in_);
    std::fclose(in_);
  }
  if (out_) std::fclose(out_);
  int status = 0;
  if (pid_ > 0) ::waitpid(pid_, &status, 0);
}

nlohmann::json Child::read() {
  std::string line;
  for (int c; (c = std::fgetc(out_)) != EOF && c != '\n';) line += static_cast<char>(c);
  if (line.empty()) throw std::runtime_error("the worker exited: " + how_it_ended());
  return nlohmann::json::parse(line);
}

nlohmann::json Child::request(const nlohmann::json& cmd) {
  const std::string s = cmd.dump() + "\n";
  if (std::fputs(s.c_str(), in_) < 0 || std::fflush(in_) != 0) {
    throw std::runtime_error("the worker is gone: " + how_it_ended());
  }
  nlohmann::json r = read();
  if (r.contains("error")) throw std::runtime_error(r["error"].get<std::string>());
  return r;
}

// Reaps the worker (its pipe is closed, so it is exiting or gone) and says why it went: a
// SIGKILL nobody sent by hand is usually the kernel's OOM killer, when the columns' models
// together outgrow the machine's memory.
std::string Child::how_it_ended() {
  int status = 0;
  pid_t got = 0;
  for (int i = 0; i < 50 && (got = ::waitpid(pid_, &status, WNOHANG)) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (got != pid_) return "still running, but its pipe is closed";
  pid_ = -1;
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "killed by signal " + std::to_string(sig) +
           (sig == SIGKILL ? " (SIGKILL: the kernel's out-of-memory killer, if nobody sent it; "
                             "run fewer columns at once)"
                           : std::string(" (") + strsignal(sig) + ")");
  }
  return "unknown status";
}

int run_command(const std::vector<std::string>& argv) {
  std::vector<char*> args = c_args(argv);
  pid_t pid = -1;
  if (::posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) return 127;
  int status = 0;
  if (::waitpid(pid, &status, 0) < 0) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace speed_check
