#include "download.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include <curl/curl.h>

#include "../core/settings.hpp"
#include "log.hpp"
#include "sapiens_seg/error.hpp"
#include "sapiens_seg/version.hpp"
#include "sha256.hpp"

namespace sapiens_seg::io {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string errno_text(int err) {
  std::string s = std::strerror(err);
  if (err == ENOSPC) s += " (disk full)";
  if (err == EFBIG) s += " (file size limit reached)";
  return s;
}

// An exclusive flock on `path` for the lifetime of the object.
class FileLock {
 public:
  FileLock(const std::string& path, const std::string& label, const ProgressCallback& progress,
           const std::atomic<bool>* cancel) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw Error(ErrorCode::kIo, "cannot create lock file " + path + ": " + errno_text(errno));
    }
    bool told = false;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        const int err = errno;
        ::close(fd_);
        throw Error(ErrorCode::kIo, "cannot lock " + path + ": " + errno_text(err));
      }
      if (!told) {
        log(Level::kWarn, "waiting for another process that is downloading " + label);
        told = true;
      }
      if ((cancel && cancel->load()) || (progress && !progress(DownloadProgress{label, 0, 0, 0}))) {
        ::close(fd_);
        throw Error(ErrorCode::kDownloadFailed, "download of " + label + " cancelled");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the flock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// State of one transfer attempt, shared with libcurl's callbacks.
struct Transfer {
  CURL* curl = nullptr;
  std::FILE* part = nullptr;
  Sha256* sha = nullptr;
  std::uint64_t have = 0;         // bytes in the .part file (and in the hash)
  std::uint64_t resume_from = 0;  // what this attempt asked for
  std::uint64_t total = 0;        // full size when known
  bool decided = false;           // status of the body's response checked
  bool restarted = false;         // the server ignored the range: started from zero
  long http_status = 0;
  int write_errno = 0;
  bool cancelled = false;
  std::string content_range;
  std::string label;
  const ProgressCallback* progress = nullptr;
  const std::atomic<bool>* cancel = nullptr;
  Clock::time_point started = Clock::now(), last_report{};
  std::uint64_t started_at = 0;
  std::string error_body;  // first bytes of an error response, for the message
};

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) t->content_range.clear();  // a new response (redirects)
  std::string lower = line;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.rfind("content-range:", 0) == 0) {
    t->content_range = line.substr(14);
    while (!t->content_range.empty() &&
           (t->content_range.back() == '\r' || t->content_range.back() == '\n')) {
      t->content_range.pop_back();
    }
  }
  return size * n;
}

// Decides, at the first byte of the final response, whether the body continues the .part file.
bool decide(Transfer* t) {
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &t->http_status);
  t->decided = true;
  if (t->http_status == 206) {
    // "bytes START-END/TOTAL": the body must start where the .part file ends.
    unsigned long long start = 0, end = 0, total = 0;
    if (std::sscanf(t->content_range.c_str(), " bytes %llu-%llu/%llu", &start, &end, &total) >= 2 &&
        start == t->resume_from) {
      if (total > 0) t->total = total;
      return true;
    }
    log(Level::kWarn, "server answered a range request with another range; starting over");
  } else if (t->http_status != 200) {
    return false;
  }
  if (t->have > 0) {
    // 200 to a range request: the server ignores ranges, so the body is the whole file.
    if (std::fflush(t->part) != 0 || ::ftruncate(fileno(t->part), 0) != 0) {
      t->write_errno = errno;
      return false;
    }
    std::rewind(t->part);
    t->sha->reset();
    t->have = 0;
    t->restarted = true;
  }
  return true;
}

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t bytes = size * n;
  if (!t->decided && !decide(t)) {
    if (t->http_status >= 400) {
      t->error_body.append(
          data,
          std::min<std::size_t>(bytes, 300 - std::min<std::size_t>(300, t->error_body.size())));
      return bytes;  // keep reading the (small) error body, write nothing
    }
    return 0;
  }
  if (t->http_status >= 400) {
    return bytes;
  }
  if (std::fwrite(data, 1, bytes, t->part) != bytes) {
    t->write_errno = errno ? errno : EIO;
    return 0;  // aborts the transfer with CURLE_WRITE_ERROR
  }
  t->sha->update(data, bytes);
  t->have += bytes;
  return bytes;
}

int on_progress(void* user, curl_off_t dltotal, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->total == 0 && dltotal > 0 && t->decided && t->http_status == 200) {
    t->total = static_cast<std::uint64_t>(dltotal);
  }
  if (t->cancel && t->cancel->load()) {
    t->cancelled = true;
    return 1;
  }
  const auto now = Clock::now();
  if (t->progress && *t->progress && now - t->last_report > std::chrono::milliseconds(200)) {
    t->last_report = now;
    const double secs = std::chrono::duration<double>(now - t->started).count();
    const double rate = secs > 0 && t->have >= t->started_at
                            ? static_cast<double>(t->have - t->started_at) / secs
                            : 0.0;
    if (!(*t->progress)(DownloadProgress{t->label, t->have, t->total, rate})) {
      t->cancelled = true;
      return 1;
    }
  }
  return 0;
}

bool retriable(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_COULDNT_RESOLVE_HOST:
      return true;
    default:
      return false;
  }
}

bool loopback_http(const std::string& url) {
  for (const char* p : {"http://127.", "http://localhost:", "http://localhost/", "http://[::1]"}) {
    if (url.rfind(p, 0) == 0) return true;
  }
  return false;
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

bool url_allowed(const std::string& url) {
  return url.rfind("https://", 0) == 0 || loopback_http(url);
}

DownloadResult download(const DownloadRequest& req) {
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (!url_allowed(req.url)) {
    throw Error(ErrorCode::kDownloadFailed,
                "refusing to download " + req.label + " over " + req.url +
                    ": only https (or http to this machine) is allowed");
  }
  // Read before any file is created or locked: a malformed value fails the call at once.
  const core::Settings settings = core::read_settings();
  const long max_attempts = settings.download_retries.value() + 1;
  const long backoff_ms = settings.retry_base_ms.value();
  const long low_speed_time = settings.low_speed_time.value();
  const fs::path dest(req.dest), part(req.dest + ".part");
  std::error_code ec;
  fs::create_directories(dest.parent_path(), ec);
  if (ec) {
    throw Error(ErrorCode::kIo,
                "cannot create " + dest.parent_path().string() + ": " + ec.message());
  }
  FileLock lock(req.dest + ".lock", req.label, req.progress, req.cancel);
  if (fs::exists(dest, ec)) return {"", false};  // another process finished it while we waited

  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(part.c_str(), "a+b"),
                                                       &std::fclose);
  if (!file) {
    throw Error(ErrorCode::kIo, "cannot write " + part.string() + ": " + errno_text(errno));
  }
  // The hash covers the whole file: a resumed download first hashes what is already there.
  Sha256 sha;
  std::uint64_t have = 0;
  {
    std::vector<char> buf(4u << 20);
    std::rewind(file.get());
    for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), file.get())) > 0;) {
      sha.update(buf.data(), n);
      have += n;
    }
    std::fseek(file.get(), 0, SEEK_END);
  }
  if (req.size && have > *req.size) {  // longer than the file can be: start over
    if (::ftruncate(fileno(file.get()), 0) != 0) {
      throw Error(ErrorCode::kIo, "cannot truncate " + part.string() + ": " + errno_text(errno));
    }
    std::rewind(file.get());
    sha.reset();
    have = 0;
  }

  // A failure before the first byte leaves no empty .part behind.
  struct DropEmptyPart {
    const fs::path& part;
    ~DropEmptyPart() {
      std::error_code e;
      if (fs::exists(part, e) && fs::file_size(part, e) == 0) fs::remove(part, e);
    }
  } drop_empty{part};
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), &curl_easy_cleanup);
  if (!curl) throw Error(ErrorCode::kInternal, "libcurl initialisation failed");
  const std::string agent =
      std::string("sapiens-seg/") + SAPIENS_SEG_VERSION + " " + curl_version();
  const std::string& token = settings.hf_token;
  const bool send_token = (req.use_hf_token || settings.use_hf_token) && !token.empty();
  const char* protocols = loopback_http(req.url) ? "http,https" : "https";
  std::string last_error;
  bool resolve_failed_before = false;

  for (long attempt = 1; attempt <= max_attempts; ++attempt) {
    Transfer t;
    t.curl = curl.get();
    t.part = file.get();
    t.sha = &sha;
    t.have = have;
    t.resume_from = have;
    t.total = req.size.value_or(0);
    t.label = req.label;
    t.progress = &req.progress;
    t.cancel = req.cancel;
    t.started_at = have;
    char errbuf[CURL_ERROR_SIZE] = {0};

    CURL* c = curl.get();
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, protocols);
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, protocols);
    curl_easy_setopt(c, CURLOPT_USERAGENT, agent.c_str());
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, low_speed_time);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
    // A plain Range header (not CURLOPT_RESUME_FROM, which fails outright when the server
    // ignores ranges): decide() checks the answer and restarts from zero on a 200.
    const std::string range = std::to_string(have) + "-";
    if (have > 0) curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
    if (send_token) {
      // Bearer auth through libcurl is not forwarded to another host on a redirect (the Hub
      // redirects file downloads to a CDN).
      curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
      curl_easy_setopt(c, CURLOPT_XOAUTH2_BEARER, token.c_str());
    }

    const CURLcode rc = curl_easy_perform(c);
    have = t.have;
    if (t.write_errno != 0) {
      throw Error(ErrorCode::kIo, "cannot write " + part.string() + ": " +
                                      errno_text(t.write_errno) + ". The partial download (" +
                                      std::to_string(have) +
                                      " bytes) is kept to resume later; delete it to free space.");
    }
    if (t.cancelled) {
      throw Error(ErrorCode::kDownloadFailed, "download of " + req.label + " cancelled at " +
                                                  std::to_string(have) + " bytes (kept to resume)");
    }
    if (t.http_status == 416) {  // the range is past the end: the .part is stale, start over
      if (::ftruncate(fileno(file.get()), 0) != 0) {
        throw Error(ErrorCode::kIo, "cannot truncate " + part.string() + ": " + errno_text(errno));
      }
      std::rewind(file.get());
      sha.reset();
      have = 0;
      last_error = "HTTP 416 (range not satisfiable)";
      continue;
    }
    const bool http_ok = t.http_status == 200 || t.http_status == 206;
    if (rc == CURLE_OK && http_ok) {
      if (t.restarted)
        log(Level::kInfo, req.label + ": server ignored the range; downloaded from zero");
      break;
    }
    if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && t.http_status >= 300)) {
      last_error = "HTTP " + std::to_string(t.http_status);
      const bool retry = t.http_status >= 500 || t.http_status == 429 || t.http_status == 408;
      if (!retry) {
        std::string hint;
        if (t.http_status == 401 || t.http_status == 403) {
          hint = send_token ? " (the HF_TOKEN sent was refused)"
                            : " (for gated or private files set HF_TOKEN and opt in with "
                              "SAPIENS_SEG_USE_HF_TOKEN=1 or --use-hf-token)";
        }
        throw Error(ErrorCode::kDownloadFailed, "download of " + req.label + " from " + req.url +
                                                    " failed: " + last_error + hint);
      }
    } else {
      last_error =
          std::string(curl_easy_strerror(rc)) + (errbuf[0] ? std::string(": ") + errbuf : "");
      if (!retriable(rc)) {
        throw Error(ErrorCode::kDownloadFailed,
                    "download of " + req.label + " from " + req.url + " failed: " + last_error);
      }
      // A name that does not resolve is rarely fixed by waiting: one more try, then give up.
      if (rc == CURLE_COULDNT_RESOLVE_HOST) {
        if (resolve_failed_before) attempt = max_attempts;
        resolve_failed_before = true;
      }
    }
    if (attempt < max_attempts) {
      // Capped before shifting: up to 100 retries would shift past the width of a long.
      const long wait = attempt > 16 ? 30000L : std::min(backoff_ms << (attempt - 1), 30000L);
      log(Level::kWarn, req.label + ": " + last_error + "; retrying in " + std::to_string(wait) +
                            " ms (attempt " + std::to_string(attempt + 1) + " of " +
                            std::to_string(max_attempts) + ", " + std::to_string(have) +
                            " bytes kept)");
      std::this_thread::sleep_for(std::chrono::milliseconds(wait));
    } else {
      throw Error(ErrorCode::kDownloadFailed, "download of " + req.label + " from " + req.url +
                                                  " failed after " + std::to_string(max_attempts) +
                                                  " attempts: " + last_error);
    }
  }
  if (req.progress) req.progress(DownloadProgress{req.label, have, have, 0});

  if (std::fflush(file.get()) != 0 || ::fsync(fileno(file.get())) != 0) {
    throw Error(ErrorCode::kIo, "cannot write " + part.string() + ": " + errno_text(errno));
  }
  file.reset();
  const std::string actual = sha.hex();
  if (req.size && have != *req.size) {
    fs::remove(part, ec);
    throw Error(ErrorCode::kChecksumMismatch, "downloaded " + req.label + " is " +
                                                  std::to_string(have) + " bytes, expected " +
                                                  std::to_string(*req.size) + "; it was discarded");
  }
  if (req.sha256 && actual != *req.sha256) {
    fs::remove(part, ec);
    throw Error(ErrorCode::kChecksumMismatch,
                "checksum mismatch for the download of " + req.label + " from " + req.url +
                    "\n  expected sha256 " + *req.sha256 + "\n  actual   sha256 " + actual +
                    "\n  the file was discarded; nothing was added to the cache");
  }
  fs::rename(part, dest, ec);
  if (ec)
    throw Error(ErrorCode::kIo,
                "cannot move the download into " + dest.string() + ": " + ec.message());
  fsync_dir(dest.parent_path());
  return {actual, true};
}

}  // namespace sapiens_seg::io
