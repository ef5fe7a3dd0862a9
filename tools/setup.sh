#!/usr/bin/env bash
# Installs what sapiens-seg needs to build and test, then stops. Idempotent: a second run only
# checks and returns in seconds.
#
#   tools/setup.sh            Debian -dev packages + .venv with the pinned torch and test deps
#   tools/setup.sh --no-apt   skip the Debian packages (e.g. a machine without root)
#   tools/setup.sh --bench    also the CPU peers that benchmarks/speed_check compares against
#                             (ONNX Runtime, OpenVINO, transformers; not needed by the tests)
#
# LibTorch comes from the pinned PyPI torch wheel: it ships the C++ headers, the shared
# libraries and TorchConfig.cmake, so no separate LibTorch download is needed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"

TORCH_VERSION=2.15.0
PY_REQS=(
  "torch==${TORCH_VERSION}"
  "numpy==2.3.5"
  "opencv-python-headless==5.0.0.93" # the reference pipeline: the cv2 release users of the authors' demos install today (resize bytes)
  "pytest==8.4.2"
  "jsonschema==4.26.0"         # validates the CLI's --json lines in the tests
  "pybind11==3.1.0"           # the Python binding (python/), found by CMake through this venv
  "scikit-build-core==1.1.2"  # pip install --no-build-isolation . (pyproject.toml)
  "pillow==13.0.0"            # the binding's PIL input test
  "safetensors==0.8.0"        # cross-checks of the C++ safetensors reader (safetensors_tests); transformers 5.23 (--bench) needs >= 0.8
  "nvidia-cudnn-frontend==1.32.0" # header-only cuDNN graph API for the kernels backend (CMake finds its headers here)
  "ray[data,serve]==2.60.0"   # sapiens_seg.ray (Ray Data) and sapiens_seg.serve (Ray Serve), and their tests
  "starlette==1.10.0"         # pulled by ray[serve]; sapiens_seg.serve answers with its Response
  "python-multipart==0.0.34"  # sapiens_seg.serve reads multipart/form-data bodies with it (Starlette's parser)
  "pyarrow==26.0.1"           # pulled by ray[data]; pinned so the tested versions are installed
  "pandas==3.1.1"             # likewise
  "tqdm==4.70.1"              # Ray Data draws its progress bars with it (none without)
  "httpx==0.28.1"             # tests/python/test_serve.py talks to `sapiens-seg serve` with it
  "schemathesis==4.32.5"      # fuzzes the server against docs/openapi.json (test_serve.py)
  "selenium==4.51.0"          # drives chromium through the server's web page (test_serve_browser.py); 4.52 needs a certifi newer than PyPI's
  "pycocotools==2.0.11"       # checks the server's COCO RLE masks (test_serve.py)
)
# The runtimes a CPU user would pick instead of this library, for benchmarks/speed_check's peer
# columns (benchmarks/peers_python.py, tools/export_onnx.py). Benchmark extras only: CI and the
# tests never install them.
BENCH_REQS=(
  "onnx==1.23.2"              # tools/export_onnx.py writes the peers' ONNX export
  "onnxscript==0.7.2"         # torch.onnx's exporter imports it
  "onnxruntime==1.31.1"       # the ONNX Runtime column (CPU provider), and the export's check
  "openvino==2026.4.1"        # the OpenVINO columns (CPU plugin, f32 and its default precision)
  "transformers==5.23.0"      # Sapiens2ForSemanticSegmentation, the transformers column
  "fastapi==0.165.0"          # benchmarks/serve_fastapi_peer.py, the Python server beside sapiens-seg serve
  "uvicorn==0.55.0"           # the peer's HTTP server (both also come with ray[serve])
)
APT_PKGS=(
  build-essential cmake ninja-build ccache pkg-config
  libopencv-dev nlohmann-json3-dev libcli11-dev libgtest-dev libbenchmark-dev
  libssl-dev libcurl4-openssl-dev
  zlib1g-dev libisal-dev   # checkpoint records: inflation and CRC-32 (ISA-L: the fast CRC)
  # image headers read before decoding (src/io/image_header.cpp); the first four are OpenCV's
  # own decoders, stb_image reads BMP and PGM/PPM headers
  libjpeg62-turbo-dev libpng-dev libtiff-dev libwebp-dev libstb-dev
  python3-dev python3-venv # the venv, and Python.h for the binding
  # the CLI's video reader: FFmpeg's containers, decoders, pixel conversion (src/cli/video_reader.cpp)
  libavformat-dev libavcodec-dev libswscale-dev libavutil-dev
  ffmpeg                   # ffprobe: the tests check the overlay video's codec, frames and rate
  libboost1.81-dev         # Boost.Beast and Asio (header-only): the HTTP server of `sapiens-seg serve`
  chromium chromium-driver # a headless browser for the server's web page test (test_serve_browser.py)
)

with_apt=1
with_bench=0
for a in "$@"; do
  case "$a" in
    --no-apt) with_apt=0 ;;
    --bench) with_bench=1 ;;
    *) echo "setup.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

log() { printf '[setup] %s\n' "$*" >&2; }

if [ "$with_apt" = 1 ]; then
  "$(dirname "${BASH_SOURCE[0]}")/apt_install.sh" "${APT_PKGS[@]}"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi

# A stamp of the requirement list makes the second run skip pip entirely.
stamp=.venv/.sapiens-seg-reqs
[ "$with_bench" = 1 ] && PY_REQS+=("${BENCH_REQS[@]}")
want=$(printf '%s\n' "${PY_REQS[@]}")
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  log ".venv up to date (torch ${TORCH_VERSION})"
else
  log "installing Python packages into .venv (torch ${TORCH_VERSION} is large; first run only)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "${PY_REQS[@]}"
  printf '%s\n' "$want" >"$stamp"
fi

# The Python binding is assembled by `cmake --build --preset release` in build/python; a .pth
# file puts that folder on .venv's sys.path, so `.venv/bin/python -c "import sapiens_seg"` works
# after the build. A package installed with `pip install .` comes first (site-packages is
# searched before the folders .pth files add).
site_dir=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pth="$site_dir/sapiens_seg_build.pth"
if [ "$(cat "$pth" 2>/dev/null)" != "$here/build/python" ]; then
  printf '%s\n' "$here/build/python" >"$pth"
  log "sapiens_seg: .venv imports the binding from build/python"
fi
log "done"
