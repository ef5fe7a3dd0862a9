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
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <curl/curl.h>

#include "../core/settings.hpp"
#include "log.hpp"
#include "paths.hpp"
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

// The tuning variables, read before any file is created or locked: a malformed value fails the
// call at once.
struct Tuning {
  long max_attempts = 0;    // the first try and the retries
  long backoff_ms = 0;      // the first wait, doubled after each failed retry up to 30 s
  long low_speed_time = 0;  // seconds below 1 KiB/s before an attempt is given up
};

// Read before any file is created or locked: a malformed value fails the call at once.
Tuning read_tuning(const core::Settings& settings) {
  Tuning t;
  t.max_attempts = settings.download_retries.value() + 1;
  t.backoff_ms = settings.retry_base_ms.value();
  t.low_speed_time = settings.low_speed_time.value();
  return t;
}

// The .part file beside the destination and the SHA-256 of what it holds. The hash covers the
// whole file: a resumed download first hashes what is already there.
class PartFile {
 public:
  PartFile(fs::path path, std::optional<std::uint64_t> size)
      : path_(std::move(path)), file_(std::fopen(path_.c_str(), "a+b"), &std::fclose) {
    if (!file_) {
      throw Error(ErrorCode::kIo, "cannot write " + path_.string() + ": " + errno_text(errno));
    }
    std::vector<char> buf(4u << 20);
    std::rewind(file_.get());
    for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), file_.get())) > 0;) {
      sha_.update(buf.data(), n);
      have += n;
    }
    std::fseek(file_.get(), 0, SEEK_END);
    if (size && have > *size) start_over();  // longer than the file can be
  }

  const fs::path& path() const { return path_; }
  std::FILE* file() const { return file_.get(); }
  Sha256& sha() { return sha_; }

  void start_over() {
    if (::ftruncate(fileno(file_.get()), 0) != 0) {
      throw Error(ErrorCode::kIo, "cannot truncate " + path_.string() + ": " + errno_text(errno));
    }
    std::rewind(file_.get());
    sha_.reset();
    have = 0;
  }

  // On the disk (flushed and synced) and closed; returns the hash of its bytes.
  std::string finish() {
    if (std::fflush(file_.get()) != 0 || ::fsync(fileno(file_.get())) != 0) {
      throw Error(ErrorCode::kIo, "cannot write " + path_.string() + ": " + errno_text(errno));
    }
    file_.reset();
    return sha_.hex();
  }

  std::uint64_t have = 0;  // bytes in the file (and in the hash)

 private:
  fs::path path_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_;
  Sha256 sha_;
};

// A failure before the first byte leaves no empty .part behind.
struct DropEmptyPart {
  const fs::path& part;
  ~DropEmptyPart() {
    std::error_code e;
    if (fs::exists(part, e) && fs::file_size(part, e) == 0) fs::remove(part, e);
  }
};

// What every attempt of one download sends alike.
struct Session {
  Session(const DownloadRequest& req, const core::Settings& settings)
      : agent(std::string("sapiens-seg/") + SAPIENS_SEG_VERSION + " " + curl_version()),
        token(settings.hf_token),
        send_token((req.use_hf_token || settings.use_hf_token) && !token.empty()),
        protocols(loopback_http(req.url) ? "http,https" : "https") {}
  std::string agent, token;
  bool send_token;
  const char* protocols;
};

// Sets up `c` for one attempt that continues the .part file where it ends (`t.have`).
void prepare_attempt(CURL* c, const DownloadRequest& req, const Session& session,
                     long low_speed_time, Transfer& t, char* errbuf) {
  curl_easy_reset(c);
  curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, session.protocols);
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, session.protocols);
  curl_easy_setopt(c, CURLOPT_USERAGENT, session.agent.c_str());
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
  // libcurl keeps its own copy of a string option.
  const std::string range = std::to_string(t.have) + "-";
  if (t.have > 0) curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  if (session.send_token) {
    // Bearer auth through libcurl is not forwarded to another host on a redirect (the Hub
    // redirects file downloads to a CDN).
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
    curl_easy_setopt(c, CURLOPT_XOAUTH2_BEARER, session.token.c_str());
  }
}

// Why an attempt failed, where another attempt may succeed (HTTP 5xx, 429 and 408, and network
// errors); throws where none can.
std::string retriable_failure(const Transfer& t, CURLcode rc, const char* errbuf,
                              const DownloadRequest& req, const Session& session) {
  const std::string what = "download of " + req.label + " from " + req.url + " failed: ";
  if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && t.http_status >= 300)) {
    std::string status = "HTTP " + std::to_string(t.http_status);
    if (t.http_status >= 500 || t.http_status == 429 || t.http_status == 408) return status;
    std::string hint;
    if (t.http_status == 401 || t.http_status == 403) {
      hint = session.send_token ? " (the HF_TOKEN sent was refused)"
                                : " (for gated or private files set HF_TOKEN and opt in with "
                                  "SAPIENS_SEG_USE_HF_TOKEN=1 or --use-hf-token)";
    }
    throw Error(ErrorCode::kDownloadFailed, what + status + hint);
  }
  std::string why =
      std::string(curl_easy_strerror(rc)) + (errbuf[0] ? std::string(": ") + errbuf : "");
  if (!retriable(rc)) throw Error(ErrorCode::kDownloadFailed, what + why);
  return why;
}

// Transfers the rest of the file into the .part file, attempt after attempt, until one ends with
// a complete answer; throws when an attempt fails in a way that waiting cannot fix, or the
// attempts run out.
void fetch(const DownloadRequest& req, const core::Settings& settings, const Tuning& tuning,
           PartFile& part) {
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), &curl_easy_cleanup);
  if (!curl) throw Error(ErrorCode::kInternal, "libcurl initialisation failed");
  const Session session(req, settings);
  std::string last_error;
  bool resolve_failed_before = false;

  for (long attempt = 1; attempt <= tuning.max_attempts; ++attempt) {
    Transfer t;
    t.curl = curl.get();
    t.part = part.file();
    t.sha = &part.sha();
    t.have = part.have;
    t.resume_from = part.have;
    t.total = req.size.value_or(0);
    t.label = req.label;
    t.progress = &req.progress;
    t.cancel = req.cancel;
    t.started_at = part.have;
    char errbuf[CURL_ERROR_SIZE] = {0};
    prepare_attempt(curl.get(), req, session, tuning.low_speed_time, t, errbuf);

    const CURLcode rc = curl_easy_perform(curl.get());
    part.have = t.have;
    if (t.write_errno != 0) {
      throw Error(ErrorCode::kIo, "cannot write " + part.path().string() + ": " +
                                      errno_text(t.write_errno) + ". The partial download (" +
                                      std::to_string(part.have) +
                                      " bytes) is kept to resume later; delete it to free space.");
    }
    if (t.cancelled) {
      throw Error(ErrorCode::kDownloadFailed, "download of " + req.label + " cancelled at " +
                                                  std::to_string(part.have) +
                                                  " bytes (kept to resume)");
    }
    if (t.http_status == 416) {  // the range is past the end: the .part is stale, start over
      part.start_over();
      last_error = "HTTP 416 (range not satisfiable)";
      continue;
    }
    if (rc == CURLE_OK && (t.http_status == 200 || t.http_status == 206)) {
      if (t.restarted)
        log(Level::kInfo, req.label + ": server ignored the range; downloaded from zero");
      return;
    }
    last_error = retriable_failure(t, rc, errbuf, req, session);
    // A name that does not resolve is rarely fixed by waiting: one more try, then give up.
    if (rc == CURLE_COULDNT_RESOLVE_HOST) {
      if (resolve_failed_before) attempt = tuning.max_attempts;
      resolve_failed_before = true;
    }
    if (attempt >= tuning.max_attempts) {
      throw Error(ErrorCode::kDownloadFailed,
                  "download of " + req.label + " from " + req.url + " failed after " +
                      std::to_string(tuning.max_attempts) + " attempts: " + last_error);
    }
    // Capped before shifting: up to 100 retries would shift past the width of a long.
    const long wait = attempt > 16 ? 30000L : std::min(tuning.backoff_ms << (attempt - 1), 30000L);
    log(Level::kWarn, req.label + ": " + last_error + "; retrying in " + std::to_string(wait) +
                          " ms (attempt " + std::to_string(attempt + 1) + " of " +
                          std::to_string(tuning.max_attempts) + ", " + std::to_string(part.have) +
                          " bytes kept)");
    std::this_thread::sleep_for(std::chrono::milliseconds(wait));
  }
}

// Moves the .part file into place if its size and hash are the card's; otherwise removes it.
DownloadResult place(const DownloadRequest& req, PartFile& part, const fs::path& dest) {
  const std::string actual = part.finish();
  std::error_code ec;
  if (req.size && part.have != *req.size) {
    fs::remove(part.path(), ec);
    throw Error(ErrorCode::kChecksumMismatch, "downloaded " + req.label + " is " +
                                                  std::to_string(part.have) + " bytes, expected " +
                                                  std::to_string(*req.size) + "; it was discarded");
  }
  if (req.sha256 && actual != *req.sha256) {
    fs::remove(part.path(), ec);
    throw Error(ErrorCode::kChecksumMismatch,
                "checksum mismatch for the download of " + req.label + " from " + req.url +
                    "\n  expected sha256 " + *req.sha256 + "\n  actual   sha256 " + actual +
                    "\n  the file was discarded; nothing was added to the cache");
  }
  fs::rename(part.path(), dest, ec);
  if (ec)
    throw Error(ErrorCode::kIo,
                "cannot move the download into " + dest.string() + ": " + ec.message());
  fsync_dir(dest.parent_path());
  return {actual, true};
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
  const core::Settings settings = core::read_settings();
  const Tuning tuning = read_tuning(settings);
  const fs::path dest(req.dest);
  std::error_code ec;
  fs::create_directories(dest.parent_path(), ec);
  if (ec) {
    throw Error(ErrorCode::kIo,
                "cannot create " + dest.parent_path().string() + ": " + ec.message());
  }
  FileLock lock(req.dest + ".lock", req.label, req.progress, req.cancel);
  if (fs::exists(dest, ec)) return {"", false};  // another process finished it while we waited

  PartFile part(req.dest + ".part", req.size);
  const DropEmptyPart drop_empty{part.path()};
  fetch(req, settings, tuning, part);
  if (req.progress) req.progress(DownloadProgress{req.label, part.have, part.have, 0});
  return place(req, part, dest);
}

}  // namespace sapiens_seg::io
