# Third-party dependencies. Every one comes from a Debian package (see README.md).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(LIBUV REQUIRED IMPORTED_TARGET libuv)   # libuv1-dev: TCP store, I/O thread pool
pkg_check_modules(ISAL REQUIRED IMPORTED_TARGET libisal)   # libisal-dev: CRC32C (crc32_iscsi)
find_package(Gloo CONFIG REQUIRED)                         # libgloo-dev: CPU collectives
if(SX_BUILD_TESTS)
  pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka) # libcmocka-dev: tests
endif()

# CUDA toolkit and NCCL: optional. AUTO builds GPU support where both are found.
set(SX_HAVE_CUDA OFF)
if(NOT SX_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    foreach(candidate /usr/local/cuda/bin/nvcc /opt/cuda/bin/nvcc)
      if(EXISTS ${candidate})
        set(CMAKE_CUDA_COMPILER ${candidate} CACHE FILEPATH "" FORCE)
        break()
      endif()
    endforeach()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    get_filename_component(_sx_cuda_bin ${CMAKE_CUDA_COMPILER} DIRECTORY)
    get_filename_component(_sx_cuda_root ${_sx_cuda_bin} DIRECTORY)
    # NCCL sits beside CUDA on these machines, or under its own prefix (NCCL_ROOT).
    find_path(SX_NCCL_INCLUDE_DIR nccl.h
      HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${_sx_cuda_root}
      PATH_SUFFIXES include targets/x86_64-linux/include)
    find_library(SX_NCCL_LIBRARY nccl
      HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${_sx_cuda_root}
      PATH_SUFFIXES lib lib64 targets/x86_64-linux/lib)
    if(SX_NCCL_INCLUDE_DIR AND SX_NCCL_LIBRARY)
      set(SX_HAVE_CUDA ON)
    endif()
  endif()
  if(SX_WITH_CUDA STREQUAL "ON" AND NOT SX_HAVE_CUDA)
    message(FATAL_ERROR "SX_WITH_CUDA=ON but the CUDA toolkit (nvcc) or NCCL (nccl.h, libnccl) was not found; "
                        "set CMAKE_CUDA_COMPILER and NCCL_ROOT, or use SX_WITH_CUDA=AUTO/OFF")
  endif()
endif()
if(SX_HAVE_CUDA)
  # Ampere and Hopper machine code, plus Hopper PTX that newer GPUs' drivers compile at load.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80-real;90-real;90-virtual")
  endif()
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_VISIBILITY_PRESET hidden)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # libsx links the CUDA runtime statically (CUDA::cudart_static): it then needs no
  # libcudart.so where it runs, and the runtime opens the driver (libcuda.so) only at the
  # first CUDA call, so libsx loads and runs its CPU path on machines with no driver.
  # libcuda is never linked directly for that reason.
  # NCCL, for the collectives: its own imported target, linked where it is used.
  add_library(sx_nccl INTERFACE IMPORTED)
  set_target_properties(sx_nccl PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${SX_NCCL_INCLUDE_DIR}"
                                           INTERFACE_LINK_LIBRARIES "${SX_NCCL_LIBRARY}")
endif()
message(STATUS "sx: CUDA toolkit ${CMAKE_CUDA_COMPILER}, NCCL ${SX_NCCL_LIBRARY}: GPU support ${SX_HAVE_CUDA}")
