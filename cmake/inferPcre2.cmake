# PCRE2 (8-bit, UTF + JIT) as the imported target infer::pcre2. Debian ships no CMake package for it,
# only pkg-config; this file is installed with the package so consumers get the same target.
if(NOT TARGET infer::pcre2)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(INFER_PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
  add_library(infer::pcre2 INTERFACE IMPORTED)
  target_link_libraries(infer::pcre2 INTERFACE PkgConfig::INFER_PCRE2)
  target_compile_definitions(infer::pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)
endif()
