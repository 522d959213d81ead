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

# OpenBLAS: optional, for Muon's Newton-Schulz products (src/optim/gemm.h). The serial
# build's static archive and cblas.h, from libopenblas-serial-dev (Debian's per-variant
# directories; SX_OPENBLAS_ROOT names another root holding the same tree). Serial, so that
# it starts no thread of its own and sx's pool decides how many run; static, linked into
# libsx with its symbols hidden (libsx exports sx_* only), so that a process that loads
# another OpenBLAS (numpy's, threaded) neither shares its state nor resolves to it, and the
# wheel carries no extra library. Without it sx's own product runs (gemm_ordered.cc).
set(SX_HAVE_OPENBLAS OFF)
if(NOT SX_WITH_BLAS STREQUAL "OFF")
  set(_sx_blas_roots ${SX_OPENBLAS_ROOT} $ENV{SX_OPENBLAS_ROOT} /)
  set(_sx_blas_inc "")
  set(_sx_blas_lib "")
  foreach(root IN LISTS _sx_blas_roots)
    list(APPEND _sx_blas_inc ${root}/usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-serial)
    list(APPEND _sx_blas_lib ${root}/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-serial)
  endforeach()
  find_path(SX_OPENBLAS_INCLUDE_DIR cblas.h PATHS ${_sx_blas_inc} NO_DEFAULT_PATH)
  find_library(SX_OPENBLAS_LIBRARY NAMES libopenblas.a PATHS ${_sx_blas_lib} NO_DEFAULT_PATH)
  if(SX_OPENBLAS_INCLUDE_DIR AND SX_OPENBLAS_LIBRARY)
    set(SX_HAVE_OPENBLAS ON)
    add_library(sx_openblas INTERFACE IMPORTED)
    set_target_properties(sx_openblas PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${SX_OPENBLAS_INCLUDE_DIR}"
                                                 INTERFACE_LINK_LIBRARIES "${SX_OPENBLAS_LIBRARY};Threads::Threads;m")
  elseif(SX_WITH_BLAS STREQUAL "ON")
    message(FATAL_ERROR "SX_WITH_BLAS=ON but OpenBLAS's serial build (libopenblas-serial-dev: cblas.h and libopenblas.a "
                        "under openblas-serial/) was not found; install it, set SX_OPENBLAS_ROOT, or use SX_WITH_BLAS=AUTO/OFF")
  endif()
endif()
message(STATUS "sx: OpenBLAS (serial) ${SX_OPENBLAS_LIBRARY}: Muon's products through it ${SX_HAVE_OPENBLAS}")
