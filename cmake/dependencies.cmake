# Third-party dependencies, all from Debian's packages (scripts/setup.sh installs them).
# The header library needs nlohmann_json and PCRE2; programs add CLI11 and fmt; tests add Catch2.
include(GNUInstallDirs)
find_package(nlohmann_json 3.10 REQUIRED)
include(${CMAKE_CURRENT_LIST_DIR}/inferPcre2.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/inferXxhash.cmake)
# OpenBLAS for the CPU backend's GEMMs (BLAS::BLAS, linked into infer::kernels). Only kernels/cpu/*.cpp
# include <cblas.h>, so its folder is a private include of infer::kernels, found here once.
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(INFER_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas x86_64-linux-gnu/openblas-pthread
  DOC "folder holding OpenBLAS's cblas.h")
if(NOT INFER_CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "infer: OpenBLAS's cblas.h was not found; install libopenblas-dev (scripts/setup.sh does)")
endif()
if(INFER_BUILD_EXAMPLES OR INFER_BUILD_BENCH OR INFER_BUILD_SERVER)
  find_package(CLI11 REQUIRED)
  find_package(fmt REQUIRED)
endif()
if(INFER_BUILD_TESTS)
  find_package(Catch2 2.13 REQUIRED)
endif()
