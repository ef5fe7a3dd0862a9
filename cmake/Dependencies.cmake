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
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 20)
    # LibTorch's own CUDA flags follow the same list.
    set(_archs "")
    foreach(a IN LISTS CMAKE_CUDA_ARCHITECTURES)
      string(REGEX REPLACE "-(real|virtual)$" "" n "${a}")
      string(REGEX REPLACE "([0-9]+)([0-9])$" "\\1.\\2" n "${n}")
      list(APPEND _archs "${n}")
    endforeach()
    list(REMOVE_DUPLICATES _archs)
    string(REPLACE ";" " " TORCH_CUDA_ARCH_LIST "${_archs}")
    set(ENV{TORCH_CUDA_ARCH_LIST} "${TORCH_CUDA_ARCH_LIST}")
    set(SAPIENS_SEG_HAVE_CUDA ON)
    message(STATUS "sapiens-seg: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
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
endif()
find_package(Torch REQUIRED)
message(STATUS "sapiens-seg: LibTorch ${Torch_VERSION} from ${Torch_DIR}")

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

if(SAPIENS_SEG_BUILD_IO)
  find_package(OpenCV REQUIRED COMPONENTS core imgproc imgcodecs videoio)
  find_package(Threads REQUIRED)
  find_package(OpenSSL REQUIRED COMPONENTS Crypto)
  find_package(CURL 7.85 REQUIRED)
  find_package(CLI11 REQUIRED)
endif()
