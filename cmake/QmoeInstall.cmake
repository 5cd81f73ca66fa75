# cmake --install: headers, the versioned library, a CMake package (find_package(qmoe) ->
# qmoe::qmoe) and a pkg-config file.
include(CMakePackageConfigHelpers)

install(DIRECTORY include/qmoe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING
        PATTERN "*.h")
install(TARGETS qmoe EXPORT qmoeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(QMOE_BUILD_TOOLS)
  # The installed tool finds the installed library next to it (bin/../lib), with no
  # ldconfig or LD_LIBRARY_PATH.
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set_target_properties(qmoe_cli PROPERTIES INSTALL_RPATH "${CMAKE_INSTALL_LIBDIR}")
  else()
    set_target_properties(qmoe_cli PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  endif()
  install(TARGETS qmoe_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(QMOE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/qmoe)
install(EXPORT qmoeTargets NAMESPACE qmoe:: DESTINATION ${QMOE_CMAKE_DIR})
if(QMOE_BUILD_SHARED)
  set(QMOE_PACKAGE_STATIC OFF)
else()
  set(QMOE_PACKAGE_STATIC ON)
endif()
configure_package_config_file(cmake/qmoeConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/qmoeConfig.cmake INSTALL_DESTINATION ${QMOE_CMAKE_DIR})
# 0.x: minor versions may change the ABI, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/qmoeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/qmoeConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/qmoeConfigVersion.cmake
        DESTINATION ${QMOE_CMAKE_DIR})

if(QMOE_BUILD_SHARED)
  set(QMOE_PC_LIBS_PRIVATE "")
else()
  # What a static link needs after -lqmoe (pkg-config --static --libs): the dependencies, the
  # C++ runtime and libm, and with CUDA the static runtime.
  set(QMOE_PC_LIBS_PRIVATE "-lcpuinfo -lpthreadpool -lpthread -lstdc++ -lm")
  if(QMOE_WITH_CUDA AND DEFINED CUDAToolkit_LIBRARY_DIR)
    string(APPEND QMOE_PC_LIBS_PRIVATE
           " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
  endif()
endif()
# Relocatable: the prefix is found from the .pc file's own location, so an install moved
# with `cmake --install --prefix` (or copied) still resolves. Packagers that pass absolute
# library or include directories get those paths as they are (not relocatable).
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(QMOE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(QMOE_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(QMOE_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH QMOE_PC_PREFIX_FROM_PCDIR "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
  string(REGEX REPLACE "/$" "" QMOE_PC_PREFIX_FROM_PCDIR "${QMOE_PC_PREFIX_FROM_PCDIR}")
  set(QMOE_PC_PREFIX "\${pcfiledir}/${QMOE_PC_PREFIX_FROM_PCDIR}")
  set(QMOE_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(QMOE_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(cmake/qmoe.pc.in ${CMAKE_CURRENT_BINARY_DIR}/qmoe.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/qmoe.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
