#include "serve/server.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "sapiens_seg/names.hpp"
#include "sapiens_seg/sapiens_seg.hpp"
#include "serve/assets.hpp"
#include "serve/batcher.hpp"
#include "serve/encode.hpp"
#include "serve/metrics.hpp"
#include "serve/request.hpp"

namespace sapiens_seg::serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Request = http::request<http::string_body>;

namespace {

// What a handler answers; the session turns it into the HTTP response.
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<http::field, std::string>> headers;
  bool close = false;     // close the connection after it (the request's body was not read)
  bool no_reply = false;  // the client has gone: nothing to write
};

Reply json_reply(int status, const nlohmann::ordered_json& j) {
  return {status,
          "application/json",
          j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace),
          {}};
}

Reply error_reply(int status, ErrorCode code, const std::string& message) {
  return json_reply(status,
                    {{"error", {{"code", std::string(to_string(code))}, {"message", message}}}});
}

// Equal in time that depends only on `secret`'s length, never on where `given` differs.
bool same_key(std::string_view given, std::string_view secret) {
  unsigned diff = given.size() == secret.size() ? 0u : 1u;
  for (std::size_t k = 0; k < secret.size(); ++k) {
    const char g = k < given.size() ? given[k] : '\0';
    diff |= static_cast<unsigned>(static_cast<unsigned char>(g ^ secret[k]));
  }
  return diff == 0;
}

bool iequals(std::string_view a, std::string_view b) {
  return beast::iequals(a, b);
}

// Runs `f` on the request threads and resumes the calling coroutine on its own (the socket
// thread) with the value or the exception.
template <typename F>
asio::awaitable<std::invoke_result_t<F&>> on_pool(asio::thread_pool& pool, F f) {
  using T = std::invoke_result_t<F&>;
  const auto io = co_await asio::this_coro::executor;
  co_return co_await asio::async_initiate<const asio::use_awaitable_t<>&,
                                          void(std::exception_ptr, T)>(
      [&pool, &f, io](auto handler) {
        asio::post(pool, [&f, io, work = asio::make_work_guard(io),
                          handler = std::move(handler)]() mutable {
          std::exception_ptr error;
          T value{};
          try {
            value = f();
          } catch (...) {
            error = std::current_exception();
          }
          asio::post(io, [handler = std::move(handler), error, value = std::move(value)]() mutable {
            std::move(handler)(error, std::move(value));
          });
        });
      },
      asio::use_awaitable);
}

// The routes, by path; the label of each in the metrics.
enum class Route { kPage, kHealth, kReady, kModels, kMetrics, kOpenApi, kSegment, kUnknown };

Route route_of(std::string_view path) {
  if (path == "/") return Route::kPage;
  if (path == "/health") return Route::kHealth;
  if (path == "/ready") return Route::kReady;
  if (path == "/v1/models") return Route::kModels;
  if (path == "/metrics") return Route::kMetrics;
  if (path == "/openapi.json") return Route::kOpenApi;
  if (path == "/v1/segment") return Route::kSegment;
  return Route::kUnknown;
}

std::string endpoint_label(Route r) {
  switch (r) {
    case Route::kPage:
      return "/";
    case Route::kHealth:
      return "/health";
    case Route::kReady:
      return "/ready";
    case Route::kModels:
      return "/v1/models";
    case Route::kMetrics:
      return "/metrics";
    case Route::kOpenApi:
      return "/openapi.json";
    case Route::kSegment:
      return "/v1/segment";
    case Route::kUnknown:
      break;
  }
  return "other";
}

// The status a library error gets when it happens to an image that passed the header checks.
int status_of(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidInput:
      return 422;  // well-formed header, undecodable data
    case ErrorCode::kOutOfMemory:
    case ErrorCode::kBackendUnavailable:
      return 503;
    default:
      return 500;
  }
}

struct LoadedModel {
  std::string id;
  Model model;
  std::unique_ptr<Batcher> batcher;
};

class Server {
 public:
  Server(ServerConfig config, LoadOptions load)
      : config_(std::move(config)),
        load_(std::move(load)),
        pool_(static_cast<std::size_t>(config_.request_threads > 0
                                           ? config_.request_threads
                                           : std::max(1u, std::thread::hardware_concurrency()))),
        metrics_() {}
  ~Server() {
    if (loader_.joinable()) loader_.detach();  // only after _Exit was skipped: never loading
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int run();

 private:
  asio::awaitable<void> accept_loop();
  asio::awaitable<void> session(tcp::socket socket);
  asio::awaitable<void> refuse_connection(tcp::socket socket);
  asio::awaitable<Reply> handle(Request& req, Route route, beast::tcp_stream& stream);
  asio::awaitable<Reply> segment(Request& req, beast::tcp_stream& stream);
  asio::awaitable<void> wait_for(beast::tcp_stream& stream, const std::shared_ptr<Job>& job,
                                 asio::steady_timer& timer);
  Reply get(Route route, bool head);
  Reply models_reply() const;
  Reply unavailable(const std::string& why, const std::string& reason);
  std::optional<Reply> precheck(const Request& req, Route route);
  void load_models();
  void on_signal(int signo);
  void check_drained();
  template <typename Body>
  static void set_common(http::response<Body>& res);

  ServerConfig config_;
  LoadOptions load_;
  asio::io_context io_{1};
  asio::thread_pool pool_;
  std::optional<tcp::acceptor> acceptor_;
  Metrics metrics_;
  std::string api_key_;
  std::vector<LoadedModel> models_;  // filled on the socket thread once all are loaded
  bool ready_ = false;
  bool draining_ = false;
  std::optional<Error> load_error_;
  std::thread loader_;
  std::atomic<bool> loader_done_{false};
  std::atomic<bool> cancel_load_{false};
  std::optional<asio::steady_timer> drain_timer_;
  int exit_status_ = 0;
};

template <typename Body>
void Server::set_common(http::response<Body>& res) {
  res.set(http::field::server, std::string("sapiens-seg/") + version());
  res.set(http::field::cache_control, "no-store");
}

Reply Server::unavailable(const std::string& why, const std::string& reason) {
  metrics_.rejection(reason);
  Reply r = error_reply(503, ErrorCode::kBackendUnavailable, why);
  r.headers.emplace_back(http::field::retry_after, std::to_string(config_.retry_after_s));
  return r;
}

Reply Server::models_reply() const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& m : models_) {
    const ModelInfo& info = m.model.info();
    nlohmann::ordered_json palette = nlohmann::ordered_json::array();
    for (const auto& c : info.palette) palette.push_back({c[0], c[1], c[2]});
    list.push_back({{"id", m.id},
                    {"family", info.family},
                    {"classes", info.classes},
                    {"palette", palette},
                    {"input_size", {info.input_height, info.input_width}},
                    {"device", info.backend.device},
                    {"dtype", info.backend.dtype},
                    {"mode", info.backend.mode},
                    {"max_batch", config_.max_batch},
                    {"max_delay_ms", config_.max_delay_ms},
                    {"max_queue", config_.max_queue}});
  }
  return json_reply(200, {{"models", list}});
}

Reply Server::get(Route route, bool head) {
  (void)head;
  switch (route) {
    case Route::kHealth:
      return json_reply(200, {{"status", "ok"}});
    case Route::kReady:
      if (ready_ && !draining_) return json_reply(200, {{"status", "ready"}});
      {
        Reply r = json_reply(503, {{"status", draining_ ? "draining" : "loading"}});
        r.headers.emplace_back(http::field::retry_after, std::to_string(config_.retry_after_s));
        return r;
      }
    case Route::kModels:
      return models_reply();
    case Route::kMetrics:
      return {200,
              "text/plain; version=0.0.4; charset=utf-8",
              metrics_.text([this](const std::string& id) -> std::size_t {
                for (const auto& m : models_) {
                  if (m.id == id) return m.batcher->depth();
                }
                return 0;
              }),
              {}};
    case Route::kOpenApi:
      return {200, "application/json", std::string(openapi_json()), {}};
    case Route::kPage:
      return {200, "text/html; charset=utf-8", std::string(page_html()), {}};
    default:
      return error_reply(404, ErrorCode::kNotFound, "no such endpoint");
  }
}

// Refusals decided from the request line and headers alone, before the body is read.
std::optional<Reply> Server::precheck(const Request& req, Route route) {
  if (route == Route::kUnknown) {
    return error_reply(404, ErrorCode::kNotFound,
                       "no such endpoint (see /openapi.json for the endpoints)");
  }
  const bool post = route == Route::kSegment;
  const auto method = req.method();
  const bool allowed =
      post ? method == http::verb::post : (method == http::verb::get || method == http::verb::head);
  if (!allowed) {
    Reply r = error_reply(405, ErrorCode::kInvalidInput, "method not allowed here");
    r.headers.emplace_back(http::field::allow, post ? "POST" : "GET, HEAD");
    return r;
  }
  const bool probe = route == Route::kHealth || route == Route::kReady ||
                     route == Route::kMetrics || route == Route::kPage;
  if (!api_key_.empty() && !probe) {
    std::string_view given;
    const auto auth = req.find(http::field::authorization);
    const auto key = req.find("X-API-Key");
    if (auth != req.end() && auth->value().size() > 7 &&
        iequals(auth->value().substr(0, 7), "Bearer ")) {
      given = auth->value().substr(7);
    } else if (key != req.end()) {
      given = key->value();
    }
    if (given.empty() || !same_key(given, api_key_)) {
      metrics_.rejection("unauthorized");
      Reply r = error_reply(401, ErrorCode::kInvalidInput,
                            "a valid API key is needed (Authorization: Bearer KEY, or X-API-Key)");
      r.headers.emplace_back(http::field::www_authenticate, "Bearer");
      return r;
    }
  }
  if (post) {
    if (draining_) return unavailable("the server is shutting down", "draining");
    if (!ready_) return unavailable("the models are still loading", "not_ready");
  }
  return std::nullopt;
}

asio::awaitable<Reply> Server::handle(Request& req, Route route, beast::tcp_stream& stream) {
  if (route == Route::kSegment) co_return co_await segment(req, stream);
  co_return get(route, req.method() == http::verb::head);
}

asio::awaitable<void> Server::wait_for(beast::tcp_stream& stream, const std::shared_ptr<Job>& job,
                                       asio::steady_timer& timer) {
  // While the request waits, a readable socket means either the client's next pipelined request
  // or that the client has gone (EOF, reset): in the second case the worker drops the job.
  auto watching = std::make_shared<bool>(true);
  tcp::socket& socket = stream.socket();
  socket.async_wait(
      tcp::socket::wait_read, [job, watching, &socket](const boost::system::error_code& ec) {
        if (ec || !*watching) return;
        char c = 0;
        const ssize_t n = ::recv(socket.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
          job->abandoned = true;
        }
      });
  boost::system::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  *watching = false;
  socket.cancel(ec);
}

asio::awaitable<Reply> Server::segment(Request& req, beast::tcp_stream& stream) {
  SegmentRequest sr;
  const std::string_view target = req.target();
  const std::size_t q = target.find('?');
  if (q != std::string_view::npos) apply_query(parse_query(target.substr(q + 1)), sr);
  const std::string content_type(req[http::field::content_type]);
  std::string body = std::move(req.body());
  sr = co_await on_pool(pool_, [&]() {
    read_body(content_type, std::move(body), sr);
    return std::move(sr);
  });

  LoadedModel* m = sr.model.empty() ? &models_.front() : nullptr;
  for (auto& candidate : models_) {
    if (!m && candidate.id == sr.model) m = &candidate;
  }
  if (m == nullptr) {
    co_return error_reply(404, ErrorCode::kNotFound,
                          "no model '" + sr.model.substr(0, 200) + "' is loaded (see /v1/models)");
  }
  ClassSet shown;
  try {
    shown = parse_classes(sr.classes, m->model.info().classes);
  } catch (const Error& e) {
    co_return error_reply(400, e.code(), e.what());
  }

  if (sniff_format(sr.image).empty()) {
    metrics_.rejection("unsupported_media_type");
    co_return error_reply(415, ErrorCode::kInvalidInput,
                          "the body is not an image the server decodes (JPEG, PNG, WebP, TIFF, "
                          "BMP, PNM)");
  }
  ImageInfo info;
  try {
    info = read_image_info(reinterpret_cast<const std::uint8_t*>(sr.image.data()), sr.image.size());
  } catch (const Error& e) {
    co_return error_reply(400, ErrorCode::kInvalidInput, e.what());
  }
  const auto pixels =
      static_cast<std::uint64_t>(info.width) * static_cast<std::uint64_t>(info.height);
  if (pixels > config_.max_pixels) {
    metrics_.rejection("too_large");
    co_return error_reply(413, ErrorCode::kInvalidInput,
                          "the image is " + std::to_string(info.width) + "x" +
                              std::to_string(info.height) + " = " + std::to_string(pixels) +
                              " pixels; this server takes at most " +
                              std::to_string(config_.max_pixels) + " (--max-pixels)");
  }
  if (info.width < 32 || info.height < 32) {
    co_return error_reply(400, ErrorCode::kInvalidInput,
                          "the image is " + std::to_string(info.width) + "x" +
                              std::to_string(info.height) + "; both sides must be at least 32");
  }

  Batcher& batcher = *m->batcher;
  if (!batcher.reserve()) {
    co_return unavailable("the queue of " + m->id + " is full (" +
                              std::to_string(config_.max_queue) + " requests); retry later",
                          "queue_full");
  }
  auto job = std::make_shared<Job>();
  try {
    std::vector<std::uint8_t> bytes(sr.image.begin(), sr.image.end());
    sr.image = {};
    const Model& model = m->model;
    job->prepared =
        co_await on_pool(pool_, [&]() { return model.prepare(Input::encoded(std::move(bytes))); });
  } catch (...) {
    batcher.release();
    const Error e = as_error(std::current_exception(), "decoding the image");
    co_return error_reply(status_of(e.code()), e.code(), e.what());
  }
  asio::steady_timer timer(io_, asio::steady_timer::time_point::max());
  auto* timer_ptr = &timer;
  const auto io = io_.get_executor();
  // The worker's thread signals the socket thread by expiring the timer there; an expired
  // timer also completes a wait started later, so the order of the two does not matter.
  job->done = [io, timer_ptr] {
    asio::post(io, [timer_ptr] { timer_ptr->expires_at(asio::steady_timer::time_point::min()); });
  };
  batcher.submit(job);
  co_await wait_for(stream, job, timer);

  if (job->dropped) {
    metrics_.rejection("client_gone");
    Reply r;
    r.no_reply = true;
    co_return r;
  }
  if (job->error) {
    co_return error_reply(status_of(job->error->code()), job->error->code(), job->error->what());
  }
  const std::string id = m->id;
  try {
    Reply r;
    r.body = co_await on_pool(pool_, [&]() -> std::string {
      const Result& res = *job->result;
      switch (sr.output) {
        case Output::kPng:
          return labels_png(res);
        case Output::kNpy:
          return labels_npy(res);
        case Output::kOverlay:
          return overlay_png(res, job->prepared.image(), sr.opacity, shown);
        case Output::kJson:
          break;
      }
      SummaryOptions o;
      o.model = id;
      o.shown = shown;
      o.rle = sr.rle;
      o.queue_ms = job->queue_ms;
      return summary_json(res, o);
    });
    r.content_type = sr.output == Output::kJson  ? "application/json"
                     : sr.output == Output::kNpy ? "application/octet-stream"
                                                 : "image/png";
    if (sr.output == Output::kNpy) {
      r.headers.emplace_back(http::field::content_disposition,
                             "attachment; filename=\"labels.npy\"");
    }
    co_return r;
  } catch (...) {
    const Error e = as_error(std::current_exception(), "encoding the response");
    co_return error_reply(status_of(e.code()), e.code(), e.what());
  }
}

asio::awaitable<void> Server::refuse_connection(tcp::socket socket) {
  metrics_.rejection("connections");
  beast::tcp_stream stream(std::move(socket));
  http::response<http::string_body> res{http::status::service_unavailable, 11};
  set_common(res);
  res.set(http::field::content_type, "application/json");
  res.set(http::field::retry_after, std::to_string(config_.retry_after_s));
  res.keep_alive(false);
  res.body() =
      error_reply(503, ErrorCode::kBackendUnavailable, "too many connections (--max-connections)")
          .body;
  res.prepare_payload();
  stream.expires_after(std::chrono::seconds(2));
  boost::system::error_code ec;
  co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
}

asio::awaitable<void> Server::session(tcp::socket socket) {
  auto& connections = metrics_.connections();
  ++connections;
  struct Count {
    std::atomic<std::int64_t>& n;
    ~Count() { --n; }
  } count{connections};
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  const auto seconds = [](double s) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(s));
  };
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(config_.max_header_bytes);
    parser.body_limit(config_.max_body_bytes);
    boost::system::error_code ec;
    stream.expires_after(seconds(config_.header_timeout_s));
    co_await http::async_read_header(stream, buffer, parser,
                                     asio::redirect_error(asio::use_awaitable, ec));
    Reply reply;
    Route route = Route::kUnknown;
    bool read_body = false;
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted) {
      break;  // the client closed between requests
    } else if (ec == beast::error::timeout) {
      // tcp_stream closed the socket when its deadline passed, so there is nobody to answer: a
      // client too slow with its headers (slowloris) is cut off, an idle one just closed.
      if (parser.got_some() || buffer.size() > 0) metrics_.rejection("timeout");
      break;
    } else if (ec == http::error::body_limit) {  // the parser checks Content-Length itself
      metrics_.rejection("too_large");
      reply = error_reply(413, ErrorCode::kInvalidInput,
                          "the body is over " + std::to_string(config_.max_body_bytes) +
                              " bytes (--max-body-bytes)");
      reply.close = true;
    } else if (ec == http::error::header_limit) {
      metrics_.rejection("headers_too_large");
      reply = error_reply(
          431, ErrorCode::kInvalidInput,
          "the request headers exceed " + std::to_string(config_.max_header_bytes) + " bytes");
      reply.close = true;
    } else if (ec) {
      metrics_.rejection("bad_request");
      reply = error_reply(400, ErrorCode::kInvalidInput,
                          "malformed HTTP request (" + ec.message() + ")");
      reply.close = true;
    } else {
      const Request& head = parser.get();
      const std::string_view target = head.target();
      route = route_of(target.substr(0, target.find('?')));
      const auto fields = std::distance(head.begin(), head.end());
      const bool has_body = parser.content_length().value_or(0) > 0 || parser.chunked();
      if (fields > config_.max_headers) {
        metrics_.rejection("headers_too_large");
        reply = error_reply(431, ErrorCode::kInvalidInput,
                            "more than " + std::to_string(config_.max_headers) + " header fields");
        reply.close = true;
      } else if (parser.content_length() && *parser.content_length() > config_.max_body_bytes) {
        metrics_.rejection("too_large");
        reply = error_reply(413, ErrorCode::kInvalidInput,
                            "the body is " + std::to_string(*parser.content_length()) +
                                " bytes; this server takes at most " +
                                std::to_string(config_.max_body_bytes) + " (--max-body-bytes)");
        reply.close = true;
      } else if (auto refusal = precheck(head, route)) {
        reply = std::move(*refusal);
        reply.close = has_body;
      } else {
        read_body = true;
      }
    }

    // In flight from here until the reply is written: what a drain waits for.
    auto& in_flight = metrics_.in_flight();
    ++in_flight;
    struct Flight {
      Server& s;
      ~Flight() {
        --s.metrics_.in_flight();
        s.check_drained();
      }
    } flight{*this};

    bool keep_alive = !reply.close && parser.is_header_done() && parser.get().keep_alive();
    const unsigned version = parser.is_header_done() ? parser.get().version() : 11;
    const bool head_only = parser.is_header_done() && parser.get().method() == http::verb::head;
    if (read_body) {
      if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
        http::response<http::empty_body> cont{http::status::continue_, version};
        stream.expires_after(seconds(config_.write_timeout_s));
        co_await http::async_write(stream, cont, asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
      }
      stream.expires_after(seconds(config_.body_timeout_s));
      co_await http::async_read(stream, buffer, parser,
                                asio::redirect_error(asio::use_awaitable, ec));
      if (ec == http::error::body_limit) {
        metrics_.rejection("too_large");
        reply = error_reply(413, ErrorCode::kInvalidInput,
                            "the body exceeds " + std::to_string(config_.max_body_bytes) +
                                " bytes (--max-body-bytes)");
        keep_alive = false;
      } else if (ec == beast::error::timeout) {
        metrics_.rejection("timeout");  // the socket is closed already (see above)
        break;
      } else if (ec == http::error::partial_message || ec == http::error::end_of_stream ||
                 ec == asio::error::eof) {
        metrics_.rejection("truncated");
        reply = error_reply(400, ErrorCode::kInvalidInput,
                            "the request body ended before its announced length");
        keep_alive = false;
      } else if (ec) {
        metrics_.rejection("bad_request");
        reply = error_reply(400, ErrorCode::kInvalidInput,
                            "malformed HTTP request body (" + ec.message() + ")");
        keep_alive = false;
      } else {
        stream.expires_never();  // inference has no deadline here: the queue bounds it
        Request req = parser.release();
        try {
          reply = co_await handle(req, route, stream);
        } catch (const HttpError& e) {
          if (!e.reason.empty()) metrics_.rejection(e.reason);
          reply = error_reply(e.status, e.code, e.what());
        } catch (...) {
          const Error e = as_error(std::current_exception(), "handling the request");
          reply = error_reply(e.code() == ErrorCode::kOutOfMemory ? 503 : 500, e.code(), e.what());
        }
        if (reply.close) keep_alive = false;
      }
    }
    if (reply.no_reply) break;
    if (draining_) keep_alive = false;

    http::response<http::string_body> res{static_cast<http::status>(reply.status), version};
    set_common(res);
    res.set(http::field::content_type, reply.content_type);
    for (auto& [field, value] : reply.headers) res.set(field, value);
    res.body() = std::move(reply.body);
    res.keep_alive(keep_alive);
    res.prepare_payload();
    metrics_.request(endpoint_label(route), reply.status);
    stream.expires_after(seconds(config_.write_timeout_s));
    if (head_only) {
      http::response_serializer<http::string_body> sr{res};
      co_await http::async_write_header(stream, sr, asio::redirect_error(asio::use_awaitable, ec));
    } else {
      co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
    }
    if (ec || !keep_alive) break;
  }
  boost::system::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream.close();
}

asio::awaitable<void> Server::accept_loop() {
  for (;;) {
    boost::system::error_code ec;
    tcp::socket socket =
        co_await acceptor_->async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::operation_aborted || !acceptor_->is_open()) co_return;
    if (ec) {
      // Out of file descriptors and the like: wait a little instead of spinning.
      asio::steady_timer pause(io_, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    if (metrics_.connections().load() >= config_.max_connections) {
      asio::co_spawn(io_, refuse_connection(std::move(socket)), asio::detached);
    } else {
      asio::co_spawn(io_, session(std::move(socket)), asio::detached);
    }
  }
}

void Server::load_models() {
  std::vector<std::pair<std::string, Model>> loaded;
  try {
    for (const auto& name : config_.models) {
      Model model = load(name, load_);
      const ModelInfo& info = model.info();
      for (const auto& [id, _] : loaded) {
        if (id == info.id) {
          throw Error(ErrorCode::kInvalidInput,
                      "--model " + name + " is " + id + " again: each model is served once");
        }
      }
      std::fprintf(stderr, "sapiens-seg serve: loaded %s (%s, %s, %s)\n", info.id.c_str(),
                   info.backend.mode.c_str(), info.backend.device.c_str(),
                   info.backend.dtype.c_str());
      loaded.emplace_back(info.id, std::move(model));
    }
  } catch (...) {
    Error e = as_error(std::current_exception(), "loading the models");
    asio::post(io_, [this, e] {
      load_error_ = e;
      io_.stop();
    });
    loader_done_ = true;
    return;
  }
  asio::post(io_, [this, loaded = std::move(loaded)]() mutable {
    BatchSettings settings;
    settings.max_batch = config_.max_batch;
    settings.max_delay =
        std::chrono::microseconds(static_cast<std::int64_t>(config_.max_delay_ms * 1000));
    settings.max_queue = static_cast<std::size_t>(config_.max_queue);
    std::vector<std::string> ids;
    for (const auto& [id, _] : loaded) ids.push_back(id);
    metrics_.set_models(ids);
    for (auto& [id, model] : loaded) {
      models_.push_back({id, model, std::make_unique<Batcher>(model, id, settings, metrics_)});
    }
    ready_ = true;
    std::fprintf(stderr, "sapiens-seg serve: ready\n");
  });
  loader_done_ = true;
}

void Server::on_signal(int signo) {
  if (draining_) {
    std::fprintf(stderr, "sapiens-seg serve: second signal, exiting now\n");
    std::fflush(stderr);
    std::_Exit(128 + signo);
  }
  draining_ = true;
  std::fprintf(stderr,
               "sapiens-seg serve: draining (%s): no new requests; %lld in flight, up to %.0f s\n",
               signo == SIGINT ? "SIGINT" : "SIGTERM",
               static_cast<long long>(metrics_.in_flight().load()), config_.drain_timeout_s);
  // The acceptor stays open: a load balancer's probes must see /ready turn 503, and a new
  // request a 503 with Retry-After rather than a refused connection.
  cancel_load_ = true;
  drain_timer_.emplace(io_, std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(config_.drain_timeout_s)));
  drain_timer_->async_wait([this](const boost::system::error_code& e) {
    if (e) return;
    std::fprintf(stderr,
                 "sapiens-seg serve: drain timeout: %lld requests still in flight are dropped\n",
                 static_cast<long long>(metrics_.in_flight().load()));
    std::fflush(stderr);
    std::_Exit(0);
  });
  check_drained();
}

void Server::check_drained() {
  if (draining_ && metrics_.in_flight().load() == 0) {
    std::fprintf(stderr, "sapiens-seg serve: drained, exiting\n");
    io_.stop();
  }
}

int Server::run() {
  if (!config_.api_key_file.empty()) {
    std::ifstream in(config_.api_key_file, std::ios::binary);
    if (!in)
      throw Error(ErrorCode::kNotFound, "--api-key-file: cannot read " + config_.api_key_file);
    std::stringstream ss;
    ss << in.rdbuf();
    api_key_ = ss.str();
    while (!api_key_.empty() && std::isspace(static_cast<unsigned char>(api_key_.back())))
      api_key_.pop_back();
    if (api_key_.empty())
      throw Error(ErrorCode::kInvalidInput, "--api-key-file: the file is empty");
  }

  boost::system::error_code ec;
  tcp::resolver resolver(io_);
  const auto endpoints =
      resolver.resolve(config_.host, std::to_string(config_.port), tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) {
    throw Error(ErrorCode::kInvalidInput, "--host " + config_.host + ": " + ec.message());
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  acceptor_.emplace(io_);
  acceptor_->open(endpoint.protocol(), ec);
  if (!ec) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(endpoint, ec);
  if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Error(ErrorCode::kIo, "cannot listen on " + config_.host + ":" +
                                    std::to_string(config_.port) + ": " + ec.message());
  }
  const tcp::endpoint bound = acceptor_->local_endpoint();
  const std::string address = bound.address().is_v6() ? "[" + bound.address().to_string() + "]"
                                                      : bound.address().to_string();
  std::printf("listening on http://%s:%u\n", address.c_str(), static_cast<unsigned>(bound.port()));
  std::fflush(stdout);

  asio::signal_set signals(io_, SIGINT, SIGTERM);
  std::function<void(const boost::system::error_code&, int)> on_sig =
      [&](const boost::system::error_code& e, int signo) {
        if (e) return;
        on_signal(signo);
        signals.async_wait(on_sig);
      };
  signals.async_wait(on_sig);

  load_.fetch.cancel = &cancel_load_;
  loader_ = std::thread([this] { load_models(); });
  asio::co_spawn(io_, accept_loop(), asio::detached);
  auto work = asio::make_work_guard(io_);
  io_.run();

  if (!loader_done_) {
    // A signal while loading: nothing was admitted, and a load cannot be interrupted.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(0);
  }
  loader_.join();
  if (load_error_) throw *load_error_;
  for (auto& m : models_) m.batcher->stop();
  pool_.join();
  return exit_status_;
}

}  // namespace

int serve(const ServerConfig& config, const LoadOptions& load) {
  Server server(config, load);
  return server.run();
}

}  // namespace sapiens_seg::serve
