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
# The installed sx.pc finds its prefix relative to itself, so an install moved or made
# with `cmake --install --prefix` stays correct. It is written under CMakeFiles/, out of
# the way: the build tree's own sx.pc (below) is the one to use in place.
# SX_PC_RPATH puts an rpath to the library into its Libs (a program linked through it
# runs without LD_LIBRARY_PATH wherever the prefix is); a distribution that installs into
# the loader's own directories may turn it off.
option(SX_PC_RPATH "the installed sx.pc's Libs carry -Wl,-rpath to its libdir" ON)
file(RELATIVE_PATH SX_PC_PREFIX_FROM_PCDIR "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
set(SX_PC_LIBS_RPATH "")
if(SX_PC_RPATH)
  set(SX_PC_LIBS_RPATH " -Wl,-rpath,\${libdir}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/sx.pc.in ${PROJECT_BINARY_DIR}/CMakeFiles/sx-install/sx.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/CMakeFiles/sx-install/sx.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
# sx.pc for this build tree, usable in place (PKG_CONFIG_PATH=<build dir>): the headers
# in the source tree, libsx where this build writes it, and an rpath to it, so that a
# program built through it (a Go one through `#cgo pkg-config: sx`) runs from anywhere
# without LD_LIBRARY_PATH.
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/sx.pc CONTENT
"# sx in its build tree (${PROJECT_BINARY_DIR}); `cmake --install` installs another sx.pc.
libdir=$<TARGET_FILE_DIR:sx>
includedir=${PROJECT_SOURCE_DIR}/include

Name: sx
Description: training runtime with ZeRO-style sharded optimizer state behind a C ABI (build tree)
Version: ${PROJECT_VERSION}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lsx
Cflags: -I\${includedir}
")
