// sapiens_seg._core.serve: the response encoders of `sapiens-seg serve` (src/serve/encode.hpp),
// for the Ray Serve deployment, so that both servers answer the same bytes from the same code.
// Arrays come in as numpy (the labels of a result, the decoded photo); the GIL is released while
// encoding.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "serve/encode.hpp"
#include "serve/request.hpp"

namespace py = pybind11;
namespace ss = sapiens_seg;

namespace {

using Labels = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>;
using Palette = std::vector<std::array<std::uint8_t, 3>>;

// A Result holding what the encoders read: the labels (copied) and the model's tables.
ss::Result result_of(const Labels& labels, std::vector<std::string> classes = {},
                     Palette palette = {}) {
  if (labels.ndim() != 2) throw py::value_error("labels: expected a 2-D uint8 array");
  ss::Result r;
  r.height = static_cast<int>(labels.shape(0));
  r.width = static_cast<int>(labels.shape(1));
  r.labels.assign(labels.data(), labels.data() + labels.size());
  r.classes = std::move(classes);
  r.palette = std::move(palette);
  return r;
}

py::bytes to_bytes(const std::string& s) {
  return {s.data(), s.size()};
}

ss::serve::ClassSet class_set(const std::optional<std::vector<int>>& shown, std::size_t classes) {
  if (!shown) return {};
  ss::serve::ClassSet set(classes, false);
  for (const int k : *shown) {
    if (k < 0 || static_cast<std::size_t>(k) >= classes) {
      throw py::value_error("classes: index " + std::to_string(k) + " is out of range");
    }
    set[static_cast<std::size_t>(k)] = true;
  }
  return set;
}

std::vector<int> indices(const ss::serve::ClassSet& set) {
  std::vector<int> out;
  for (std::size_t k = 0; k < set.size(); ++k) {
    if (set[k]) out.push_back(static_cast<int>(k));
  }
  return out;
}

}  // namespace

void bind_serve(py::module_& m) {
  py::module_ s = m.def_submodule(
      "serve",
      "The response encoders of `sapiens-seg serve` (the same C++ code), for sapiens_seg.serve.");

  s.def(
      "labels_png",
      [](const Labels& labels) {
        const ss::Result r = result_of(labels);
        std::string out;
        {
          py::gil_scoped_release nogil;
          out = ss::serve::labels_png(r);
        }
        return to_bytes(out);
      },
      py::arg("labels"), "output=png: the label map as the CLI's <name>_seg.png bytes.");

  s.def(
      "labels_npy",
      [](const Labels& labels) {
        const ss::Result r = result_of(labels);
        std::string out;
        {
          py::gil_scoped_release nogil;
          out = ss::serve::labels_npy(r);
        }
        return to_bytes(out);
      },
      py::arg("labels"), "output=npy: the label map as the CLI's <name>_seg.npy bytes (int64).");

  s.def(
      "overlay_png",
      [](const Labels& labels,
         const py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>& image,
         Palette palette, float opacity, const std::optional<std::vector<int>>& classes) {
        if (image.ndim() != 3 || image.shape(2) != 3) {
          throw py::value_error("image: expected an HxWx3 uint8 RGB array");
        }
        const std::size_t n = palette.size();
        const ss::Result r = result_of(labels, {}, std::move(palette));
        const ss::ImageView view{image.data(), static_cast<int>(image.shape(0)),
                                 static_cast<int>(image.shape(1)), 0};
        const ss::serve::ClassSet shown = class_set(classes, n);
        std::string out;
        {
          py::gil_scoped_release nogil;
          out = ss::serve::overlay_png(r, view, opacity, shown);
        }
        return to_bytes(out);
      },
      py::arg("labels"), py::arg("image"), py::arg("palette"), py::arg("opacity") = 0.5f,
      py::arg("classes") = py::none(),
      "output=overlay: the palette blended over the RGB photo at `opacity`, as an RGB PNG; "
      "with `classes` (indices), the other classes' pixels keep the photo's colour.");

  s.def(
      "summary_json",
      [](const Labels& labels, const std::string& model, std::vector<std::string> class_names,
         Palette palette, const std::map<std::string, std::string>& backend,
         const std::map<std::string, double>& timings, double queue_ms,
         std::vector<std::string> warnings, const std::optional<std::vector<int>>& classes,
         bool rle) {
        const std::size_t n = class_names.size();
        ss::Result r = result_of(labels, std::move(class_names), std::move(palette));
        auto text = [&](const char* key) {
          const auto it = backend.find(key);
          return it == backend.end() ? std::string() : it->second;
        };
        r.backend = {text("mode"), text("device"), text("dtype")};
        auto ms = [&](const char* key) {
          const auto it = timings.find(key);
          return it == timings.end() ? 0.0 : it->second;
        };
        r.timings = {ms("decode"), ms("preprocess"), ms("network"), ms("postprocess"), ms("total")};
        r.warnings = std::move(warnings);
        ss::serve::SummaryOptions o;
        o.model = model;
        o.shown = class_set(classes, n);
        o.rle = rle;
        o.queue_ms = queue_ms;
        std::string out;
        {
          py::gil_scoped_release nogil;
          out = ss::serve::summary_json(r, o);
        }
        return to_bytes(out);
      },
      py::arg("labels"), py::kw_only(), py::arg("model"), py::arg("class_names"),
      py::arg("palette"), py::arg("backend"), py::arg("timings"), py::arg("queue_ms") = 0.0,
      py::arg("warnings") = std::vector<std::string>{}, py::arg("classes") = py::none(),
      py::arg("rle") = false,
      "output=json: the summary as UTF-8 JSON bytes (per-class pixels, fraction, COCO bbox, "
      "optional COCO RLE; timings_ms with `queue`).");

  s.def(
      "parse_classes",
      [](const py::object& spec, const std::vector<std::string>& class_names) {
        if (py::isinstance<py::str>(spec)) {
          return indices(ss::serve::parse_classes(spec.cast<std::string>(), class_names));
        }
        std::vector<std::string> items;  // JSON lists may mix names and indices
        for (const auto& item : spec.cast<py::sequence>()) items.push_back(py::str(item));
        return indices(ss::serve::parse_classes(items, class_names));
      },
      py::arg("spec"), py::arg("class_names"),
      "The `classes` request parameter (a comma list, or a list, of names or indices) as "
      "sorted indices; [] selects every class. InvalidInputError for an unknown item.");

  // The checks segment() makes on an image's leading bytes and header before it decodes a pixel
  // (415 for no known format, 400 for a malformed header, 413 over --max-pixels), so the Ray
  // Serve deployment refuses the same requests with the same statuses.
  s.def(
      "sniff_format",
      [](const py::bytes& data) { return ss::serve::sniff_format(std::string_view(data)); },
      py::arg("data"),
      "The image format its leading bytes name (\"JPEG\", \"PNG\", ...); \"\" for none the "
      "library decodes.");
  s.def(
      "image_info",
      [](const py::bytes& data) {
        const std::string_view v(data);
        ss::ImageInfo info;
        {
          py::gil_scoped_release nogil;
          info = ss::read_image_info(reinterpret_cast<const std::uint8_t*>(v.data()), v.size());
        }
        return py::make_tuple(info.format, info.height, info.width);
      },
      py::arg("data"),
      "(format, height, width) from an encoded image's header, as decoded (after the EXIF "
      "orientation), without decoding a pixel. InvalidInputError for a malformed header.");
}
