# cmake --install writes a prefix from which find_package(infer) works (tests/consumer proves it).
include(CMakePackageConfigHelpers)
install(DIRECTORY include/infer DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/infer/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/infer)
# infer::mpi (dist/mpi.hpp's MPI) where the build found MPI; the package then finds MPI too (inferConfig.cmake).
set(INFER_EXPORTED_TARGETS infer infer_kernels)
if(TARGET infer_mpi)
  set_target_properties(infer_mpi PROPERTIES EXPORT_NAME mpi)
  list(APPEND INFER_EXPORTED_TARGETS infer_mpi)
endif()
install(TARGETS ${INFER_EXPORTED_TARGETS} EXPORT inferTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT inferTargets NAMESPACE infer:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/infer)
configure_package_config_file(cmake/inferConfig.cmake.in ${PROJECT_BINARY_DIR}/inferConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/infer)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/inferConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/inferConfig.cmake ${PROJECT_BINARY_DIR}/inferConfigVersion.cmake
  cmake/inferPcre2.cmake cmake/inferXxhash.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/infer)
