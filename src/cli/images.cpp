#include "cli/images.hpp"

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "cli/queue.hpp"

namespace sapiens_seg::cli {
namespace {

// An input after Model::prepare (decoded, resized, normalised) or its error.
struct Decoded {
  const ImageJob* job = nullptr;
  Prepared prepared;
  std::optional<Error> error;
};

struct Segmented {
  const ImageJob* job = nullptr;
  Prepared prepared;  // holds the decoded pixels the overlay is drawn on
  Result result;
};

// Closes the queues and joins the pipeline's threads however run_images is left: a std::thread
// still joinable when it is destroyed calls std::terminate.
class ThreadGroup {
 public:
  explicit ThreadGroup(std::function<void()> close) : close_(std::move(close)) {}
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;
  ~ThreadGroup() { join(); }
  template <typename F>
  void start(F&& body) {
    threads_.emplace_back(std::forward<F>(body));
  }
  void join() noexcept {
    close_();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  std::function<void()> close_;
  std::vector<std::thread> threads_;
};

// Images: Model::prepare (decode, resize, normalise) on `workers` threads -> Model::run on
// batches here -> write on `workers` threads.
// Queues hold at most two batches per stage. Every input is reported exactly once (ok or
// error); no exception leaves a thread body, so nothing can terminate the process.
}  // namespace

void run_images(const Model& model, const std::vector<ImageJob>& jobs, const SegmentArgs& a,
                const SaveSet& save, OverlayStyle style, Reporter& report,
                const std::atomic<bool>& cancel) {
  if (jobs.empty()) return;
  const auto batch_size = static_cast<std::size_t>(a.run.batch_size);
  BoundedQueue<Decoded> decoded(2 * batch_size);
  BoundedQueue<Segmented> segmented(2 * batch_size);
  std::atomic<std::size_t> next{0};
  std::atomic<int> live_decoders{a.workers};
  std::atomic<bool> broken{false};  // the pipeline itself failed: nothing new starts
  std::mutex broken_mu;
  std::optional<Error> broken_error;
  const auto reported = std::make_unique<std::atomic<bool>[]>(jobs.size());

  auto failed = [&](const ImageJob* job, const Error& e) {
    if (!reported[static_cast<std::size_t>(job - jobs.data())].exchange(true)) {
      report.failed(job->path, e);
    }
  };
  // Called in a catch block of a pipeline thread: the run stops; unprocessed inputs are
  // reported with this error at the end.
  auto pipeline_failed = [&](const std::string& where) noexcept {
    try {
      const Error e = as_error(std::current_exception(), where);
      std::lock_guard<std::mutex> lock(broken_mu);
      if (!broken_error) broken_error = e;
    } catch (...) {  // no memory left even for the message: the flag still stops the run
    }
    broken = true;
    decoded.close();
    segmented.close();
  };

  ThreadGroup threads([&] {
    decoded.close();
    segmented.close();
  });
  auto decoder = [&] {
    try {
      for (std::size_t i; !cancel && !broken && (i = next++) < jobs.size();) {
        Decoded d;
        d.job = &jobs[i];
        try {
          d.prepared = model.prepare(Input::file(jobs[i].path));
        } catch (...) {
          d.error = as_error(std::current_exception(), "reading " + jobs[i].path);
        }
        if (!decoded.push(std::move(d))) break;
      }
    } catch (...) {
      pipeline_failed("a decoding thread");
    }
    if (--live_decoders == 0) decoded.close();
  };
  auto writer = [&] {
    try {
      while (auto s = segmented.pop()) {
        try {
          nlohmann::json entry =
              write_outputs(s->result, s->prepared.image(), s->job->names, save, style, a.opacity);
          if (!reported[static_cast<std::size_t>(s->job - jobs.data())].exchange(true)) {
            report.ok(s->job->path, std::move(entry));
          }
        } catch (const OutputsFailed& e) {
          // Disk full, a file size limit: this input is an error listing the files it got.
          if (!reported[static_cast<std::size_t>(s->job - jobs.data())].exchange(true)) {
            report.output_failed(s->job->path, e, e.written);
          }
        } catch (...) {
          failed(s->job,
                 as_error(std::current_exception(), "writing the outputs of " + s->job->path));
        }
      }
    } catch (...) {
      pipeline_failed("a writing thread");
    }
  };
  try {
    for (int w = 0; w < a.workers; ++w) threads.start(decoder);
    for (int w = 0; w < a.workers; ++w) threads.start(writer);
  } catch (...) {
    pipeline_failed("starting the pipeline's threads");
  }

  const SegmentOptions options = save.segment_options();
  try {
    while (!broken) {
      std::vector<Decoded> batch;
      while (batch.size() < batch_size) {
        auto d = decoded.pop();
        if (!d) break;
        if (d->error) {
          failed(d->job, *d->error);  // one bad file never stops the others
          continue;
        }
        batch.push_back(std::move(*d));
      }
      if (batch.empty()) break;
      std::vector<Prepared> prepared;
      prepared.reserve(batch.size());
      for (const auto& d : batch) prepared.push_back(d.prepared);
      std::vector<Result> results;
      try {
        results = model.run(prepared, options);
      } catch (...) {
        // A batch that failed (out of memory for the batch, or for one image's full-size
        // logits) is run again one image at a time, so one input's failure is its own: a
        // Prepared that was not run to the end is intact.
        const Error e = as_error(std::current_exception(), "segmenting");
        if (batch.size() == 1) {
          failed(batch[0].job, e);
          prepared.clear();
        } else {
          report.warn("a batch of " + std::to_string(batch.size()) + " images failed (" + e.what() +
                      "); running them one at a time");
        }
      }
      if (results.empty()) {
        for (std::size_t j = 0; j < prepared.size(); ++j) {
          try {
            results.push_back(std::move(model.run({&prepared[j], 1}, options).front()));
          } catch (...) {
            failed(batch[j].job, as_error(std::current_exception(), "segmenting"));
            results.emplace_back();  // keeps the indices; height 0 marks the failure
          }
        }
      }
      for (std::size_t j = 0; j < results.size(); ++j) {
        if (results[j].height == 0) continue;
        segmented.push(Segmented{batch[j].job, std::move(prepared[j]), std::move(results[j])});
      }
      // Ctrl-C: the batch that was running is written; nothing new starts.
      if (cancel) break;
    }
  } catch (...) {
    pipeline_failed("the inference loop");
  }
  threads.join();
  if (broken_error) {
    report.run_failed(*broken_error);
    if (!cancel) {
      const Error why(broken_error->code(),
                      std::string("not processed: the run stopped: ") + broken_error->what());
      for (const auto& job : jobs) failed(&job, why);
    }
  }
}

}  // namespace sapiens_seg::cli
