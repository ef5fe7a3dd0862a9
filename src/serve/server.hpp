// The HTTP/1.1 server of `sapiens-seg serve` on Boost.Beast and Asio: one thread does all the
// socket work (accepting, parsing, timers, writing), a pool of request threads decodes and
// encodes images, and one batching worker per model runs the network (batcher.hpp). The routes,
// formats and status codes are those of docs/serve.md and docs/openapi.json.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sapiens_seg/options.hpp"

namespace sapiens_seg::serve {

struct ServerConfig {
  std::vector<std::string> models;  // ids or paths, the first is the default
  std::string host = "127.0.0.1";
  int port = 8080;
  // Batching (per model).
  int max_batch = RunOptions{}.batch_size;
  double max_delay_ms = 5;
  int max_queue = 32;
  // Threads that decode and encode images (0: one per core).
  int request_threads = 0;
  // Limits.
  std::uint64_t max_body_bytes = 32ull << 20;
  std::uint32_t max_header_bytes = 8192;
  int max_headers = 64;
  std::uint64_t max_pixels = 40'000'000;
  int max_connections = 128;
  double header_timeout_s = 10;
  double body_timeout_s = 60;
  double write_timeout_s = 60;
  double drain_timeout_s = 30;
  std::string api_key_file;
  int retry_after_s = 1;
};

// Binds, prints "listening on http://HOST:PORT" on stdout, loads the models (/ready answers 503
// until they are), serves until SIGTERM or SIGINT has drained it; returns the exit status.
// Throws Error when the address cannot be bound or a model cannot be loaded.
int serve(const ServerConfig& config, const LoadOptions& load);

}  // namespace sapiens_seg::serve
