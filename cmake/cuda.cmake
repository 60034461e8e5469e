# The CUDA backend: kernels for sm_90a first (H100/H200), sm_80 kept compiling.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  set(CMAKE_CUDA_ARCHITECTURES "90a;80")  # H100/H200 first; A100 kept compiling
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)

target_sources(qinfer_lib PRIVATE
  src/backends/cuda/allocator.cu
  src/backends/cuda/gemv.cu
  src/backends/cuda/gemv_rows_bf16.cu
  src/backends/cuda/gemv_rows_norm.cu
  src/backends/cuda/gemv_balanced.cu
  src/backends/cuda/qgemv.cu
  src/backends/cuda/qgemv_ring_global.cu
  src/backends/cuda/qgemv_ring_stage_norm.cu
  src/backends/cuda/qgemv_ring_stage_bf16.cu
  src/backends/cuda/qgemm_mma.cu
  src/backends/cuda/qgemm_rs.cu
  src/backends/cuda/qlinear.cpp
  src/backends/cuda/elementwise.cu
  src/backends/cuda/sampling.cu
  src/backends/cuda/attention.cu
  src/backends/cuda/attention_decode_tc.cu
  src/backends/cuda/attention_decode_q8.cu
  src/backends/cuda/attention_prefill_pipelined.cu
  src/backends/cuda/attention_prefill_wgmma.cu
  src/backends/cuda/attention_prefill_tma.cu
  src/backends/cuda/kv_dequant.cu
  src/backends/cuda/moe.cu
  src/backends/cuda/moe_decode.cu
  src/backends/cuda/moe_down_rows16.cu
  src/backends/cuda/moe_router.cu
  src/backends/cuda/moe_quant.cu
  src/backends/cuda/moe_wgmma.cu
  src/backends/cuda/peer_sum.cu
  src/backends/cuda/bandwidth_probe.cu
  src/backends/cuda/gemm.cpp
  src/backends/cuda/kernel_trace.cpp
  src/backends/cuda/tensor_map.cpp
  src/model/qwen_cuda.cpp
  src/model/qwen_cuda_decode.cpp
  src/model/qwen_cuda_moe.cpp
  src/model/qwen_cuda_paged.cpp
  src/model/qwen_cuda_prefill.cpp)
target_compile_definitions(qinfer_lib PUBLIC QINFER_CUDA)
# Kernels on Hopper-only instructions (wgmma) are compiled for sm_90a alone; the host picks them where they exist.
if(CMAKE_CUDA_ARCHITECTURES MATCHES "90a")
  target_compile_definitions(qinfer_lib PRIVATE QINFER_SM90A)
endif()
target_compile_options(qinfer_lib PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xcompiler=-Wall>)
target_link_libraries(qinfer_lib PUBLIC CUDA::cudart CUDA::cublasLt)
# CUPTI for `qinfer bench --trace` (backends/cuda/kernel_trace.cpp): its headers at build time, the library opened
# with dlopen only when a trace is asked for (the path found here is tried first).
find_path(QINFER_CUPTI_INCLUDE_DIR cupti_activity.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} "${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/include" "${CUDAToolkit_TARGET_DIR}/extras/CUPTI/include")
find_library(QINFER_CUPTI_LIBRARY NAMES cupti
  HINTS ${CUDAToolkit_LIBRARY_DIR} "${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/lib64" "${CUDAToolkit_TARGET_DIR}/extras/CUPTI/lib64")
if(QINFER_CUPTI_INCLUDE_DIR)
  set_source_files_properties(src/backends/cuda/kernel_trace.cpp PROPERTIES
    INCLUDE_DIRECTORIES "${QINFER_CUPTI_INCLUDE_DIR}" COMPILE_DEFINITIONS "QINFER_HAVE_CUPTI")
  if(QINFER_CUPTI_LIBRARY)
    set_property(SOURCE src/backends/cuda/kernel_trace.cpp APPEND PROPERTY COMPILE_DEFINITIONS "QINFER_CUPTI_LIBRARY=\"${QINFER_CUPTI_LIBRARY}\"")
  endif()
endif()
target_link_libraries(qinfer_lib PUBLIC ${CMAKE_DL_LIBS})
# NCCL for tensor parallel over the GPUs of a host (model/qwen_cuda_tp.cpp): the toolkit's or the system's.
find_path(QINFER_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATHS /usr/include /usr/local/include)
find_library(QINFER_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR} "${CUDAToolkit_LIBRARY_ROOT}/lib" PATHS /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu)
if(QINFER_NCCL_INCLUDE_DIR AND QINFER_NCCL_LIBRARY)
  message(STATUS "NCCL: ${QINFER_NCCL_LIBRARY} (tensor parallel on the GPUs)")
  target_sources(qinfer_lib PRIVATE src/model/qwen_cuda_tp.cpp src/tools/cmd_allreduce.cpp)
  set_source_files_properties(src/model/qwen_cuda_tp.cpp src/tools/cmd_allreduce.cpp PROPERTIES INCLUDE_DIRECTORIES "${QINFER_NCCL_INCLUDE_DIR}")
  target_compile_definitions(qinfer_lib PUBLIC QINFER_HAVE_NCCL)
  target_link_libraries(qinfer_lib PUBLIC ${QINFER_NCCL_LIBRARY})
else()
  message(STATUS "NCCL not found: --tp on the GPUs is not built")
endif()
set_target_properties(qinfer_lib PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF)
