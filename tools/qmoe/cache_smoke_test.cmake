# Smoke test of `qmoe cache`, for ctest:
#   add_test(NAME tool.cache_smoke COMMAND ${CMAKE_COMMAND} -DQMOE=$<TARGET_FILE:qmoe_cli>
#            -P ${PROJECT_SOURCE_DIR}/tools/qmoe/cache_smoke_test.cmake)
# Checks: two layers, 200 steps, every policy: exit 0 (the tool's conservation checks held) and
# a JSON object with the options and one row per policy, in order, each hit rate in [0, 1];
# drifting routing under a promotion budget (the tool checks every layer's admissions against
# it) exits 0; bad options, and options that would change nothing, exit 2.
if(NOT QMOE)
  message(FATAL_ERROR "pass -DQMOE=<path of the qmoe tool>")
endif()

execute_process(COMMAND ${QMOE} cache --layers 2 --steps 200 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "qmoe cache --layers 2 --steps 200 --json exited ${rc}:\n${err}")
endif()
string(JSON command ERROR_VARIABLE json_error GET "${json}" command)
if(json_error OR NOT command STREQUAL "cache")
  message(FATAL_ERROR "qmoe cache --json printed no JSON object of command cache "
                      "(${json_error}):\n${json}")
endif()
string(JSON layers GET "${json}" model layers)
string(JSON steps GET "${json}" trace steps)
if(NOT layers EQUAL 2 OR NOT steps EQUAL 200)
  message(FATAL_ERROR "qmoe cache --json reports ${layers} layers and ${steps} steps, not 2 and "
                      "200:\n${json}")
endif()
set(expected static-hindsight static-warmup lru lfu lfru)
string(JSON rows LENGTH "${json}" policies)
list(LENGTH expected expected_rows)
if(NOT rows EQUAL expected_rows)
  message(FATAL_ERROR "qmoe cache --json has ${rows} policy rows, not ${expected_rows}:\n${json}")
endif()
foreach(name IN LISTS expected)
  list(FIND expected ${name} i)
  string(JSON policy GET "${json}" policies ${i} policy)
  if(NOT policy STREQUAL name)
    message(FATAL_ERROR "qmoe cache --json's row ${i} is '${policy}', not '${name}'")
  endif()
  foreach(key hit_rate steady_hit_rate)
    string(JSON rate GET "${json}" policies ${i} ${key})
    if(NOT rate MATCHES "^[0-9.]+$" OR rate LESS 0 OR rate GREATER 1)
      message(FATAL_ERROR "qmoe cache --json: ${name}'s ${key} is ${rate}, not in [0, 1]")
    endif()
  endforeach()
endforeach()

execute_process(COMMAND ${QMOE} cache --layers 2 --steps 200 --routing drift --drift-period 50
                        --budget 2 RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT text MATCHES "admissions within the budget")
  message(FATAL_ERROR "qmoe cache --routing drift --budget 2 exited ${rc}:\n${text}${err}")
endif()

foreach(bad "--bogus" "--residency;0" "--residency;1.5" "--steps;9" "--routing;pareto"
            "--policy;fifo" "--drift-period;50" "--policy;lru;--half-life;8"
            "--policy;static;--budget;4" "--half-life;0" "--layers;2;--layers;3" "--format")
  execute_process(COMMAND ${QMOE} cache ${bad} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "qmoe cache ${bad} exited ${rc}, expected 2:\n${err}")
  endif()
endforeach()
execute_process(COMMAND ${QMOE} cache --steps 0 --help RESULT_VARIABLE rc OUTPUT_VARIABLE usage
                ERROR_QUIET)
if(NOT rc EQUAL 0 OR NOT usage MATCHES "usage: qmoe cache")
  message(FATAL_ERROR "qmoe cache --steps 0 --help exited ${rc}, expected 0 and the usage")
endif()
