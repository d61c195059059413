# cmake --install: the public headers, the library, the CMake package (find_package(gdn CONFIG)
# gives gdn::gdn) and a pkg-config file (gdn.pc), and the gdn tool when it is built. The
# Python build (pyproject.toml) turns this off: the wheel holds the extension alone.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS gdn EXPORT gdnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/gdn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(GDN_BUILD_TOOLS)
  install(TARGETS gdn_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(_gdn_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/gdn)
install(EXPORT gdnTargets NAMESPACE gdn:: DESTINATION ${_gdn_cmake_dir})
configure_package_config_file(cmake/gdnConfig.cmake.in ${PROJECT_BINARY_DIR}/gdnConfig.cmake
                              INSTALL_DESTINATION ${_gdn_cmake_dir})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gdnConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gdnConfig.cmake ${PROJECT_BINARY_DIR}/gdnConfigVersion.cmake
        DESTINATION ${_gdn_cmake_dir})

# gdn.pc finds its prefix from where it lies (${pcfiledir}), so the installed tree can move
# and `cmake --install --prefix` needs no reconfigure; with an absolute CMAKE_INSTALL_LIBDIR or
# INCLUDEDIR (a distribution's layout) it names the configured directories instead.
set(_gdn_pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(_gdn_pc_prefix "${CMAKE_INSTALL_PREFIX}")
  set(_gdn_pc_libdir "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(_gdn_pc_includedir "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  # From <prefix>/<libdir>/pkgconfig back up to <prefix> (any anchor will do for the walk).
  file(RELATIVE_PATH _gdn_pc_up "/${_gdn_pc_dir}" "/")
  string(REGEX REPLACE "/$" "" _gdn_pc_up "${_gdn_pc_up}")
  set(_gdn_pc_prefix "\${pcfiledir}/${_gdn_pc_up}")
  set(_gdn_pc_libdir "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(_gdn_pc_includedir "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
# The pool's threads (-pthread with g++): a static libgdn.a leaves it to the program's link line.
set(_gdn_thread_libs "")
if(GDN_THREADS)
  set(_gdn_thread_libs "-pthread")
  # dlsym (openmp_executor); in libc itself from glibc 2.34
  foreach(_lib IN LISTS CMAKE_DL_LIBS)
    string(APPEND _gdn_thread_libs " -l${_lib}")
  endforeach()
endif()
if(BUILD_SHARED_LIBS)
  set(_gdn_pc_libs "")
  set(_gdn_pc_libs_private "${_gdn_thread_libs}")
else()
  set(_gdn_pc_libs "${_gdn_thread_libs}")
  set(_gdn_pc_libs_private "")
endif()
configure_file(cmake/gdn.pc.in ${PROJECT_BINARY_DIR}/gdn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/gdn.pc DESTINATION ${_gdn_pc_dir})
