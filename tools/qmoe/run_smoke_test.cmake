# Smoke test of `qmoe run`, for ctest:
#   add_test(NAME qmoe_run_smoke COMMAND ${CMAKE_COMMAND} -DQMOE=$<TARGET_FILE:qmoe_cli>
#            -P ${PROJECT_SOURCE_DIR}/tools/qmoe/run_smoke_test.cmake)
# Checks: a bad option exits 2; one layer, two steps, batch 2 on 1 and on 2 threads both exit
# 0 with a finite hidden state, 8 distinct experts per layer for each token at most, a read
# bandwidth measured over the weights, and the same checksum (the MoE layer's result does not
# depend on the thread count); the same with BF16 activations.
if(NOT QMOE)
  message(FATAL_ERROR "pass -DQMOE=<path of the qmoe tool>")
endif()

execute_process(COMMAND ${QMOE} run --bogus RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "qmoe run --bogus exited ${rc}, expected 2")
endif()

set(checksums)
foreach(threads 1 2)
  execute_process(
    COMMAND ${QMOE} run --layers 1 --tokens 2 --batch 2 --threads ${threads} --json
    RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE report)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "qmoe run --threads ${threads} exited ${rc}:\n${report}")
  endif()
  string(JSON finite GET "${json}" finite)
  string(JSON experts GET "${json}" experts_per_token)
  string(JSON layers GET "${json}" model layers)
  string(JSON checksum GET "${json}" checksum)
  string(JSON weights_gbps GET "${json}" bandwidth weights_gbps)
  string(JSON weights_ratio GET "${json}" weights_bandwidth_ratio)
  if(NOT finite STREQUAL "ON" AND NOT finite STREQUAL "true")
    message(FATAL_ERROR "hidden state not finite on ${threads} threads:\n${json}")
  endif()
  if(NOT layers EQUAL 1 OR experts GREATER 8 OR experts LESS 4)
    message(FATAL_ERROR "unexpected model/experts on ${threads} threads:\n${json}")
  endif()
  # The read of the weights' own pages (qmoe_measure_read_bandwidth_over) ran and was used.
  if(NOT weights_gbps GREATER 0 OR NOT weights_ratio GREATER 0)
    message(FATAL_ERROR "no read bandwidth over the weights on ${threads} threads:\n${json}")
  endif()
  list(APPEND checksums "${checksum}")
endforeach()
list(GET checksums 0 one)
list(GET checksums 1 two)
if(NOT one STREQUAL two)
  message(FATAL_ERROR "checksum differs: 1 thread ${one}, 2 threads ${two}")
endif()

# 16-bit activations (qmoe_moe_forward_typed): exit 0, finite, reported as such, the same
# checksum on 1 and 2 threads, and not the FP32 run's (the hidden state is rounded each layer).
set(bf16_checksums)
foreach(threads 1 2)
  execute_process(
    COMMAND ${QMOE} run --layers 1 --tokens 2 --batch 2 --threads ${threads} --activations bf16
            --json
    RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE report)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "qmoe run --activations bf16 --threads ${threads} exited ${rc}:\n${report}")
  endif()
  string(JSON finite GET "${json}" finite)
  string(JSON activations GET "${json}" activations)
  string(JSON checksum GET "${json}" checksum)
  if(NOT finite STREQUAL "ON" AND NOT finite STREQUAL "true")
    message(FATAL_ERROR "bf16 hidden state not finite on ${threads} threads:\n${json}")
  endif()
  if(NOT activations STREQUAL "bf16")
    message(FATAL_ERROR "activations reported as '${activations}', expected bf16:\n${json}")
  endif()
  list(APPEND bf16_checksums "${checksum}")
endforeach()
list(GET bf16_checksums 0 bf16_one)
list(GET bf16_checksums 1 bf16_two)
if(NOT bf16_one STREQUAL bf16_two)
  message(FATAL_ERROR "bf16 checksum differs: 1 thread ${bf16_one}, 2 threads ${bf16_two}")
endif()
if(bf16_one STREQUAL one)
  message(FATAL_ERROR "the bf16 run gave the FP32 run's checksum ${one}")
endif()
message(STATUS "qmoe run smoke test passed (checksum ${one}, bf16 ${bf16_one})")
