# Third-party dependencies, all from Debian packages (scripts/setup.sh installs them).
#
# cpuinfo: Debian 12's CMake config for cpuinfo points at wrong paths, so use its pkg-config
# file (whose Version field is empty: ask for no version).
# pthreadpool and FP16 ship no CMake config: find_path/find_library.
find_package(PkgConfig REQUIRED)
pkg_check_modules(CPUINFO REQUIRED IMPORTED_TARGET libcpuinfo)

find_path(PTHREADPOOL_INCLUDE_DIR pthreadpool.h)
find_library(PTHREADPOOL_LIBRARY pthreadpool)
if(NOT PTHREADPOOL_INCLUDE_DIR OR NOT PTHREADPOOL_LIBRARY)
  message(FATAL_ERROR "pthreadpool not found: install libpthreadpool-dev (scripts/setup.sh)")
endif()
add_library(qmoe_dep_pthreadpool INTERFACE)
target_include_directories(qmoe_dep_pthreadpool SYSTEM INTERFACE ${PTHREADPOOL_INCLUDE_DIR})
target_link_libraries(qmoe_dep_pthreadpool INTERFACE ${PTHREADPOOL_LIBRARY})

find_package(Threads REQUIRED)

if(QMOE_BUILD_TESTS)
  find_package(GTest REQUIRED)
  find_path(FP16_INCLUDE_DIR fp16.h)
  if(NOT FP16_INCLUDE_DIR)
    message(FATAL_ERROR "FP16 (libfp16-dev) not found; the tests use it as an oracle")
  endif()
endif()
if(QMOE_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()
