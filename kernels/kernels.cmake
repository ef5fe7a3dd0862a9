# The kernels backend: three CUDA kernel families and the Runners composed of them (the
# schedules in src/core/v1 and src/core/v2/kernels_schedule.cpp over src/core/kernel_ops.hpp),
# as one static library that sapiens_seg_core (and so every binary built on it) links. Included
# from the top-level CMakeLists.txt when Dependencies.cmake found CUDA, cuDNN and cudnn-frontend.
#
# Build cost on a small machine matters (CI compiles this for five architectures on 2 cores):
# device code lives in two .cu files that include no LibTorch header; everything that talks to
# ATen, cuBLASLt or cuDNN is plain C++.
add_library(sapiens_seg_kernels STATIC
  ${CMAKE_SOURCE_DIR}/kernels/fastbb/fastbb.cu
  ${CMAKE_SOURCE_DIR}/kernels/fastbb/fastbb.cpp
  ${CMAKE_SOURCE_DIR}/kernels/fastbb/gemm.cpp
  ${CMAKE_SOURCE_DIR}/kernels/cudnn_hacc/attention.cpp
  ${CMAKE_SOURCE_DIR}/kernels/seg_up/seg_up.cu
  ${CMAKE_SOURCE_DIR}/kernels/seg_up/head.cpp
  ${CMAKE_SOURCE_DIR}/src/core/backends/kernels_runner.cpp
  ${CMAKE_SOURCE_DIR}/src/core/kernel_ops.cpp
  ${CMAKE_SOURCE_DIR}/src/core/v1/kernels_schedule.cpp
  ${CMAKE_SOURCE_DIR}/src/core/v2/kernels_schedule.cpp
  ${CMAKE_SOURCE_DIR}/src/core/backends/cuda_graphs.cpp)
target_include_directories(sapiens_seg_kernels PUBLIC
  ${CMAKE_SOURCE_DIR}
  $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
  $<BUILD_INTERFACE:${CMAKE_BINARY_DIR}/generated/include>)
target_include_directories(sapiens_seg_kernels SYSTEM PRIVATE
  ${SAPIENS_SEG_CUDNN_FRONTEND_INCLUDE} ${SAPIENS_SEG_CUDNN_INCLUDE_DIR})
target_link_libraries(sapiens_seg_kernels PUBLIC ${TORCH_LIBRARIES} CUDA::cublasLt CUDA::cudart
                      ${SAPIENS_SEG_CUDNN_LIBRARY})
# The frontend's JSON serialisation is not used; skipping it keeps its bundled nlohmann copy out.
target_compile_definitions(sapiens_seg_kernels PRIVATE SAPIENS_SEG_BUILDING
                           CUDNN_FRONTEND_SKIP_JSON_LIB)
target_compile_definitions(sapiens_seg_kernels PUBLIC SAPIENS_SEG_WITH_KERNELS)
target_compile_options(sapiens_seg_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
set_target_properties(sapiens_seg_kernels PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")

target_link_libraries(sapiens_seg_core PUBLIC sapiens_seg_kernels)
if(TARGET sapiens_seg)
  target_link_libraries(sapiens_seg PRIVATE sapiens_seg_kernels)
endif()
