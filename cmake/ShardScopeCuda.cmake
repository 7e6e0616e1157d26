# Decides whether the CUDA/NCCL path is built. CUDA is optional at build time:
# AUTO turns it on only when nvcc and NCCL are present. libcuda is never linked
# directly (cudart is static), so binaries start on machines without a driver.
set(SHARDSCOPE_HAVE_CUDA OFF)
if(NOT SHARDSCOPE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  # NCCL and cuBLAS from the CUDA install, or from NVIDIA's pip wheels (nvidia-nccl-cu13:
  # nvidia/nccl/{include,lib}, the library as libnccl.so.2 only; nvidia-cublas:
  # nvidia/cu13/include), which scripts/deps installs into the project's environment. Only
  # the headers are compiled against; both libraries are dlopen'ed at run time
  # (engine/comm/nccl, workload/cuda/cublasapi.h), so nothing here needs a GPU.
  set(shardscope_nvidia_python "${Python3_EXECUTABLE}")
  if(NOT shardscope_nvidia_python AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(shardscope_nvidia_python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  endif()
  set(shardscope_nvidia_wheels "")
  if(shardscope_nvidia_python)
    execute_process(COMMAND "${shardscope_nvidia_python}" -c
                            "import nvidia; print(list(nvidia.__path__)[0])"
                    OUTPUT_VARIABLE shardscope_nvidia_wheels OUTPUT_STRIP_TRAILING_WHITESPACE
                    ERROR_QUIET)
  endif()
  find_path(SHARDSCOPE_NCCL_INCLUDE nccl.h
            HINTS /usr/local/cuda/include "${shardscope_nvidia_wheels}/nccl/include")
  find_library(SHARDSCOPE_NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS /usr/local/cuda/lib64 "${shardscope_nvidia_wheels}/nccl/lib")
  find_path(SHARDSCOPE_CUBLAS_INCLUDE cublas_v2.h
            HINTS /usr/local/cuda/include "${shardscope_nvidia_wheels}/cu13/include")
  find_library(SHARDSCOPE_CUBLAS_LIBRARY NAMES cublas libcublas.so.13
               HINTS /usr/local/cuda/lib64 "${shardscope_nvidia_wheels}/cu13/lib")
  if(CMAKE_CUDA_COMPILER AND SHARDSCOPE_NCCL_INCLUDE AND SHARDSCOPE_NCCL_LIBRARY AND
     SHARDSCOPE_CUBLAS_INCLUDE)
    set(CMAKE_CUDA_ARCHITECTURES 90)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(SHARDSCOPE_HAVE_CUDA ON)
  elseif(SHARDSCOPE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SHARDSCOPE_CUDA=ON but nvcc, NCCL or cuBLAS's header was not found (looked in /usr/local/cuda and the nvidia-nccl-cu13 and nvidia-cublas wheels of ${shardscope_nvidia_python})")
  else()
    message(STATUS "ShardScope: nvcc, NCCL or cuBLAS's header not found; building the CPU backend only")
  endif()
endif()
message(STATUS "ShardScope: CUDA/NCCL path ${SHARDSCOPE_HAVE_CUDA}")
