# ctest -P script: install libqmoe into a scratch prefix, then build and run an outside
# consumer against the installed tree, once through find_package(qmoe) and once through
# pkg-config.
# Inputs: BUILD_DIR, CONSUMER_SOURCE_DIR, SCRATCH_DIR, CMAKE_GENERATOR.
function(run_checked)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "failed (${result}): ${ARGN}\n${out}\n${err}")
  endif()
  set(LAST_OUTPUT "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${SCRATCH_DIR}/prefix)
file(REMOVE_RECURSE ${SCRATCH_DIR})
run_checked(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

foreach(required include/qmoe/qmoe.h include/qmoe/qmoe_export.h)
  if(NOT EXISTS ${prefix}/${required})
    message(FATAL_ERROR "install is missing ${required}")
  endif()
endforeach()
file(GLOB_RECURSE config_files ${prefix}/*/qmoeConfig.cmake)
file(GLOB_RECURSE pc_files ${prefix}/*/qmoe.pc)
if(NOT config_files OR NOT pc_files)
  message(FATAL_ERROR "install lacks qmoeConfig.cmake or qmoe.pc")
endif()

# 1. CMake package.
run_checked(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${SCRATCH_DIR}/build
            -G ${CMAKE_GENERATOR} -DCMAKE_PREFIX_PATH=${prefix})
run_checked(${CMAKE_COMMAND} --build ${SCRATCH_DIR}/build)
run_checked(${SCRATCH_DIR}/build/qmoe_consumer)
message(STATUS "find_package consumer: ${LAST_OUTPUT}")

# 2. pkg-config, with a plain C compiler invocation.
list(GET pc_files 0 pc_file)
get_filename_component(pc_dir ${pc_file} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
find_program(PKG_CONFIG pkg-config REQUIRED)
# A static install needs its private dependencies on the link line.
file(GLOB_RECURSE static_archives ${prefix}/*/libqmoe.a)
set(static_flag "")
if(static_archives)
  set(static_flag --static)
endif()
run_checked(${PKG_CONFIG} --cflags --libs ${static_flag} qmoe)
string(STRIP "${LAST_OUTPUT}" pc_flags)
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
set(libdir_flag "")
foreach(flag IN LISTS pc_flags)
  if(flag MATCHES "^-L(.*)")
    set(libdir_flag "-Wl,-rpath,${CMAKE_MATCH_1}")
  endif()
endforeach()
find_program(C_COMPILER NAMES cc gcc REQUIRED)
run_checked(${C_COMPILER} -std=c99 ${CONSUMER_SOURCE_DIR}/consumer.c ${pc_flags} ${libdir_flag}
            -o ${SCRATCH_DIR}/qmoe_consumer_pkgconfig)
run_checked(${SCRATCH_DIR}/qmoe_consumer_pkgconfig)
message(STATUS "pkg-config consumer: ${LAST_OUTPUT}")

# 3. The installed tool runs as installed: it finds the installed shared library through its
# RUNPATH (bin/../lib), with no LD_LIBRARY_PATH.
if(EXISTS ${prefix}/bin/qmoe)
  unset(ENV{LD_LIBRARY_PATH})
  run_checked(${prefix}/bin/qmoe version)
  message(STATUS "installed tool: ${LAST_OUTPUT}")
endif()
