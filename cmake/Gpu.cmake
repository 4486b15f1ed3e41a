# Detects CUDA and NCCL (optional). Sets COLLECTIVED_HAVE_CUDA / COLLECTIVED_HAVE_NCCL and the
# imported target collectived::nccl. Everything builds and tests without them.
set(COLLECTIVED_HAVE_CUDA OFF)
set(COLLECTIVED_HAVE_NCCL OFF)
option(COLLECTIVED_WITH_GPU "Build the GPU backend when CUDA and NCCL are found" ON)

if(COLLECTIVED_WITH_GPU)
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  # CMake 3.25's FindCUDAToolkit marks CUDA::nvToolsExt deprecated without checking that the
  # target exists, when the project requires CMake >= 3.25; CUDA 12.9+ ships no nvToolsExt, so
  # configuring fails ("set_property could not find TARGET CUDA::nvToolsExt"). The module only
  # reads the required version to decide whether to warn: it sees 3.24 while it runs.
  set(_collectived_required_version ${CMAKE_MINIMUM_REQUIRED_VERSION})
  set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
  find_package(CUDAToolkit QUIET)
  set(CMAKE_MINIMUM_REQUIRED_VERSION ${_collectived_required_version})
  if(CUDAToolkit_FOUND)
    set(COLLECTIVED_HAVE_CUDA ON)
    find_path(COLLECTIVED_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
              /usr/local/cuda/include)
    find_library(COLLECTIVED_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR}
                 /usr/local/cuda/lib64)
    if(COLLECTIVED_NCCL_INCLUDE_DIR AND COLLECTIVED_NCCL_LIBRARY)
      set(COLLECTIVED_HAVE_NCCL ON)
      add_library(collectived::nccl UNKNOWN IMPORTED)
      set_target_properties(collectived::nccl PROPERTIES
        IMPORTED_LOCATION ${COLLECTIVED_NCCL_LIBRARY}
        INTERFACE_INCLUDE_DIRECTORIES ${COLLECTIVED_NCCL_INCLUDE_DIR})
    endif()
  endif()
endif()

if(COLLECTIVED_HAVE_CUDA AND COLLECTIVED_HAVE_NCCL AND NOT EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
  message(STATUS "collectived: nvcc not found next to CUDA ${CUDAToolkit_VERSION}: no device kernels")
  set(COLLECTIVED_HAVE_CUDA OFF)
endif()

if(COLLECTIVED_HAVE_CUDA AND COLLECTIVED_HAVE_NCCL)
  set(COLLECTIVED_GPU_BACKEND ON)
  # The device kernels (engine/cuda/*.cu): Ampere and Hopper machine code, and PTX that newer
  # GPUs compile at load time.
  set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80-real 90)
  endif()
  enable_language(CUDA)
  message(STATUS "collectived: GPU backend: ON (CUDA ${CUDAToolkit_VERSION}, NCCL ${COLLECTIVED_NCCL_LIBRARY})")
else()
  set(COLLECTIVED_GPU_BACKEND OFF)
  message(STATUS "collectived: GPU backend: OFF (CUDA found: ${COLLECTIVED_HAVE_CUDA}, NCCL found: ${COLLECTIVED_HAVE_NCCL})")
endif()
