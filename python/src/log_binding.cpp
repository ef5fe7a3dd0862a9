// The library's log from Python (sapiens_seg/_log.py): its level, and a handler that receives
// its lines, so that they can go to Python's `logging`.
//
// Lines come from any thread: a thread that called into the library with the GIL released (the
// binding releases it around every call), or one the library started. The library calls its
// callback without any lock of its own held; here the callback takes the GIL, so the thread that
// holds the GIL is never waiting for one that logs. At interpreter shutdown Python must not be
// entered from another thread once it finalizes (such a thread is stopped inside the GIL
// request, which C++ frames do not survive): sapiens_seg/_log.py closes the handler from an
// atexit function, which waits, with the GIL released, for the lines already on their way to
// Python and sends every later line to stderr. A line that still arrives while Python is not
// running goes to stderr too.
#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <thread>

#include "sapiens_seg/log.hpp"

namespace py = pybind11;
namespace ss = sapiens_seg;

namespace {

struct PyLog {
  // The Python callable (level name, line); read and replaced only with the GIL held.
  py::object handler;
  std::atomic<bool> open{false};  // lines may go to `handler`
  std::atomic<int> in_flight{0};  // lines that have seen `open` set and not yet returned
  bool installed = false;         // deliver() is the library's callback (GIL held to change)
};

// Never destroyed: its py::object must not be released by a C++ static destructor, after Python
// has gone.
PyLog& py_log() {
  static auto* state = new PyLog;
  return *state;
}

bool python_running() {
  if (Py_IsInitialized() == 0) return false;
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() == 0;
#else
  return _Py_IsFinalizing() == 0;
#endif
}

// The library's own stderr format, for lines that cannot go to Python.
void to_stderr(ss::LogLevel level, std::string_view line) {
  const char* name = level == ss::LogLevel::kWarn ? "warning" : ss::to_string(level).data();
  std::fprintf(stderr, "sapiens-seg %s: %.*s\n", name, static_cast<int>(line.size()), line.data());
}

void deliver(ss::LogLevel level, std::string_view line) {
  PyLog& p = py_log();
  // Counted before `open` is read: close() clears `open`, then waits for the count to drop, so
  // no line it did not wait for can reach Python afterwards.
  p.in_flight.fetch_add(1);
  struct Leave {
    PyLog& p;
    ~Leave() { p.in_flight.fetch_sub(1); }
  } leave{p};
  if (!p.open.load() || !python_running()) {
    to_stderr(level, line);
    return;
  }
  py::gil_scoped_acquire gil;
  try {
    const py::object handler = p.handler;  // a reference of our own, taken with the GIL
    if (!handler || handler.is_none()) {
      to_stderr(level, line);
      return;
    }
    // Paths in messages may hold bytes that are not UTF-8: surrogateescape, as the binding's
    // other strings.
    PyObject* text =
        PyUnicode_DecodeUTF8(line.data(), static_cast<Py_ssize_t>(line.size()), "surrogateescape");
    if (text == nullptr) throw py::error_already_set();
    handler(py::str(ss::to_string(level).data()), py::reinterpret_steal<py::str>(text));
  } catch (py::error_already_set& e) {
    // A handler that raises must not take the library's call down with it: reported as
    // Python reports errors it cannot raise (sys.unraisablehook).
    e.discard_as_unraisable("sapiens_seg log handler");
  } catch (...) {
    to_stderr(level, line);
  }
}

// With the GIL held. None: lines go back to the library's stderr, once every line on its way
// to the old handler has arrived.
void set_log_handler(const py::object& handler) {
  PyLog& p = py_log();
  if (!handler.is_none()) {
    p.handler = handler;
    p.open.store(true);
    ss::set_log_callback(&deliver);
    p.installed = true;
    return;
  }
  if (!p.installed) return;  // never routed: a callback another user set stays
  p.open.store(false);
  {
    // The lines in flight need the GIL to finish. Bounded: a handler that blocks for good is
    // left to itself (it holds its own reference to the callable).
    py::gil_scoped_release nogil;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (p.in_flight.load() != 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  p.handler = py::none();
  ss::set_log_callback({});
  p.installed = false;
}

}  // namespace

void bind_log(py::module_& m) {
  m.def(
      "set_log_level",
      [](const std::string& name) { ss::set_log_level(ss::parse_log_level(name)); },
      py::arg("level"),
      "Sets the library's log level: 'debug', 'info', 'warn', 'error' or 'quiet' (overrides "
      "SAPIENS_SEG_LOG).");
  m.def(
      "log_level", [] { return std::string(ss::to_string(ss::log_level())); },
      "The library's log level in force now, as set_log_level spells it.");
  m.def("set_log_handler", &set_log_handler, py::arg("handler"),
        "Sends the library's log lines to handler(level, line) (level: 'debug', 'info', 'warn' "
        "or 'error'), called with the GIL on the thread that logs; None: back to stderr, after "
        "the lines on their way to the old handler have arrived.");
}
