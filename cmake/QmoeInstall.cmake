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
  set(QMOE_PC_LIBS_PRIVATE "-lcpuinfo -lpthreadpool -lpthread -lstdc++")
endif()
# Relocatable: the prefix is found from the .pc file's own location, so an install moved
# with `cmake --install --prefix` (or copied) still resolves.
file(RELATIVE_PATH QMOE_PC_PREFIX_FROM_PCDIR "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
string(REGEX REPLACE "/$" "" QMOE_PC_PREFIX_FROM_PCDIR "${QMOE_PC_PREFIX_FROM_PCDIR}")
configure_file(cmake/qmoe.pc.in ${CMAKE_CURRENT_BINARY_DIR}/qmoe.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/qmoe.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
