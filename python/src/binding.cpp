// sapiens_seg._core: the pybind11 layer over libsapiens_seg.
//
// It stays thin on purpose: argument checking, the accepted input types and the public Result
// and Backend classes live in sapiens_seg/segmentation.py. This file converts what that module
// hands it, releases the GIL around every call into the library, lends the library's result
// buffers to numpy without copying them, and turns sapiens_seg::Error into the exception class of
// its code (sapiens_seg/errors.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <opencv2/imgcodecs.hpp>

#include "cli/inputs.hpp"
#include "cli/naming.hpp"
#include "log_binding.hpp"
#include "sapiens_seg/sapiens_seg.hpp"

namespace py = pybind11;
namespace ss = sapiens_seg;

namespace {

// ---- strings ------------------------------------------------------------------------------

// Library strings are UTF-8 except file paths, which are whatever bytes the file system holds.
// surrogateescape keeps such bytes round-trippable (os.fsencode gives them back).
py::str to_str(const std::string& s) {
  PyObject* o =
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

// Paths arrive as bytes (os.fsencode in segmentation.py) so that non-UTF-8 names survive.
std::string path_arg(const py::handle& h, const char* what) {
  if (!py::isinstance<py::bytes>(h)) {
    throw py::type_error(std::string(what) + ": expected bytes (os.fsencode of the path)");
  }
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(h.ptr(), &data, &size) != 0) throw py::error_already_set();
  return std::string(data, static_cast<std::size_t>(size));
}

// ---- errors -------------------------------------------------------------------------------

// Raises the Python class registered for the error's code in sapiens_seg.errors, with the
// library's message unchanged. The module is looked up on every error (errors are rare, and
// holding Python objects in C++ statics would outlive the interpreter).
void raise_library_error(const ss::Error& e) {
  py::object cls;
  try {
    cls = py::module_::import("sapiens_seg.errors")
              .attr("_class_for_code")(static_cast<int>(e.code()));
  } catch (py::error_already_set&) {
    PyErr_Clear();
    cls = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  }
  py::str message = to_str(e.what());
  PyErr_SetObject(cls.ptr(), message.ptr());
}

// ---- numpy views of library memory --------------------------------------------------------

// An array over `data` that does not own it: `owner` (a Python object keeping the memory alive)
// becomes its base. Read-only: the memory belongs to the result.
template <typename T>
py::array borrowed_array(const T* data, std::vector<py::ssize_t> shape, py::handle owner) {
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t step = static_cast<py::ssize_t>(sizeof(T));
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= shape[i];
  }
  py::array a(py::dtype::of<T>(), std::move(shape), std::move(strides), data, owner);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

// An owned image handed to numpy: the Image moves into a capsule that the array keeps as base.
py::array image_array(ss::Image&& image) {
  auto* owned = new ss::Image(std::move(image));
  py::capsule owner(owned, [](void* p) { delete static_cast<ss::Image*>(p); });
  return borrowed_array<std::uint8_t>(owned->rgb.data(), {owned->height, owned->width, 3}, owner);
}

// An HxWx3 uint8 array whose rows may be padded (strides[0] >= W * 3) but whose pixels are
// packed: segmentation.py copies anything else before it gets here.
ss::ImageView rgb_view(const py::array& a, const std::string& what) {
  if (a.dtype().kind() != 'u' || a.itemsize() != 1) {
    throw py::type_error(what + ": expected a uint8 array");
  }
  if (a.ndim() != 3 || a.shape(2) != 3) {
    throw py::value_error(what + ": expected an HxWx3 RGB array");
  }
  if (a.strides(2) != 1 || a.strides(1) != 3 || a.strides(0) < 3 * a.shape(1)) {
    throw py::value_error(what + ": pixels must be packed RGB (use numpy.ascontiguousarray)");
  }
  if (a.shape(0) > INT32_MAX || a.shape(1) > INT32_MAX) {
    throw py::value_error(what + ": image too large");
  }
  ss::ImageView v;
  v.data = static_cast<const std::uint8_t*>(a.data());
  v.height = static_cast<int>(a.shape(0));
  v.width = static_cast<int>(a.shape(1));
  v.stride = static_cast<std::size_t>(a.strides(0));
  return v;
}

// ---- results ------------------------------------------------------------------------------

// One segmented image: the library's Result, and the Prepared image it was run from (its decoded
// pixels, which Result.overlay draws on, when the input was a file or encoded bytes).
struct NativeResult {
  ss::Result result;
  ss::Prepared prepared;
  bool decoded = false;  // the input was a file or bytes: prepared.image() is the library's
};
using NativeResultPtr = std::shared_ptr<NativeResult>;

// What one item of Model.segment's list becomes, prepared while the GIL is held.
struct Job {
  enum class Kind { kFile, kEncoded, kRgb } kind = Kind::kRgb;
  std::string path;
  std::vector<std::uint8_t> bytes;
  py::array array;  // kept referenced until the call returns (the view borrows its pixels)
  ss::ImageView view;

  // The library's Input; encoded bytes move into it.
  ss::Input input() {
    switch (kind) {
      case Kind::kFile:
        return ss::Input::file(path);
      case Kind::kEncoded:
        return ss::Input::encoded(std::move(bytes));
      case Kind::kRgb:
        break;
    }
    return ss::Input::rgb(view);
  }
};

constexpr int kItemFile = 0, kItemEncoded = 1, kItemRgb = 2;

Job make_job(const py::handle& item, std::size_t index) {
  const std::string what = "x[" + std::to_string(index) + "]";
  if (!py::isinstance<py::tuple>(item) || py::len(item) != 2) {
    throw py::type_error(what + ": expected a (kind, payload) tuple");
  }
  const auto t = py::reinterpret_borrow<py::tuple>(item);
  const int kind = t[0].cast<int>();
  Job job;
  if (kind == kItemFile) {
    job.kind = Job::Kind::kFile;
    job.path = path_arg(t[1], what.c_str());
  } else if (kind == kItemEncoded) {
    job.kind = Job::Kind::kEncoded;
    const py::buffer buf = py::reinterpret_borrow<py::buffer>(t[1]);
    const py::buffer_info info = buf.request();
    if (info.ndim != 1 || info.itemsize != 1 || info.strides[0] != 1) {
      throw py::value_error(what + ": encoded image bytes must be a contiguous byte buffer");
    }
    const auto* p = static_cast<const std::uint8_t*>(info.ptr);
    job.bytes.assign(p, p + info.size);
  } else if (kind == kItemRgb) {
    job.kind = Job::Kind::kRgb;
    if (!py::isinstance<py::array>(t[1])) throw py::type_error(what + ": expected a numpy array");
    job.array = py::reinterpret_borrow<py::array>(t[1]);
    job.view = rgb_view(job.array, what);
  } else {
    throw py::value_error(what + ": unknown item kind " + std::to_string(kind));
  }
  return job;
}

py::dict timings_dict(const ss::Timings& t) {
  py::dict d;
  d["decode"] = t.decode;
  d["preprocess"] = t.preprocess;
  d["network"] = t.network;
  d["postprocess"] = t.postprocess;
  d["total"] = t.total;
  return d;
}

py::tuple backend_tuple(const ss::Backend& b) {
  return py::make_tuple(to_str(b.mode), to_str(b.device), to_str(b.dtype));
}

py::array palette_array(const std::vector<std::array<std::uint8_t, 3>>& palette) {
  py::array_t<std::uint8_t> a({static_cast<py::ssize_t>(palette.size()), py::ssize_t{3}});
  auto m = a.mutable_unchecked<2>();
  for (std::size_t k = 0; k < palette.size(); ++k) {
    for (std::size_t c = 0; c < 3; ++c) {
      m(static_cast<py::ssize_t>(k), static_cast<py::ssize_t>(c)) = palette[k][c];
    }
  }
  return a;
}

py::list str_list(const std::vector<std::string>& v) {
  py::list l;
  for (const auto& s : v) l.append(to_str(s));
  return l;
}

// ---- model --------------------------------------------------------------------------------

// An option's name through the library's table (names.hpp), as the built-in ValueError that
// Python callers expect for a bad argument.
template <class Parse>
auto parse_option(Parse parse, const std::string& s) {
  try {
    return parse(s);
  } catch (const ss::Error& e) {
    throw py::value_error(e.what());
  }
}

// ---- downloads ----------------------------------------------------------------------------

// The FetchOptions::progress of a load() or fetch() from Python. The library calls it a few
// times a second on the downloading thread, which does not hold the GIL: it takes the GIL, runs
// Python's signal handlers (so Ctrl-C raises KeyboardInterrupt here, promptly, instead of after
// a 4.7 GB transfer), then calls the reporter of sapiens_seg/_progress.py (None: signals only).
// A Python exception from either is kept and cancels the transfer (the .part file stays for the
// next call); the caller re-raises it instead of the library's "cancelled" error.
class PythonProgress {
 public:
  explicit PythonProgress(py::object reporter) : reporter_(std::move(reporter)) {}

  bool operator()(const ss::DownloadProgress& p) {
    py::gil_scoped_acquire gil;
    if (pending_) return false;
    if (PyErr_CheckSignals() != 0) {
      pending_.emplace();  // fetches the exception the handler raised
      return false;
    }
    if (reporter_.is_none()) return true;
    try {
      const py::object keep_going = reporter_(to_str(p.file), p.done, p.total, p.bytes_per_second);
      return PyObject_IsTrue(keep_going.ptr()) != 0;
    } catch (py::error_already_set& e) {
      pending_.emplace(std::move(e));
      return false;
    }
  }

  // With the GIL held: raises what the callback kept, if anything.
  void rethrow_pending() {
    if (!pending_) return;
    py::error_already_set e = std::move(*pending_);
    pending_.reset();
    throw e;
  }

  // FetchOptions holds a std::function, which may be copied and destroyed without the GIL: it
  // gets a pointer to this object (which outlives the call), never a Python object.
  ss::ProgressCallback callback() {
    return [self = this](const ss::DownloadProgress& p) { return (*self)(p); };
  }

 private:
  py::object reporter_;
  std::optional<py::error_already_set> pending_;
};

// Options arrive as {name: text} in the library's table (names.hpp): segmentation.py makes its
// keyword arguments from the same table, so a new option needs no change here.
template <class Options>
Options options_from(const py::dict& values) {
  Options o;
  for (const auto& [key, value] : values) {
    try {
      ss::set_option(o, py::cast<std::string>(key), py::cast<std::string>(value));
    } catch (const ss::Error& e) {
      throw py::value_error(e.what());
    }
  }
  return o;
}

ss::Model load(const py::bytes& name, const py::dict& options, const py::object& progress) {
  ss::LoadOptions opt = options_from<ss::LoadOptions>(options);
  const std::string id = path_arg(name, "name_or_path");
  PythonProgress watch(progress);
  opt.fetch.progress = watch.callback();
  std::optional<ss::Model> model;
  try {
    py::gil_scoped_release nogil;
    model.emplace(ss::load(id, opt));
  } catch (const ss::Error&) {
    watch.rethrow_pending();
    throw;
  }
  watch.rethrow_pending();
  return std::move(*model);
}

py::list option_specs() {
  py::list out;
  for (const ss::OptionSpec& spec : ss::option_specs()) {
    py::dict d;
    d["name"] = spec.name;
    d["group"] = spec.group == ss::OptionGroup::kLoad      ? "load"
                 : spec.group == ss::OptionGroup::kSegment ? "segment"
                                                           : "run";
    d["type"] = spec.type == ss::OptionType::kChoice ? "choice"
                : spec.type == ss::OptionType::kText ? "text"
                : spec.type == ss::OptionType::kInt  ? "int"
                                                     : "bool";
    d["default"] = spec.default_value;
    d["choices"] = spec.choices;
    d["min"] = spec.min_value;
    d["max"] = spec.max_value;
    d["help"] = spec.help;
    out.append(d);
  }
  return out;
}

py::str fetch(const py::bytes& name, const py::object& progress) {
  const std::string id = path_arg(name, "name");
  PythonProgress watch(progress);
  ss::FetchOptions opt;
  opt.progress = watch.callback();
  std::string path;
  try {
    py::gil_scoped_release nogil;
    path = ss::fetch(id, opt);
  } catch (const ss::Error&) {
    watch.rethrow_pending();
    throw;
  }
  watch.rethrow_pending();
  return to_str(path);
}

// `first_index`: the list index of items[0] in the caller's list, so that a failed item names
// itself ("x[12]: ..."); -1 for a single image given alone.
py::list segment(const ss::Model& model, const py::list& items, const py::dict& options,
                 int first_index) {
  std::vector<Job> jobs;
  jobs.reserve(py::len(items));
  for (std::size_t i = 0; i < py::len(items); ++i) jobs.push_back(make_job(items[i], i));
  const ss::SegmentOptions opt = options_from<ss::SegmentOptions>(options);

  std::vector<ss::Prepared> prepared;
  std::vector<ss::Result> results;
  // Ctrl-C during a long list: Python's handler only runs when this thread holds the GIL, so it
  // is taken briefly between images to run it; a KeyboardInterrupt it raises ends the call
  // before the next image (nothing is returned, nothing half-made is kept).
  std::optional<py::error_already_set> interrupted;
  const auto check_signals = [&] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) interrupted.emplace();
    return !interrupted;
  };
  {
    py::gil_scoped_release nogil;
    // The library's two halves, as every front end runs them: prepare (decode, resize,
    // normalise) each image, then run the batch. Prepared keeps the decoded pixels for
    // Result.overlay.
    prepared.reserve(jobs.size());
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      if (!check_signals()) break;
      try {
        prepared.push_back(model.prepare(jobs[i].input()));
      } catch (const ss::Error& e) {
        if (first_index < 0) throw;
        // Which item of the list failed, as the message's first words.
        throw ss::Error(
            e.code(), "x[" + std::to_string(first_index + static_cast<int>(i)) + "]: " + e.what());
      }
    }
    if (!interrupted && check_signals()) results = model.run(prepared, opt);
  }
  if (interrupted) throw std::move(*interrupted);

  py::list out;
  for (std::size_t i = 0; i < results.size(); ++i) {
    auto native = std::make_shared<NativeResult>();
    native->result = std::move(results[i]);
    native->prepared = std::move(prepared[i]);
    native->decoded = jobs[i].kind != Job::Kind::kRgb;
    out.append(py::cast(std::move(native)));
  }
  return out;
}

// One image prepared (decoded, resized, normalised) for a model, and whether the library decoded
// it (a file or bytes: its pixels are the library's, for Result.overlay).
struct NativePrepared {
  ss::Prepared prepared;
  bool decoded = false;
};

NativePrepared prepare_one(const ss::Model& model, const py::handle& item) {
  Job job = make_job(item, 0);
  NativePrepared out;
  out.decoded = job.kind != Job::Kind::kRgb;
  py::gil_scoped_release nogil;
  out.prepared = model.prepare(job.input());
  return out;
}

py::list run_prepared(const ss::Model& model, const std::vector<NativePrepared>& batch,
                      const py::dict& options) {
  const ss::SegmentOptions opt = options_from<ss::SegmentOptions>(options);
  std::vector<ss::Prepared> prepared;
  prepared.reserve(batch.size());
  for (const auto& p : batch) prepared.push_back(p.prepared);
  std::vector<ss::Result> results;
  {
    py::gil_scoped_release nogil;
    results = model.run(prepared, opt);
  }
  py::list out;
  for (std::size_t i = 0; i < results.size(); ++i) {
    auto native = std::make_shared<NativeResult>();
    native->result = std::move(results[i]);
    native->prepared = batch[i].prepared;
    native->decoded = batch[i].decoded;
    out.append(py::cast(std::move(native)));
  }
  return out;
}

py::dict model_info(const ss::Model& model) {
  const ss::ModelInfo& i = model.info();
  py::dict d;
  d["id"] = to_str(i.id);
  d["family"] = to_str(i.family);
  d["path"] = to_str(i.path);
  d["sha256"] = to_str(i.sha256);
  d["license"] = to_str(i.license);
  d["input_height"] = i.input_height;
  d["input_width"] = i.input_width;
  d["num_classes"] = i.num_classes;
  d["embed_dim"] = i.embed_dim;
  d["depth"] = i.depth;
  d["heads"] = i.heads;
  d["backend"] = backend_tuple(i.backend);
  d["classes"] = str_list(i.classes);
  d["palette"] = palette_array(i.palette);
  return d;
}

// ---- cards and the system -----------------------------------------------------------------

py::dict card_dict(const ss::Card& c) {
  py::dict d;
  d["id"] = to_str(c.id);
  d["family"] = to_str(c.family);
  d["description"] = to_str(c.description);
  d["repo"] = to_str(c.repo);
  d["revision"] = to_str(c.revision);
  d["url"] = to_str(c.url);
  d["file"] = to_str(c.file);
  d["size"] = c.size ? py::object(py::int_(*c.size)) : py::object(py::none());
  d["sha256"] = c.sha256 ? py::object(to_str(*c.sha256)) : py::object(py::none());
  d["license"] = to_str(c.license_id);
  d["license_url"] = to_str(c.license_url);
  d["commercial_use"] = c.commercial_use;
  d["format"] = to_str(c.format);
  d["input_height"] = c.input_height;
  d["input_width"] = c.input_width;
  d["num_classes"] = c.num_classes;
  d["classes"] = str_list(c.classes);
  d["palette"] = palette_array(c.palette);
  d["source"] = to_str(c.source);
  return d;
}

py::list list_cards() {
  std::vector<ss::Card> cards;
  {
    py::gil_scoped_release nogil;
    cards = ss::list_cards();
  }
  py::list out;
  for (const auto& c : cards) out.append(card_dict(c));
  return out;
}

py::dict find_card(const std::string& id) {
  ss::Card card;
  {
    py::gil_scoped_release nogil;
    card = ss::find_card(id);
  }
  return card_dict(card);
}

void check_license(const std::string& id, bool accept_noncommercial) {
  py::gil_scoped_release nogil;
  ss::check_license(ss::find_card(id), accept_noncommercial);
}

// ---- the CLI's rules, for the Ray driver -------------------------------------------------

std::vector<std::string> path_list(const py::sequence& paths, const char* what) {
  std::vector<std::string> out;
  out.reserve(paths.size());
  for (const auto& p : paths) out.push_back(path_arg(p, what));
  return out;
}

py::dict expand_inputs(const py::sequence& args, const std::string& extensions, bool recursive,
                       const py::bytes& output_dir) {
  ss::cli::InputRules rules;
  rules.exts = ss::cli::parse_extensions(extensions);
  rules.recursive = recursive;
  rules.out_dir = path_arg(output_dir, "output_dir");
  rules.pass_uris = true;
  const std::vector<std::string> paths = path_list(args, "args");
  ss::cli::ExpandedInputs in;
  {
    py::gil_scoped_release nogil;
    in = ss::cli::expand_inputs(paths, rules);
  }
  py::list items, problems, notes;
  for (const auto& i : in.items) items.append(py::make_tuple(to_str(i.path), i.video));
  for (const auto& p : in.problems) {
    problems.append(
        py::make_tuple(to_str(p.path), std::string(ss::to_string(p.code)), to_str(p.message)));
  }
  for (const auto& n : in.notes) notes.append(to_str(n));
  py::dict d;
  d["items"] = items;
  d["problems"] = problems;
  d["excluded"] = in.excluded;
  d["notes"] = notes;
  return d;
}

py::list output_bases(const py::sequence& paths, const py::bytes& output_dir) {
  py::list out;
  for (const auto& b :
       ss::cli::run_bases(path_list(paths, "paths"), path_arg(output_dir, "output_dir"))) {
    out.append(to_str(b));
  }
  return out;
}

// The label PNG as the CLI writes it (cv::imwrite of the 8-bit grey map, OpenCV's default PNG
// settings), so the Ray driver's files are the CLI's byte for byte.
py::bytes encode_labels_png(const py::array_t<std::uint8_t, py::array::c_style>& labels) {
  if (labels.ndim() != 2) throw py::value_error("labels: expected a 2-D uint8 array");
  const cv::Mat m(static_cast<int>(labels.shape(0)), static_cast<int>(labels.shape(1)), CV_8UC1,
                  const_cast<std::uint8_t*>(labels.data()));
  std::vector<std::uint8_t> out;
  {
    py::gil_scoped_release nogil;
    if (!cv::imencode(".png", m, out))
      throw ss::Error(ss::ErrorCode::kInternal, "PNG encoding failed");
  }
  return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
}

py::dict system_info() {
  ss::SystemInfo s;
  {
    py::gil_scoped_release nogil;
    s = ss::system_info();
  }
  py::dict d;
  d["version"] = to_str(s.version);
  d["torch_version"] = to_str(s.torch_version);
  d["opencv_version"] = to_str(s.opencv_version);
  d["openssl_version"] = to_str(s.openssl_version);
  d["threads"] = s.threads;
  d["cuda_available"] = s.cuda_available;
  d["cuda_devices"] = s.cuda_devices;
  d["kernels_compiled"] = s.kernels_compiled;
  d["backends"] = str_list(s.backends);
  d["cpu_model"] = to_str(s.cpu_model);
  d["cpu_id"] = to_str(s.cpu_id);
  d["cpu_flags"] = str_list(s.cpu_flags);
  d["onednn_cap"] = to_str(s.onednn_cap);
  d["cpu_dtypes"] = str_list(s.cpu_dtypes);
  d["cpu_attention"] = str_list(s.cpu_attention);
  d["cpu_gemm"] = to_str(s.cpu_gemm);
  d["wheel_cubic_path"] = to_str(s.wheel_cubic_path);
  d["card_dirs"] = str_list(s.card_dirs);
  return d;
}

// (pixels, the decoder's warnings): segmentation.read_image turns the warnings into Python
// warnings.
py::tuple read_image(const py::tuple& item) {
  Job job = make_job(item, 0);
  if (job.kind == Job::Kind::kRgb) throw py::type_error("read_image: expected a path or bytes");
  ss::Image image;
  {
    py::gil_scoped_release nogil;
    image = job.kind == Job::Kind::kFile ? ss::read_image(job.path) : ss::read_image(job.bytes);
  }
  py::list warnings = str_list(image.warnings);
  return py::make_tuple(image_array(std::move(image)), warnings);
}

py::array resize(const py::array& image, int height, int width, const std::string& interpolation,
                 const std::string& cubic, const std::string& device) {
  const ss::ImageView view = rgb_view(image, "image");
  ss::ResizeOptions opt;
  if (interpolation == "linear") {
    opt.interpolation = ss::Interpolation::kLinear;
  } else if (interpolation == "area") {
    opt.interpolation = ss::Interpolation::kArea;
  } else if (interpolation == "cubic") {
    opt.interpolation = ss::Interpolation::kCubic;
  } else {
    throw py::value_error("interpolation: expected 'linear', 'area' or 'cubic'");
  }
  opt.cubic = parse_option(ss::parse_cubic, cubic);
  opt.device = device;
  ss::Image out;
  {
    py::gil_scoped_release nogil;
    out = ss::resize(view, height, width, opt);
  }
  return image_array(std::move(out));
}

}  // namespace

void bind_serve(py::module_& m);  // serve_binding.cpp

namespace {

// Every C++ exception leaves as the library's Python error of its code.
void register_error_translator() {
  // pybind11 calls translators through void(*)(std::exception_ptr): the copy is its signature.
  // Every other C++ exception (a raw LibTorch error, std::bad_alloc) becomes the library error
  // of its kind too (ss::as_error: OutOfMemoryError, else InternalError); pybind11's own
  // exceptions, which carry a Python exception, pass on to its translators.
  py::register_exception_translator(
      [](std::exception_ptr p) {  // NOLINT(performance-unnecessary-value-param)
        try {
          if (p) std::rethrow_exception(p);
        } catch (const ss::Error& e) {
          raise_library_error(e);
        } catch (const py::builtin_exception&) {
          throw;
        } catch (const py::error_already_set&) {
          throw;
        } catch (...) {
          raise_library_error(ss::as_error(p, "sapiens_seg"));
        }
      });
}

// One image's result, with views of its buffers.
void bind_result(py::module_& m) {
  py::class_<NativeResult, NativeResultPtr>(m, "NativeResult",
                                            "One image's result as the library returned it.")
      .def_property_readonly("height", [](const NativeResult& r) { return r.result.height; })
      .def_property_readonly("width", [](const NativeResult& r) { return r.result.width; })
      .def_property_readonly(
          "labels",
          [](const py::object& self) {
            const auto& r = self.cast<const NativeResult&>().result;
            return borrowed_array<std::uint8_t>(r.labels.data(), {r.height, r.width}, self);
          },
          "HxW uint8 class indices (a read-only view of the library's buffer).")
      .def_property_readonly(
          "logits",
          [](const py::object& self) -> py::object {
            const auto& r = self.cast<const NativeResult&>().result;
            if (r.logits.empty()) return py::none();
            const auto c = static_cast<py::ssize_t>(r.classes.size());
            return borrowed_array<float>(r.logits.data(), {c, r.height, r.width}, self);
          },
          "[C, H, W] float32 logits, or None when they were not asked for.")
      .def_property_readonly(
          "raw_logits",
          [](const py::object& self) -> py::object {
            const auto& r = self.cast<const NativeResult&>().result;
            if (r.raw_logits.empty()) return py::none();
            const auto c = static_cast<py::ssize_t>(r.classes.size());
            return borrowed_array<float>(r.raw_logits.data(), {c, r.raw_height, r.raw_width}, self);
          },
          "[C, h, w] float32: the network's own output, or None when it was not asked for.")
      .def_property_readonly(
          "image",
          [](const py::object& self) -> py::object {
            const auto& n = self.cast<const NativeResult&>();
            if (!n.decoded) return py::none();
            const ss::ImageView v = n.prepared.image();
            return borrowed_array<std::uint8_t>(v.data, {v.height, v.width, 3}, self);
          },
          "The decoded HxWx3 RGB pixels when the input was a file or bytes, else None.")
      .def_property_readonly("classes",
                             [](const NativeResult& r) { return str_list(r.result.classes); })
      .def_property_readonly("palette",
                             [](const NativeResult& r) { return palette_array(r.result.palette); })
      .def_property_readonly("backend",
                             [](const NativeResult& r) { return backend_tuple(r.result.backend); })
      .def_property_readonly("timings",
                             [](const NativeResult& r) { return timings_dict(r.result.timings); })
      .def_property_readonly("warnings",
                             [](const NativeResult& r) { return str_list(r.result.warnings); })
      .def(
          "overlay",
          [](const NativeResult& n, const py::object& image, float opacity) {
            py::array pixels;
            ss::ImageView view;
            if (image.is_none()) {
              if (!n.decoded) throw py::value_error("overlay: no image was kept for this result");
              view = n.prepared.image();
            } else {
              if (!py::isinstance<py::array>(image)) {
                throw py::type_error("overlay: expected a numpy array");
              }
              pixels = py::reinterpret_borrow<py::array>(image);
              view = rgb_view(pixels, "overlay image");
            }
            ss::Image out;
            {
              py::gil_scoped_release nogil;
              out = ss::overlay(n.result, view, opacity);
            }
            return image_array(std::move(out));
          },
          py::arg("image"), py::arg("opacity"),
          "Palette colours blended over `image` (None: the decoded input) as HxWx3 uint8.");
}

// Prepared images, the model, and loading one.
void bind_model(py::module_& m) {
  py::class_<NativePrepared>(m, "Prepared",
                             "One image decoded, resized and normalised for one model.")
      .def_property_readonly("height", [](const NativePrepared& p) { return p.prepared.height(); })
      .def_property_readonly("width", [](const NativePrepared& p) { return p.prepared.width(); })
      .def_property_readonly(
          "timings", [](const NativePrepared& p) { return timings_dict(p.prepared.timings()); })
      .def_property_readonly(
          "warnings", [](const NativePrepared& p) { return str_list(p.prepared.warnings()); });

  py::class_<ss::Model>(m, "Model", "A loaded model (immutable; safe to share between threads).")
      .def("prepare", &prepare_one, py::arg("item"),
           "Decodes, resizes and normalises one (kind, payload) item (Model::prepare); the GIL "
           "is released.")
      .def("run", &run_prepared, py::arg("batch"), py::arg("options"),
           "Runs prepared images as one network batch (Model::run); the GIL is released.")
      .def("segment", &segment, py::arg("items"), py::arg("options"), py::arg("first_index") = -1,
           "Segments a list of (kind, payload) items in one batch (prepare each, run them); "
           "`options`: {name: text} of the segment options. The GIL is released.")
      .def_property_readonly("info", &model_info);

  m.def("load", &load, py::arg("name_or_path"), py::arg("options"),
        py::arg("progress") = py::none(),
        "Loads a model; the GIL is released while it loads. `options`: {name: text} of the load "
        "options (option_specs()); `progress`: None or a callable (file, done, total, "
        "bytes_per_second) -> bool for downloads; Ctrl-C cancels either way.");
}

// What the library knows without a model: its options, cards, licences, error codes, system.
void bind_library_facts(py::module_& m) {
  m.def(
      "version", [] { return std::string(ss::version()); },
      "The library's version (the C++ sapiens_seg::version()).");
  m.def("option_specs", &option_specs,
        "Every option of the library as a dict (name, group load/segment/run, type, default, "
        "choices, min, max, help): what segmentation.load's and Model.__call__'s keyword "
        "arguments are made from.");
  m.def(
      "forked_child", [] { return ss::forked_child(); },
      "Whether this process was forked after the library was loaded (it then runs the library on "
      "one CPU thread: sapiens_seg::forked_child).");
  m.def(
      "default_model", [] { return std::string(ss::default_model()); },
      "The model the command-line tools load when none is named.");
  m.def("fetch", &fetch, py::arg("name"), py::arg("progress") = py::none(),
        "Makes a card's weights present and verified (downloading them); returns the path.");
  m.def("list_cards", &list_cards, "Every model card visible now, as dicts.");
  m.def("find_card", &find_card, py::arg("id"),
        "The card of an id (a trailing @revision must match), as a dict; WeightsNotFoundError "
        "otherwise.");
  m.def("check_license", &check_license, py::arg("id"), py::arg("accept_noncommercial"),
        "The library's licence gate for a card id: LicenseNotAcceptedError unless its licence, "
        "accept_noncommercial or SAPIENS_SEG_NONCOMMERCIAL allows the weights.");
  m.def(
      "option_names",
      [] {
        py::dict d;
        d["mode"] = ss::mode_names();
        d["dtype"] = ss::dtype_names();
        d["normalization"] = ss::normalization_names();
        d["pipeline"] = ss::pipeline_names();
        d["cubic"] = ss::cubic_names();
        return d;
      },
      "The library's names of each option's values (the first is the default), as the CLI "
      "takes them.");
  m.def(
      "error_codes",
      [] {
        py::list out;
        for (const ss::ErrorCode c : ss::error_codes()) {
          out.append(py::make_tuple(static_cast<int>(c), std::string(ss::to_string(c)),
                                    ss::exit_status(c)));
        }
        return out;
      },
      "Every error code as (value, name as messages and JSON spell it, the CLI's exit status).");
  m.def("system_info", &system_info, "Versions, threads, CUDA devices and backends, as a dict.");
}

// The CLI's rules (inputs, output names and kinds), so Python and Ray write what the CLI writes.
void bind_cli_rules(py::module_& m) {
  m.def("expand_inputs", &expand_inputs, py::arg("args"), py::arg("extensions"),
        py::arg("recursive"), py::arg("output_dir"),
        "The CLI's inputs of a run (paths as bytes): files, folders, @lists and - as "
        "`sapiens-seg segment` takes them, URIs passed through as given. A dict: items "
        "[(path, video)], problems [(path, code, message)], excluded (output files not taken), "
        "notes.");
  m.def(
      "image_extensions", [] { return ss::cli::image_extensions(); },
      "The image extensions a folder walk takes by default ('.jpg', ...), as the CLI's --ext.");
  m.def(
      "output_kinds",
      [] {
        py::list out;
        for (const auto& k : ss::cli::output_kinds()) {
          out.append(py::make_tuple(k.save ? py::object(py::str(k.save)) : py::object(py::none()),
                                    k.key, k.suffix, k.video));
        }
        return out;
      },
      "The CLI's output files as (--save item, summary.json key, suffix after the base, video).");
  m.def("encode_labels_png", &encode_labels_png, py::arg("labels"),
        "An HxW uint8 label map as the CLI's <name>_seg.png bytes.");
  m.def("output_bases", &output_bases, py::arg("paths"), py::arg("output_dir"),
        "The CLI's output base names of these inputs (paths as bytes) written into output_dir "
        "(a fresh run): <base>_seg.png is each one's label PNG.");
}

// Image decoding and resizing as the library does them.
void bind_images(py::module_& m) {
  m.def("read_image", &read_image, py::arg("item"),
        "Decodes a (kind, payload) file or bytes item to (HxWx3 uint8 RGB, decoder warnings) as "
        "the library does.");
  m.def("resize", &resize, py::arg("image"), py::arg("height"), py::arg("width"),
        py::arg("interpolation"), py::arg("cubic"), py::arg("device"),
        "cv2.resize of an HxWx3 uint8 array by the library's own arithmetic; the GIL is released.");
  m.attr("ITEM_FILE") = kItemFile;
  m.attr("ITEM_ENCODED") = kItemEncoded;
  m.attr("ITEM_RGB") = kItemRgb;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "Native layer of sapiens_seg (pybind11 over libsapiens_seg). Use sapiens_seg.segmentation; "
      "the functions here take pre-checked arguments.";
  register_error_translator();
  bind_log(m);
  bind_result(m);
  bind_model(m);
  bind_library_facts(m);
  bind_cli_rules(m);
  bind_images(m);
  bind_serve(m);
}
