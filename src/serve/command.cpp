#include "serve/command.hpp"

#include <cstdlib>
#include <string>

#include "sapiens_seg/names.hpp"

namespace sapiens_seg::serve {

CLI::App* add_serve_command(CLI::App& app, ServeCommand& command) {
  ServerConfig& c = command.config;
  auto* s = app.add_subcommand(
      "serve",
      "serve models over HTTP: POST /v1/segment, probes, metrics, a web page (docs/serve.md)");
  command.app = s;
  c.models = {std::string(default_model())};
  s->add_option("-m,--model", c.models,
                "card id or checkpoint path; repeat to serve several (the first is the default)")
      ->capture_default_str();
  s->add_option("--host", c.host, "address to listen on (0.0.0.0 or :: for every interface)")
      ->capture_default_str();
  s->add_option("--port", c.port, "TCP port (0: one the kernel picks, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  // The load flags of `segment` (--mode, --device, --dtype, --accept-noncommercial, ...).
  cli::add_option_flags(*s, {OptionGroup::kLoad}, command.load);
  s->add_option("--max-batch", c.max_batch, "most requests in one network batch")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  s->add_option("--max-delay-ms", c.max_delay_ms,
                "how long the oldest queued request waits for others to share its batch")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  s->add_option("--max-queue", c.max_queue,
                "requests admitted per model and not yet in a batch; more are refused with 503")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  s->add_option("--request-threads", c.request_threads,
                "threads that decode and encode images (0: one per core)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  s->add_option("--max-body-bytes", c.max_body_bytes, "largest request body (413 above)")
      ->check(CLI::Range(std::uint64_t{1024}, std::uint64_t{1} << 34))
      ->capture_default_str();
  s->add_option("--max-header-bytes", c.max_header_bytes,
                "largest request line and headers together (431 above)")
      ->check(CLI::Range(1024u, 1u << 20))
      ->capture_default_str();
  s->add_option("--max-headers", c.max_headers, "most header fields in a request (431 above)")
      ->check(CLI::Range(4, 1000))
      ->capture_default_str();
  s->add_option("--max-pixels", c.max_pixels,
                "largest image, width x height from its header before decoding (413 above)")
      ->check(CLI::Range(std::uint64_t{1024}, std::uint64_t{1} << 32))
      ->capture_default_str();
  s->add_option("--max-connections", c.max_connections,
                "open client connections; more are answered 503 and closed")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  s->add_option("--header-timeout", c.header_timeout_s,
                "seconds for a request's headers to arrive (also the keep-alive idle limit)")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  s->add_option("--body-timeout", c.body_timeout_s, "seconds for a request's body to arrive")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  s->add_option("--write-timeout", c.write_timeout_s, "seconds for a response to be sent")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  s->add_option("--drain-timeout", c.drain_timeout_s,
                "after SIGTERM, seconds that queued and running requests get to finish")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  s->add_option("--api-key-file", c.api_key_file,
                "require this file's key (Authorization: Bearer KEY or X-API-Key) on every "
                "endpoint but /, /health, /ready and /metrics")
      ->check(CLI::ExistingFile);
  return s;
}

int run_serve(const ServeCommand& command) {
  return serve(command.config, cli::load_options(command.load));
}

}  // namespace sapiens_seg::serve
