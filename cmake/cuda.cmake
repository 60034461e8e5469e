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
  src/backends/cuda/qgemm_wgmma.cu
  src/backends/cuda/elementwise.cu
  src/backends/cuda/sampling.cu
  src/backends/cuda/attention.cu
  src/backends/cuda/attention_decode_tc.cu
  src/backends/cuda/attention_decode_q8.cu
  src/backends/cuda/attention_prefill_pipelined.cu
  src/backends/cuda/attention_prefill_wgmma.cu
  src/backends/cuda/attention_prefill_tma.cu
  src/backends/cuda/kv_dequant.cu
  src/backends/cuda/gemm.cpp
  src/backends/cuda/tensor_map.cpp
  src/model/qwen_cuda.cpp
  src/model/qwen_cuda_decode.cpp
  src/model/qwen_cuda_prefill.cpp)
target_compile_definitions(qinfer_lib PUBLIC QINFER_CUDA)
# Kernels on Hopper-only instructions (wgmma) are compiled for sm_90a alone; the host picks them where they exist.
if(CMAKE_CUDA_ARCHITECTURES MATCHES "90a")
  target_compile_definitions(qinfer_lib PRIVATE QINFER_SM90A)
endif()
target_compile_options(qinfer_lib PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xcompiler=-Wall>)
target_link_libraries(qinfer_lib PUBLIC CUDA::cudart CUDA::cublasLt)
set_target_properties(qinfer_lib PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF)
