# Finds the dependencies. LibTorch comes from the project venv's torch wheel (tools/setup.sh):
# its cmake_prefix_path holds TorchConfig.cmake.

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()

# CUDA is switched on when nvcc is found (AUTO), so CUDA code compiles on machines without a GPU.
if(NOT SAPIENS_SEG_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # SASS for Ampere, Ampere consumer, Ada, Hopper and Blackwell; PTX of the newest for JIT.
      set(CMAKE_CUDA_ARCHITECTURES 80-real 86-real 89-real 90-real 120)
    endif()
    # One CUDA runtime in the process: the shared one LibTorch already loads.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    # The device code is C++17 (CMake 3.25 has no C++20 dialect flag for nvcc; the host C++ that
    # uses C++20 is compiled by the C++ compiler).
    set(CMAKE_CUDA_STANDARD 17)
    # LibTorch's own CUDA flags follow the same list: "80-real" -> 8.0 (SASS), "120" (SASS and
    # PTX) -> 12.0+PTX, "90-virtual" (PTX only, which LibTorch cannot express) -> 9.0+PTX.
    set(_archs "")
    foreach(a IN LISTS CMAKE_CUDA_ARCHITECTURES)
      string(REGEX REPLACE "-(real|virtual)$" "" n "${a}")
      string(REGEX REPLACE "([0-9]+)([0-9])$" "\\1.\\2" n "${n}")
      if(NOT a MATCHES "-real$")
        string(APPEND n "+PTX")
      endif()
      list(APPEND _archs "${n}")
    endforeach()
    list(REMOVE_DUPLICATES _archs)
    string(REPLACE ";" " " TORCH_CUDA_ARCH_LIST "${_archs}")
    set(ENV{TORCH_CUDA_ARCH_LIST} "${TORCH_CUDA_ARCH_LIST}")
    set(SAPIENS_SEG_HAVE_CUDA ON)
    set(SAPIENS_SEG_CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
    message(STATUS "sapiens-seg: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES} (LibTorch: ${TORCH_CUDA_ARCH_LIST})")
  elseif(SAPIENS_SEG_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SAPIENS_SEG_CUDA=ON but no CUDA compiler was found")
  endif()
endif()

if(NOT Torch_DIR)
  set(_py "${CMAKE_SOURCE_DIR}/.venv/bin/python")
  if(NOT EXISTS "${_py}")
    find_package(Python3 COMPONENTS Interpreter REQUIRED)
    set(_py "${Python3_EXECUTABLE}")
  endif()
  # PYTHONPATH is dropped so that pip's isolated build environment (pip install .) does not hide
  # the venv's torch from its own interpreter.
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH
                          "${_py}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "torch not found for ${_py}: run tools/setup.sh first")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
endif()
set(SAPIENS_SEG_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "Python with torch, numpy and cv2, for fixtures and Python tests")
# Without a CUDA compiler LibTorch's CMake must not look for the toolkit either.
if(NOT SAPIENS_SEG_HAVE_CUDA)
  set(CAFFE2_USE_CUDA OFF)
  set(USE_CUDA OFF)
  # A CUDA build of LibTorch still sets CUDA up when it finds nvcc (SAPIENS_SEG_CUDA=OFF on a
  # machine with a toolkit): give it a dialect CMake knows for nvcc and an architecture list, so
  # it neither fails on C++20 nor compiles probe programs to look for GPUs.
  set(CMAKE_CUDA_STANDARD 17)
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "8.0")
  endif()
endif()
find_package(Torch REQUIRED)
message(STATUS "sapiens-seg: LibTorch ${Torch_VERSION} from ${Torch_DIR}")
if(SAPIENS_SEG_HAVE_CUDA)
  # LibTorch's CUDA setup switches CMAKE_CUDA_ARCHITECTURES off and appends -gencode flags of its
  # own (from TORCH_CUDA_ARCH_LIST, set above from the same list) to CMAKE_CUDA_FLAGS. The list
  # above stays the one source of truth: restore it and drop LibTorch's copies, or every .cu file
  # would be compiled twice per architecture.
  set(CMAKE_CUDA_ARCHITECTURES "${SAPIENS_SEG_CUDA_ARCHITECTURES}")
  string(REGEX REPLACE "-gencode;?[ ]*arch=compute_[0-9a-z]+,code=[a-z_0-9]+" "" CMAKE_CUDA_FLAGS
                       "${CMAKE_CUDA_FLAGS}")
  string(REGEX REPLACE "  +" " " CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS}")
endif()

# The torch wheel brings its own CUDA runtime, cuDNN and NCCL (site-packages/nvidia/*/lib), newer
# than or different from a system toolkit. Linking and running must resolve LibTorch's
# dependencies to those, not to same-named system libraries (an older NCCL lacks symbols).
get_filename_component(_torch_site "${Torch_DIR}/../../../.." ABSOLUTE)
file(GLOB SAPIENS_SEG_TORCH_NVIDIA_LIBS LIST_DIRECTORIES true "${_torch_site}/nvidia/*/lib")
if(SAPIENS_SEG_TORCH_NVIDIA_LIBS)
  list(JOIN SAPIENS_SEG_TORCH_NVIDIA_LIBS ":" _joined)
  add_link_options("LINKER:-rpath-link,${_joined}")
  set(CMAKE_BUILD_RPATH ${SAPIENS_SEG_TORCH_NVIDIA_LIBS})
endif()
# Installed binaries find LibTorch (and its CUDA libraries) where they were built against.
get_filename_component(SAPIENS_SEG_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
set(SAPIENS_SEG_RUNTIME_RPATH ${SAPIENS_SEG_TORCH_LIB_DIR} ${SAPIENS_SEG_TORCH_NVIDIA_LIBS})

# The core (the safetensors reader) parses JSON too, so even a core-only build needs the
# header-only nlohmann/json: point CMake at it with CMAKE_PREFIX_PATH or -Dnlohmann_json_DIR where
# it is not installed system-wide (the GPU machine carries it).
find_package(nlohmann_json 3.10 REQUIRED)

# The TorchScript archive reader checks each record's CRC-32 and inflates deflated records: zlib
# (Debian zlib1g-dev) always; ISA-L (Debian libisal-dev) when found, for a CRC several times
# faster than zlib 1.2's (carry-less multiply), which the load time of a 1.3 GB checkpoint shows.
# Where only the runtime package is installed (the GPU machine: tools/gpu/gpu_check.sh carries the
# two headers), libz.so.1 itself is linked.
find_library(ZLIB_LIBRARY NAMES z libz.so.1)
find_package(ZLIB REQUIRED)
set(SAPIENS_SEG_ZIP_LIBRARIES ZLIB::ZLIB)
option(SAPIENS_SEG_ISAL "Use ISA-L for the CRC-32 of checkpoint records when it is found" ON)
set(SAPIENS_SEG_HAVE_ISAL OFF)
if(SAPIENS_SEG_ISAL)
  find_path(SAPIENS_SEG_ISAL_INCLUDE_DIR isa-l/crc.h)
  find_library(SAPIENS_SEG_ISAL_LIBRARY isal)
  if(SAPIENS_SEG_ISAL_INCLUDE_DIR AND SAPIENS_SEG_ISAL_LIBRARY)
    set(SAPIENS_SEG_HAVE_ISAL ON)
    add_library(sapiens_seg_isal INTERFACE IMPORTED)
    set_target_properties(sapiens_seg_isal PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${SAPIENS_SEG_ISAL_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${SAPIENS_SEG_ISAL_LIBRARY}")
    list(APPEND SAPIENS_SEG_ZIP_LIBRARIES sapiens_seg_isal)
    message(STATUS "sapiens-seg: CRC-32 of checkpoint records by ISA-L (${SAPIENS_SEG_ISAL_LIBRARY})")
  else()
    message(STATUS "sapiens-seg: ISA-L not found (libisal-dev): CRC-32 of checkpoint records by zlib")
  endif()
endif()

if(SAPIENS_SEG_BUILD_IO)
  find_package(OpenCV REQUIRED COMPONENTS core imgproc imgcodecs videoio)
  find_package(Threads REQUIRED)
  find_package(OpenSSL REQUIRED COMPONENTS Crypto)
  find_package(CURL 7.85 REQUIRED)
  find_package(CLI11 REQUIRED)
  # Image headers are read before OpenCV decodes anything (src/io/image_header.cpp): the same
  # libjpeg, libpng, libtiff and libwebp that OpenCV decodes with, and stb_image for BMP/PNM.
  find_package(JPEG REQUIRED)
  find_package(PNG REQUIRED)
  find_package(TIFF 4.5 REQUIRED)  # TIFFClientOpenExt: per-handle error handlers
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(WEBP REQUIRED IMPORTED_TARGET libwebp)
  pkg_check_modules(STB REQUIRED IMPORTED_TARGET stb)
  set(SAPIENS_SEG_IMAGE_LIBS JPEG::JPEG PNG::PNG TIFF::TIFF PkgConfig::WEBP PkgConfig::STB)
  # The CLI's video reader (src/cli/video_reader.cpp): FFmpeg's container, codec, scaling and
  # utility libraries (Debian 12: FFmpeg 5.1; the reader builds against 5.0 to 7.x). Linked to
  # the sapiens-seg executable only, not to the library.
  pkg_check_modules(FFMPEG REQUIRED IMPORTED_TARGET libavformat>=59 libavcodec>=59 libswscale>=6
                    libavutil>=57)
endif()

# ---- what the kernels backend needs (kernels/kernels.cmake) ----------------------------------
# cuBLASLt from the CUDA toolkit; cuDNN and its headers from the torch wheel (the library LibTorch
# itself loads), else from the system; the header-only cudnn-frontend from the venv's PyPI
# package nvidia-cudnn-frontend (tools/setup.sh), or from SAPIENS_SEG_CUDNN_FRONTEND_INCLUDE
# (the GPU machine gets it carried with the working tree). Missing pieces leave the kernels out
# of the build, and the `kernels` mode then says "not compiled in".
set(SAPIENS_SEG_WITH_KERNELS OFF)
option(SAPIENS_SEG_KERNELS "Build the CUDA kernels backend when CUDA and cuDNN are found" ON)
if(SAPIENS_SEG_HAVE_CUDA AND SAPIENS_SEG_KERNELS)
  find_package(CUDAToolkit REQUIRED)
  set(SAPIENS_SEG_CUDNN_FRONTEND_INCLUDE "" CACHE PATH
      "Folder holding cudnn_frontend.h (default: the venv's nvidia-cudnn-frontend package)")
  if(NOT SAPIENS_SEG_CUDNN_FRONTEND_INCLUDE)
    set(_py "${CMAKE_SOURCE_DIR}/.venv/bin/python")
    if(NOT EXISTS "${_py}")
      set(_py "${Python3_EXECUTABLE}")
    endif()
    execute_process(
      COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH "${_py}" -c
              "import importlib.metadata as m, os; f = [p for p in m.files('nvidia-cudnn-frontend') if str(p).endswith('include/cudnn_frontend.h')]; print(os.path.dirname(f[0].locate()) if f else '')"
      OUTPUT_VARIABLE _fe OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
    if(_rc EQUAL 0 AND EXISTS "${_fe}/cudnn_frontend.h")
      set(SAPIENS_SEG_CUDNN_FRONTEND_INCLUDE "${_fe}" CACHE PATH "" FORCE)
    endif()
  endif()
  find_path(SAPIENS_SEG_CUDNN_INCLUDE_DIR cudnn.h
            HINTS "${_torch_site}/nvidia/cudnn/include" ${CUDAToolkit_INCLUDE_DIRS})
  find_library(SAPIENS_SEG_CUDNN_LIBRARY NAMES libcudnn.so.9 cudnn NAMES_PER_DIR
               HINTS "${_torch_site}/nvidia/cudnn/lib" ${CUDAToolkit_LIBRARY_DIR})
  if(NOT EXISTS "${SAPIENS_SEG_CUDNN_FRONTEND_INCLUDE}/cudnn_frontend.h")
    message(STATUS "sapiens-seg: kernels backend off: cudnn_frontend.h not found (pip install "
                   "nvidia-cudnn-frontend, or set SAPIENS_SEG_CUDNN_FRONTEND_INCLUDE)")
  elseif(NOT SAPIENS_SEG_CUDNN_INCLUDE_DIR OR NOT SAPIENS_SEG_CUDNN_LIBRARY)
    message(STATUS "sapiens-seg: kernels backend off: cuDNN (cudnn.h, libcudnn) not found")
  elseif(NOT TARGET CUDA::cublasLt)
    message(STATUS "sapiens-seg: kernels backend off: cuBLASLt not found in the CUDA toolkit")
  else()
    set(SAPIENS_SEG_WITH_KERNELS ON)
    message(STATUS "sapiens-seg: kernels backend on (cuDNN ${SAPIENS_SEG_CUDNN_LIBRARY}, "
                   "cudnn-frontend ${SAPIENS_SEG_CUDNN_FRONTEND_INCLUDE})")
  endif()
endif()
