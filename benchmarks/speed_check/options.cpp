#include "options.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "sapiens_seg/names.hpp"

namespace speed_check {
namespace fs = std::filesystem;

namespace {

const char* kUsage =
    R"(speed_check: load time, speed and peak memory of each mode beside the original.

  speed_check [--quick] [--model PATH|ID] [--device cpu|cuda|cuda:N]
              [--modes original-python,original,original-autocast,portable,kernels,
                       onnxruntime,openvino,transformers]
              [--dtype float32,bfloat16] [--onnx FILE.onnx]
              [--sizes 480x640,720x1280,...] [--batch 1,8] [--threads N]
              [--warmup 3] [--rounds 3] [--calls 5] [--load-repeats 3]
              [--json FILE] [--python PY] [--python-script original_python.py]
              [--wait-quiet SECONDS] [--accept-noncommercial] [--split]
              [any load option of the library, below]

--quick: the tiny_b fixture (fast to run, not representative of full-size speed), 480x640 at
batch 1 and 8, 1080x1920 and 3000x4000 at batch 1, 1 warm-up, 2 rounds x 3 calls; a few minutes
on 2 cores. --model defaults to the quick fixture with --quick and to sapiens-seg-0.3b-goliath
otherwise. --dtype applies to portable and kernels; the original runs in float32.
OMP_NUM_THREADS is honoured as LibTorch and PyTorch honour it; --threads overrides it.
--wait-quiet S: before each timed call, wait up to S seconds until other jobs use less than a
fifth of a core (the load seen is recorded either way); for machines shared with other work.
Peers (CPU only; benchmarks/peers_python.py, their packages from `tools/setup.sh --bench`):
onnxruntime and openvino (two columns: f32, and OpenVINO's default precision for this CPU;
openvino-f32 or openvino-default for one, e.g. where the default is f32 anyway) run
the project's ONNX export of the model (tools/export_onnx.py, made for this run and checked
against the original unless --onnx names one); transformers runs Sapiens2 files only.
original-python is the authors' pipeline: torch.jit for Sapiens v1, the authors' module
structure (tests/reference/sapiens2.py) for Sapiens2.
On CUDA, original-autocast is the authors' float32 graph run under autocast in the --dtype (their
way to half precision), and each column reports its CUDA-graph captures (how many input shapes
were captured, how many run eagerly and why). --split: after the timed rounds, each column's
backbone and head timed apart at batch 1, eagerly (Sapiens v1; the original's traced submodules
and the kernels schedule's two halves; the portable network has no such entry point).
The result is JSON (--json FILE, else stdout); benchmarks/readme_performance.py --print FILE
shows it as the performance page's tables.

Load options of the library (its option table, as the sapiens-seg CLI spells them; --name VALUE
or --name=VALUE, a yes/no option alone for true), given to every library column; the mode and
dtype are each column's (--modes, --dtype):
)";

std::string flag_name(const std::string& option) {
  std::string out = "--" + option;
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

// The option-table row of a load option the command line may set, or nullptr.
const sapiens_seg::OptionSpec* load_option_for_flag(const std::string& flag) {
  static const std::vector<sapiens_seg::OptionSpec> specs =
      sapiens_seg::option_specs(sapiens_seg::OptionGroup::kLoad);
  for (const auto& s : specs) {
    if (s.name != "mode" && s.name != "dtype" && flag_name(s.name) == flag) return &s;
  }
  return nullptr;
}

std::string usage() {
  std::ostringstream out;
  out << kUsage;
  for (const auto& s : sapiens_seg::option_specs(sapiens_seg::OptionGroup::kLoad)) {
    if (s.name == "mode" || s.name == "dtype") continue;
    std::string flag = flag_name(s.name);
    if (s.type == sapiens_seg::OptionType::kChoice) {
      std::string choices;
      for (const auto& c : s.choices) choices += (choices.empty() ? "" : "|") + c;
      flag += " " + choices;
    } else if (s.type == sapiens_seg::OptionType::kInt) {
      flag += " N";
    } else if (s.type == sapiens_seg::OptionType::kText) {
      flag += " TEXT";
    }
    out << "  " << flag << ": " << s.help;
    if (s.name == "device") {
      out << " (here: cpu unless given)";
    } else if (!s.default_value.empty()) {
      out << " (default " << s.default_value << ")";
    }
    out << "\n";
  }
  return out.str();
}

std::vector<std::string> split(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::pair<int, int> parse_size(const std::string& s) {
  const auto x = s.find('x');
  if (x == std::string::npos) throw std::invalid_argument("size '" + s + "' is not HxW");
  return {std::stoi(s.substr(0, x)), std::stoi(s.substr(x + 1))};
}

}  // namespace

bool is_cuda(const std::string& device) {
  return device.rfind("cuda", 0) == 0;
}

sapiens_seg::LoadOptions apply_load_options(
    const std::vector<std::pair<std::string, std::string>>& options) {
  sapiens_seg::LoadOptions out;
  for (const auto& [name, value] : options) sapiens_seg::set_option(out, name, value);
  return out;
}

std::vector<std::string> load_option_args(const Options& options) {
  std::vector<std::string> out;
  for (const auto& [name, value] : options.load_options)
    out.push_back(flag_name(name) + "=" + value);
  return out;
}

Options parse_args(int argc, char** argv, std::string& command) {
  Options o;
  std::string sizes, batches, dtypes;
  std::string modes =
      "original-python,original,original-autocast,portable,kernels,onnxruntime,openvino,"
      "transformers";
  // The command as typed, minus this machine's directories (results are committed).
  for (int i = 0; i < argc; ++i) {
    std::string a = i == 0 ? fs::path(argv[0]).filename().string() : argv[i];
    if (a.size() > 1 && a[0] == '/') a = fs::path(a).filename().string();
    command += (i ? " " : "") + a;
  }
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick")
      o.quick = true;
    else if (a == "--worker")
      o.worker = true;
    else if (a == "--split")
      o.split = true;
    else if (a == "--model")
      o.model = value(i);
    else if (a == "--modes") {
      modes = value(i);
      o.modes_given = true;
    } else if (a == "--onnx")
      o.onnx = value(i);
    else if (a == "--peers-script")
      o.peers_script = value(i);
    else if (a == "--dtype")
      dtypes = value(i);
    else if (a == "--sizes")
      sizes = value(i);
    else if (a == "--batch")
      batches = value(i);
    else if (a == "--warmup")
      o.warmup = std::stoi(value(i));
    else if (a == "--rounds")
      o.rounds = std::stoi(value(i));
    else if (a == "--calls")
      o.calls = std::stoi(value(i));
    else if (a == "--load-repeats")
      o.load_repeats = std::stoi(value(i));
    else if (a == "--wait-quiet")
      o.wait_quiet = std::stod(value(i));
    else if (a == "--json")
      o.json_out = value(i);
    else if (a == "--python")
      o.python = value(i);
    else if (a == "--python-script")
      o.python_script = value(i);
    else if (a == "--worker-mode")
      o.worker_mode = value(i);
    else if (a == "--worker-dtype")
      o.worker_dtype = value(i);
    else if (a == "-h" || a == "--help") {
      std::cout << usage();
      std::exit(0);
    } else if (const auto eq = a.find('=');
               const auto* spec = load_option_for_flag(a.substr(0, eq))) {
      std::string v;
      if (eq != std::string::npos) {
        v = a.substr(eq + 1);
      } else {
        v = spec->type == sapiens_seg::OptionType::kBool ? "true" : value(i);
      }
      o.load_options.emplace_back(spec->name, v);
    } else {
      const std::string hint = a == "--mode" ? " (the columns' modes are --modes)" : "";
      throw std::invalid_argument("unknown argument '" + a + "'" + hint + "\n\n" + usage());
    }
  }
  const bool device_given = std::any_of(o.load_options.begin(), o.load_options.end(),
                                        [](const auto& kv) { return kv.first == "device"; });
  if (!device_given) o.load_options.insert(o.load_options.begin(), {"device", "cpu"});
  o.load = apply_load_options(o.load_options);  // a bad value fails here, before any worker
  o.device = o.load.device;

  const bool quick_sizes = o.quick && sizes.empty() && batches.empty();
  if (o.quick) {
    // The quick protocol, unless given explicitly.
    auto given = [&](const char* flag) {
      return command.find(std::string(" ") + flag + " ") != std::string::npos;
    };
    if (!given("--warmup")) o.warmup = 1;
    if (!given("--rounds")) o.rounds = 2;
    if (!given("--calls")) o.calls = 3;
  }
  if (quick_sizes) {
    // Batch 8 only at the smallest size: at 3000x4000 it alone takes longer than the rest.
    o.configs = {{480, 640, 1}, {480, 640, 8}, {1080, 1920, 1}, {3000, 4000, 1}};
  } else {
    if (sizes.empty()) sizes = "480x640,720x1280,1080x1920,1024x2048,3000x4000";
    if (batches.empty()) batches = "1,8";
    for (const auto& sz : split(sizes)) {
      const auto [h, w] = parse_size(sz);
      for (const auto& b : split(batches)) o.configs.push_back({h, w, std::stoi(b)});
    }
  }
  if (dtypes.empty()) dtypes = is_cuda(o.device) ? "float16" : "float32,bfloat16";
  o.modes = split(modes);
  o.dtypes = split(dtypes);
  if (o.python.empty()) o.python = SPEED_CHECK_PYTHON;
  if (o.python_script.empty()) o.python_script = SPEED_CHECK_PYTHON_SCRIPT;
  if (o.peers_script.empty()) o.peers_script = SPEED_CHECK_PEERS_SCRIPT;
  o.export_script = SPEED_CHECK_EXPORT_SCRIPT;
  return o;
}

}  // namespace speed_check
