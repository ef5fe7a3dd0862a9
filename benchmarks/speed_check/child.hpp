// The parent's side of a worker process: started with its stdin and stdout on pipes (stderr is
// shared, for its logs), one JSON line per request and reply (worker.hpp).
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace speed_check {

class Child {
 public:
  explicit Child(const std::vector<std::string>& argv);
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();  // asks it to quit and waits for it

  // The next line it writes, as JSON.
  nlohmann::json read();
  // Sends `cmd` and returns the reply; throws when the reply is an error or the worker is gone.
  nlohmann::json request(const nlohmann::json& cmd);

 private:
  std::string how_it_ended();

  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

// Runs argv to completion (stdout and stderr shared with this process); its exit status.
int run_command(const std::vector<std::string>& argv);

}  // namespace speed_check
