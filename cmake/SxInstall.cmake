# cmake --install: libsx.so.<major> with its SONAME, headers, find_package(sx) and sx.pc.
# Built by `pip install .` (scikit-build-core sets SKBUILD), the component "python" holds
# the library alone, installed inside the Python package `sx`.
if(SKBUILD)
  install(TARGETS sx LIBRARY DESTINATION sx COMPONENT python NAMELINK_SKIP)
endif()
include(CMakePackageConfigHelpers)
install(TARGETS sx EXPORT sxTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/sx DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT sxTargets NAMESPACE sx:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sx)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/sxConfig.cmake.in
  ${PROJECT_BINARY_DIR}/sxConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sx)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sxConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sxConfig.cmake ${PROJECT_BINARY_DIR}/sxConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sx)
# sx.pc finds its prefix relative to itself, so an install moved or made with
# `cmake --install --prefix` stays correct.
file(RELATIVE_PATH SX_PC_PREFIX_FROM_PCDIR "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
configure_file(${PROJECT_SOURCE_DIR}/cmake/sx.pc.in ${PROJECT_BINARY_DIR}/sx.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/sx.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
