# Third-party dependencies, all from Debian's packages (scripts/setup.sh installs them).
# The header library needs nlohmann_json and PCRE2; programs add CLI11 and fmt; tests add Catch2.
include(GNUInstallDirs)
find_package(nlohmann_json 3.10 REQUIRED)
include(${CMAKE_CURRENT_LIST_DIR}/inferPcre2.cmake)
if(INFER_BUILD_EXAMPLES OR INFER_BUILD_BENCH OR INFER_BUILD_SERVER)
  find_package(CLI11 REQUIRED)
  find_package(fmt REQUIRED)
endif()
if(INFER_BUILD_TESTS)
  find_package(Catch2 2.13 REQUIRED)
endif()
