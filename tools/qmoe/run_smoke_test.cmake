# Smoke test of `qmoe run`, for ctest:
#   add_test(NAME qmoe_run_smoke COMMAND ${CMAKE_COMMAND} -DQMOE=$<TARGET_FILE:qmoe_cli>
#            -P ${PROJECT_SOURCE_DIR}/tools/qmoe/run_smoke_test.cmake)
# Checks: a bad option or number, a repeated option, and options to `version` are refused;
# --help wins wherever it is; a report that cannot be written fails the run; one layer, two
# steps, batch 2, with FP32 and with BF16 activations, each on 1 and on 2 threads: every run
# exits 0 with a finite hidden state, the activation type it was asked for, 8 distinct experts
# per layer for each token at most and a read bandwidth measured over the weights; each type
# gives the same checksum on both thread counts (the MoE layer's result does not depend on
# them), and BF16 not FP32's (the hidden state is rounded at each layer).
if(NOT QMOE)
  message(FATAL_ERROR "pass -DQMOE=<path of the qmoe tool>")
endif()

execute_process(COMMAND ${QMOE} run --bogus RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "qmoe run --bogus exited ${rc}, expected 2")
endif()
# Numbers are decimal digits only (strtoull's base 0 once read 0x10 as 16 and " -1" as 2^64-1),
# and a thread count past the library's cap is refused with a message, not a hang.
foreach(bad "--seed;0x10" "--seed; -1" "--tokens;+3" "--layers;1e2" "--threads;100000")
  execute_process(COMMAND ${QMOE} run ${bad} --layers 1 --tokens 1 RESULT_VARIABLE rc
                  OUTPUT_QUIET ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "qmoe run ${bad} exited 0, expected a refusal")
  endif()
endforeach()

# An option given twice is refused, not the last one silently winning; `version` takes no
# options (it once dropped --json and printed text); --threads past the library's cap is a
# usage error (exit 2) at parse time; --help anywhere prints the usage and exits 0, whatever
# comes before it.
foreach(bad "run;--layers;1;--tokens;1;--layers;2" "run;--json;--json;--layers;1"
            "info;--isa;scalar;--isa;avx2" "version;--json" "run;--threads;1025;--layers;1")
  execute_process(COMMAND ${QMOE} ${bad} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "qmoe ${bad} exited ${rc}, expected 2:\n${err}")
  endif()
endforeach()
execute_process(COMMAND ${QMOE} run --layers 0 --help RESULT_VARIABLE rc OUTPUT_VARIABLE usage
                ERROR_QUIET)
if(NOT rc EQUAL 0 OR NOT usage MATCHES "usage: qmoe run")
  message(FATAL_ERROR "qmoe run --layers 0 --help exited ${rc}, expected 0 and the usage")
endif()
# Every command's --help (or -h) prints its usage on stdout and exits 0 (`info --help` and
# `version --help` were usage errors, exit 2).
foreach(help "info;--help" "info;--isa;avx2;-h" "version;--help" "run;-h")
  execute_process(COMMAND ${QMOE} ${help} RESULT_VARIABLE rc OUTPUT_VARIABLE usage ERROR_QUIET)
  if(NOT rc EQUAL 0 OR NOT usage MATCHES "usage: qmoe")
    message(FATAL_ERROR "qmoe ${help} exited ${rc} with '${usage}', expected 0 and the usage")
  endif()
endforeach()
# A report that cannot be written is a failure (it once exited 0 with the JSON lost).
if(EXISTS /dev/full)
  execute_process(COMMAND ${QMOE} version OUTPUT_FILE /dev/full RESULT_VARIABLE rc ERROR_QUIET)
  if(rc EQUAL 0)
    message(FATAL_ERROR "qmoe version > /dev/full exited 0, expected a write failure")
  endif()
endif()

# Runs the small decode with --activations `type` on 1 and 2 threads, checks each run, and sets
# `out_checksum` to the checksum both gave.
function(check_decode type out_checksum)
  set(checksums)
  foreach(threads 1 2)
    set(where "--activations ${type} --threads ${threads}")
    execute_process(
      COMMAND ${QMOE} run --layers 1 --tokens 2 --batch 2 --threads ${threads} --activations
              ${type} --json
      RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE report)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "qmoe run ${where} exited ${rc}:\n${report}")
    endif()
    string(JSON finite GET "${json}" finite)
    string(JSON activations GET "${json}" activations)
    string(JSON experts GET "${json}" experts_per_token)
    string(JSON layers GET "${json}" model layers)
    string(JSON checksum GET "${json}" checksum)
    string(JSON weights_gbps GET "${json}" bandwidth weights_gbps)
    string(JSON weights_ratio GET "${json}" weights_bandwidth_ratio)
    if(NOT finite STREQUAL "ON" AND NOT finite STREQUAL "true")
      message(FATAL_ERROR "hidden state not finite with ${where}:\n${json}")
    endif()
    if(NOT activations STREQUAL type)
      message(FATAL_ERROR "activations reported as '${activations}' with ${where}:\n${json}")
    endif()
    if(NOT layers EQUAL 1 OR experts GREATER 8 OR experts LESS 4)
      message(FATAL_ERROR "unexpected model/experts with ${where}:\n${json}")
    endif()
    # The read of the weights' own pages (qmoe_measure_read_bandwidth_over) ran and was used.
    if(NOT weights_gbps GREATER 0 OR NOT weights_ratio GREATER 0)
      message(FATAL_ERROR "no read bandwidth over the weights with ${where}:\n${json}")
    endif()
    # The best step's ratio is at least the mean one (sum b / sum t <= max b_s / t_s); it once
    # divided the mean bytes by the fastest whole step and came out below it.
    string(JSON ratio GET "${json}" bandwidth_ratio)
    string(JSON ratio_best GET "${json}" bandwidth_ratio_best_step)
    if(NOT ratio MATCHES "^[0-9]+\\.[0-9]+$" OR NOT ratio_best MATCHES "^[0-9]+\\.[0-9]+$"
       OR NOT ratio GREATER 0)
      message(FATAL_ERROR "ratios '${ratio}', '${ratio_best}' are not positive numbers")
    endif()
    if(ratio_best LESS ratio)
      message(FATAL_ERROR "ratio over the best step ${ratio_best} < ratio ${ratio} with ${where}")
    endif()
    list(APPEND checksums "${checksum}")
  endforeach()
  list(GET checksums 0 one)
  list(GET checksums 1 two)
  if(NOT one STREQUAL two)
    message(FATAL_ERROR "--activations ${type}: checksum differs: 1 thread ${one}, 2 threads ${two}")
  endif()
  set(${out_checksum} "${one}" PARENT_SCOPE)
endfunction()

check_decode(f32 f32_checksum)
check_decode(bf16 bf16_checksum)
if(bf16_checksum STREQUAL f32_checksum)
  message(FATAL_ERROR "the bf16 run gave the FP32 run's checksum ${f32_checksum}")
endif()
message(STATUS "qmoe run smoke test passed (checksum ${f32_checksum}, bf16 ${bf16_checksum})")
