# Smoke test of `qmoe cache`, for ctest:
#   add_test(NAME tool.cache_smoke COMMAND ${CMAKE_COMMAND} -DQMOE=$<TARGET_FILE:qmoe_cli>
#            -P ${PROJECT_SOURCE_DIR}/tools/qmoe/cache_smoke_test.cmake)
# Checks: two layers, 200 steps, every policy: exit 0 (the tool's conservation checks held) and
# a JSON object with the options and one row per policy, in order, each hit rate in [0, 1];
# drifting routing under a promotion budget (the tool checks every layer's admissions against
# it) exits 0; bad options, and options that would change nothing, exit 2. Recorded routing: a
# drawn trace written with --write-trace and replayed with --trace gives the writing run's
# policy rows, every field but the timings; --steps replays the first steps, and more steps
# than the file has exit 2; a model of another expert count is named on stderr; a truncated
# copy, a wrong magic and an id out of range each exit 1 naming the problem (dd makes the
# copies: CMake cannot write a NUL byte); the draw's options with --trace exit 2.
if(NOT QMOE)
  message(FATAL_ERROR "pass -DQMOE=<path of the qmoe tool>")
endif()
find_program(DD dd REQUIRED)

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

# Recorded routing. Two tokens a step, drifting, under a budget: every row has promotions and
# evictions to compare.
set(traces ${CMAKE_CURRENT_BINARY_DIR}/cache_smoke_traces)
file(REMOVE_RECURSE ${traces})
file(MAKE_DIRECTORY ${traces})
set(trace ${traces}/drift.qmrt)
set(shared --residency 0.25 --budget 3 --json)
execute_process(COMMAND ${QMOE} cache --layers 2 --steps 200 --tokens 2 --routing drift
                        --drift-period 50 --write-trace ${trace} ${shared}
                RESULT_VARIABLE rc OUTPUT_VARIABLE written ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS ${trace})
  message(FATAL_ERROR "qmoe cache --write-trace exited ${rc} (file: ${trace}):\n${err}")
endif()
file(SIZE ${trace} trace_bytes)
if(NOT trace_bytes EQUAL 25632)  # 32 + 200 steps x 2 layers x 2 tokens x top-8 x 4 bytes
  message(FATAL_ERROR "qmoe cache --write-trace wrote ${trace_bytes} bytes, not 25632")
endif()
string(JSON written_to GET "${written}" trace written_to)
if(NOT written_to STREQUAL trace)
  message(FATAL_ERROR "qmoe cache --write-trace's JSON names '${written_to}', not ${trace}")
endif()
execute_process(COMMAND ${QMOE} cache --trace ${trace} ${shared}
                RESULT_VARIABLE rc OUTPUT_VARIABLE replayed ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "qmoe cache --trace ${trace} exited ${rc}:\n${err}")
endif()
foreach(key routing file steps tokens_per_step)
  string(JSON value GET "${replayed}" trace ${key})
  list(APPEND replayed_trace ${value})
endforeach()
if(NOT replayed_trace STREQUAL "file;${trace};200;2")
  message(FATAL_ERROR "qmoe cache --trace's JSON trace is ${replayed_trace}, not "
                      "file;${trace};200;2:\n${replayed}")
endif()
# Every field of every row, the timings aside, as the writing run reported it.
string(JSON rows LENGTH "${written}" policies)
string(JSON replayed_rows LENGTH "${replayed}" policies)
if(NOT replayed_rows EQUAL rows)
  message(FATAL_ERROR "the replay has ${replayed_rows} policy rows, the writing run ${rows}")
endif()
math(EXPR last_row "${rows} - 1")
foreach(i RANGE ${last_row})
  string(JSON fields LENGTH "${written}" policies ${i})
  string(JSON replayed_fields LENGTH "${replayed}" policies ${i})
  if(NOT replayed_fields EQUAL fields)
    message(FATAL_ERROR "the replay's row ${i} has ${replayed_fields} fields, not ${fields}")
  endif()
  math(EXPR last_field "${fields} - 1")
  foreach(f RANGE ${last_field})
    string(JSON key MEMBER "${written}" policies ${i} ${f})
    if(key STREQUAL "end_step_median_us")
      continue()
    endif()
    string(JSON expected GET "${written}" policies ${i} ${key})
    string(JSON got ERROR_VARIABLE missing GET "${replayed}" policies ${i} ${key})
    if(missing OR NOT got STREQUAL expected)
      message(FATAL_ERROR "row ${i}'s ${key}: replayed '${got}', written '${expected}'\n"
                          "written:\n${written}\nreplayed:\n${replayed}")
    endif()
  endforeach()
endforeach()

execute_process(COMMAND ${QMOE} cache --trace ${trace} --steps 100 --model gpt-oss-20b --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE err)
string(JSON steps ERROR_VARIABLE json_error GET "${json}" trace steps)
string(JSON experts ERROR_VARIABLE json_error GET "${json}" model experts)
if(NOT rc EQUAL 0 OR NOT steps EQUAL 100 OR NOT experts EQUAL 128
   OR NOT err MATCHES "have 128 experts, --model gpt-oss-20b's 32")
  message(FATAL_ERROR "qmoe cache --trace --steps 100 --model gpt-oss-20b exited ${rc} "
                      "(${steps} steps of ${experts} experts):\n${err}")
endif()
execute_process(COMMAND ${QMOE} cache --trace ${trace} --steps 201
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "has only 200 steps")
  message(FATAL_ERROR "qmoe cache --trace --steps 201 exited ${rc}, expected 2:\n${err}")
endif()

# Damaged copies: the last id dropped; "QMRX" for "QMRT"; step 0's sixth id (byte 52) made
# "9999", 0x39393939 as a little-endian int32.
set(truncated ${traces}/truncated.qmrt)
math(EXPR words "${trace_bytes} / 4 - 1")
execute_process(COMMAND ${DD} if=${trace} of=${truncated} bs=4 count=${words}
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
set(magic ${traces}/magic.qmrt)
file(WRITE ${traces}/magic.patch "QMRX")
file(COPY_FILE ${trace} ${magic})
execute_process(COMMAND ${DD} if=${traces}/magic.patch of=${magic} bs=1 seek=0 conv=notrunc
                RESULT_VARIABLE magic_rc OUTPUT_QUIET ERROR_QUIET)
set(id ${traces}/id.qmrt)
file(WRITE ${traces}/id.patch "9999")
file(COPY_FILE ${trace} ${id})
execute_process(COMMAND ${DD} if=${traces}/id.patch of=${id} bs=1 seek=52 conv=notrunc
                RESULT_VARIABLE id_rc OUTPUT_QUIET ERROR_QUIET)
if(NOT rc EQUAL 0 OR NOT magic_rc EQUAL 0 OR NOT id_rc EQUAL 0)
  message(FATAL_ERROR "dd could not make the damaged copies (${rc}, ${magic_rc}, ${id_rc})")
endif()
# The messages, as regular expressions ('.' for the brackets).
set(damage_truncated "file size is 25628 bytes, not the 25632 its header implies")
set(damage_magic "magic is 51 4D 52 58, not 51 4D 52 54")
set(damage_id "expert id 960051513 at step 0, layer 0, token 0, slot 5 .byte 52. is outside .-1, 128.")
foreach(damage truncated magic id)
  execute_process(COMMAND ${QMOE} cache --trace ${${damage}} RESULT_VARIABLE rc OUTPUT_QUIET
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "${${damage}}: ${damage_${damage}}")
    message(FATAL_ERROR "qmoe cache --trace ${${damage}} exited ${rc}, expected 1 and "
                        "'${damage_${damage}}':\n${err}")
  endif()
endforeach()

# The draw's options describe no file, and a read trace is not written again.
foreach(draw "--routing;zipf" "--drift-period;50" "--tokens;2" "--layers;2" "--seed;3"
             "--write-trace;${traces}/again.qmrt")
  execute_process(COMMAND ${QMOE} cache --trace ${trace} ${draw} RESULT_VARIABLE rc OUTPUT_QUIET
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "with --trace the file is the routing")
    message(FATAL_ERROR "qmoe cache --trace ${draw} exited ${rc}, expected 2:\n${err}")
  endif()
endforeach()
file(REMOVE_RECURSE ${traces})
