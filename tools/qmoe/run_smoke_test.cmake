# Smoke test of `qmoe run`, for ctest:
#   add_test(NAME qmoe_run_smoke COMMAND ${CMAKE_COMMAND} -DQMOE=$<TARGET_FILE:qmoe_cli>
#            -P ${PROJECT_SOURCE_DIR}/tools/qmoe/run_smoke_test.cmake)
# Checks: a bad option or number, a repeated option, and options to `version` are refused;
# --help wins wherever it is; a report that cannot be written fails the run; one layer, two
# steps, batch 2, with FP32 and with BF16 activations, each on 1 and on 2 threads: every run
# exits 0 with a finite hidden state, the activation type it was asked for, 8 distinct experts
# per layer for each token at most and a read bandwidth measured over the weights; each type
# gives the same checksum on both thread counts (the MoE layer's result does not depend on
# them), and BF16 not FP32's (the hidden state is rounded at each layer). Every --format (one
# layer, two steps) runs, reports its format, block size, scale type, global scale, GEMM
# kernel and bytes per expert, counts bytes read as experts computed times those bytes, and
# gives a checksum of its own; a format name the tool does not have is refused with exit 2.
# --model: the default run names qwen3-30b-a3b; gpt-oss-20b runs its own shape, SwiGLU and
# format (MXFP4, unless --format names another) and counts its bytes; an unknown, repeated or
# missing model name is refused with exit 2.
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
# usage error (exit 2) at parse time, and so is a --format the tool does not have (names are
# lower case), or none; --help anywhere prints the usage and exits 0, whatever
# comes before it.
foreach(bad "run;--layers;1;--tokens;1;--layers;2" "run;--json;--json;--layers;1"
            "run;--model;gpt-oss;--layers;1" "run;--model;GPT-OSS-20B;--layers;1"
            "run;--layers;1;--model" "run;--model;gpt-oss-20b;--model;gpt-oss-20b;--layers;1"
            "run;--format;int5;--layers;1" "run;--format;INT4;--layers;1" "run;--layers;1;--format"
            "run;--format;int4;--format;int3;--layers;1"
            "info;--isa;scalar;--isa;avx2" "version;--json" "run;--threads;1025;--layers;1")
  execute_process(COMMAND ${QMOE} ${bad} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "qmoe ${bad} exited ${rc}, expected 2:\n${err}")
  endif()
endforeach()
# The hybrid decode's options: --residency needs --gpu and a fraction in [0, 1], --routing
# takes uniform, zipf or drift (drift and its period with --gpu), --gpu runs f32 activations
# only, --cache (with --gpu) takes a policy and --cache-budget needs it, --host-memory (with
# --gpu) takes pinned or pageable.
foreach(bad "run;--residency;0.5;--layers;1" "run;--gpu;--residency;1.5;--layers;1"
            "run;--gpu;--residency;-0.5;--layers;1" "run;--gpu;--residency;1e-1;--layers;1"
            "run;--routing;pareto;--layers;1" "run;--gpu;--activations;bf16;--layers;1"
            "run;--gpu;--gpu;--layers;1" "run;--routing;drift;--layers;1"
            "run;--gpu;--drift-period;5;--layers;1" "run;--cache;lru;--layers;1"
            "run;--gpu;--cache;mru;--layers;1" "run;--gpu;--cache-budget;2;--layers;1"
            "run;--host-memory;pinned;--layers;1" "run;--gpu;--host-memory;locked;--layers;1"
            "run;--gpu;--layers;1;--host-memory")
  execute_process(COMMAND ${QMOE} ${bad} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "qmoe ${bad} exited ${rc}, expected 2:\n${err}")
  endif()
endforeach()
# Zipf routing runs on the CPU and says so; --gpu without a usable GPU (or in a build without
# CUDA) fails with a message before any weights are generated.
execute_process(COMMAND ${QMOE} run --layers 1 --tokens 2 --routing zipf --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT json MATCHES "\"routing\": \"zipf\"")
  message(FATAL_ERROR "qmoe run --routing zipf exited ${rc} with '${json}':\n${err}")
endif()
execute_process(COMMAND ${QMOE} run --gpu --layers 1 --tokens 1 RESULT_VARIABLE rc
                OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(STATUS "qmoe run --gpu ran: a GPU is usable here")
elseif(NOT err MATCHES "qmoe run: " OR err MATCHES "generating weights")
  message(FATAL_ERROR "qmoe run --gpu exited ${rc} without a message, or after generating:\n${err}")
endif()
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
    string(JSON model GET "${json}" model name)
    string(JSON checksum GET "${json}" checksum)
    string(JSON weights_gbps GET "${json}" bandwidth weights_gbps)
    string(JSON weights_ratio GET "${json}" weights_bandwidth_ratio)
    if(NOT finite STREQUAL "ON" AND NOT finite STREQUAL "true")
      message(FATAL_ERROR "hidden state not finite with ${where}:\n${json}")
    endif()
    if(NOT activations STREQUAL type)
      message(FATAL_ERROR "activations reported as '${activations}' with ${where}:\n${json}")
    endif()
    if(NOT layers EQUAL 1 OR experts GREATER 8 OR experts LESS 4 OR NOT model STREQUAL
                                                                        "qwen3-30b-a3b")
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
# Runs one layer, two steps of `format` and checks its JSON against the expected block size,
# scale type, global scale (its JSON type: NULL for none) and bytes per expert, and its report
# for the weights line; sets `out_checksum`.
function(check_format format block scale global_type bytes_per_expert out_checksum)
  execute_process(
    COMMAND ${QMOE} run --format ${format} --layers 1 --tokens 2 --batch 2 --threads 2 --json
    RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE report)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "qmoe run --format ${format} exited ${rc}:\n${report}")
  endif()
  string(JSON finite GET "${json}" finite)
  string(JSON got_format GET "${json}" model format)
  string(JSON got_block GET "${json}" model block_size)
  string(JSON got_scale GET "${json}" model scale_dtype)
  string(JSON got_global_type TYPE "${json}" model global_scale)
  string(JSON got_bytes GET "${json}" model bytes_per_expert)
  string(JSON total GET "${json}" model weight_bytes_total)
  string(JSON kernel GET "${json}" gemm_kernel)
  string(JSON experts GET "${json}" experts_computed)
  string(JSON read GET "${json}" weight_bytes_read)
  string(JSON checksum GET "${json}" checksum)
  if(NOT finite STREQUAL "ON" AND NOT finite STREQUAL "true")
    message(FATAL_ERROR "hidden state not finite with --format ${format}:\n${json}")
  endif()
  if(NOT got_format STREQUAL format OR NOT got_block EQUAL block OR NOT got_scale STREQUAL scale
     OR NOT got_global_type STREQUAL global_type)
    message(FATAL_ERROR "--format ${format}: reported format '${got_format}', block "
                        "${got_block}, scales '${got_scale}', global scale ${got_global_type}; "
                        "expected ${format}, ${block}, ${scale}, ${global_type}")
  endif()
  if(NOT kernel MATCHES "^qmoe_gemm_${format}_fast_")
    message(FATAL_ERROR "--format ${format} ran the GEMM kernel '${kernel}'")
  endif()
  if(NOT got_bytes EQUAL bytes_per_expert)
    message(FATAL_ERROR "--format ${format}: ${got_bytes} bytes per expert, expected "
                        "${bytes_per_expert}")
  endif()
  # The memory check and the bandwidth figure count the format's bytes: the layer is 128
  # experts of them, and the bytes read are the experts computed times one expert's.
  math(EXPR want_total "128 * ${bytes_per_expert}")
  math(EXPR want_read "${experts} * ${bytes_per_expert}")
  if(NOT total EQUAL want_total OR NOT read EQUAL want_read OR experts LESS 1)
    message(FATAL_ERROR "--format ${format}: weight_bytes_total ${total} (expected "
                        "${want_total}), weight_bytes_read ${read} for ${experts} experts "
                        "(expected ${want_read})")
  endif()
  string(TOUPPER "${format}" title)
  if(NOT report MATCHES "weights +${title} block ${block}, ")
    message(FATAL_ERROR "--format ${format}: the report does not name the weights:\n${report}")
  endif()
  set(${out_checksum} "${checksum}" PARENT_SCOPE)
endfunction()

# Bytes per expert, FC1 [1536, 2048] and FC2 [2048, 768] (docs/formats.md): 4718592 weights,
# at 4 bits 2359296 bytes of codes (INT3, 3 bits: 1769472), and one scale per block, 147456 of
# them at block 32 (294912 at block 16), 2 bytes in FP16, 1 in E8M0 and E4M3.
check_format(int4 32 f16 NULL 2654208 int4_checksum)      # 2359296 + 2 * 147456
check_format(int3 32 f16 NULL 2064384 int3_checksum)      # 1769472 + 2 * 147456
check_format(mxfp4 32 e8m0 NULL 2506752 mxfp4_checksum)   # 2359296 + 147456
check_format(nvfp4 16 e4m3 NUMBER 2654208 nvfp4_checksum) # 2359296 + 294912
# --format int4 is the default: the same weights, so the checksum of the FP32 runs above
# (same seed, layers, steps and batch). Each other format's weights, and checksum, differ.
if(NOT int4_checksum STREQUAL f32_checksum)
  message(FATAL_ERROR "--format int4 gave ${int4_checksum}, the default ${f32_checksum}")
endif()
set(seen "${int4_checksum}")
foreach(format int3 mxfp4 nvfp4)
  list(FIND seen "${${format}_checksum}" index)  # IN_LIST needs a policy -P scripts lack
  if(NOT index EQUAL -1)
    message(FATAL_ERROR "--format ${format} gave a checksum another format gave: "
                        "${${format}_checksum}")
  endif()
  list(APPEND seen "${${format}_checksum}")
endforeach()
# gpt-oss-20b: 32 experts, top-4, H = I = 2880, SwiGLU clamped at 7, MXFP4 by default. An
# expert is FC1 [5760, 2880] and FC2 [2880, 2880]: 24883200 weights, 12441600 bytes of codes
# and one E8M0 byte per 32 (777600).
foreach(format "" int4)
  set(format_args)
  set(want_format mxfp4)
  set(want_bytes 13219200)  # 12441600 + 777600
  if(format)
    set(format_args --format ${format})
    set(want_format ${format})
    set(want_bytes 13996800)  # 12441600 + 2 * 777600 (FP16 scales)
  endif()
  execute_process(
    COMMAND ${QMOE} run --model gpt-oss-20b ${format_args} --layers 1 --tokens 2 --batch 2
            --threads 2 --json
    RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE report)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "qmoe run --model gpt-oss-20b ${format_args} exited ${rc}:\n${report}")
  endif()
  foreach(field name experts top_k hidden intermediate swiglu_limit format bytes_per_expert
                weight_bytes_total)
    string(JSON got_${field} GET "${json}" model ${field})
  endforeach()
  string(JSON finite GET "${json}" finite)
  string(JSON per_token GET "${json}" experts_per_token)
  string(JSON experts GET "${json}" experts_computed)
  string(JSON read GET "${json}" weight_bytes_read)
  math(EXPR want_total "32 * ${want_bytes}")
  math(EXPR want_read "${experts} * ${want_bytes}")
  if(NOT got_name STREQUAL "gpt-oss-20b" OR NOT got_experts EQUAL 32 OR NOT got_top_k EQUAL 4
     OR NOT got_hidden EQUAL 2880 OR NOT got_intermediate EQUAL 2880
     OR NOT got_swiglu_limit EQUAL 7 OR NOT got_format STREQUAL want_format
     OR NOT got_bytes_per_expert EQUAL want_bytes OR NOT got_weight_bytes_total EQUAL want_total
     OR NOT read EQUAL want_read OR per_token GREATER 4 OR per_token LESS 1
     OR (NOT finite STREQUAL "ON" AND NOT finite STREQUAL "true"))
    message(FATAL_ERROR "qmoe run --model gpt-oss-20b ${format_args}: unexpected JSON:\n${json}")
  endif()
  if(NOT report MATCHES "synthetic gpt-oss-20b-shaped MoE decode")
    message(FATAL_ERROR "qmoe run --model gpt-oss-20b: the report does not name it:\n${report}")
  endif()
endforeach()
# An expert store: the weights written by --write-store and read back by --store decode to the
# same checksum; a store that does not fit the options, or is missing, is refused.
set(store_file "${CMAKE_CURRENT_BINARY_DIR}/qmoe_run_smoke_store.qmoe")
file(REMOVE "${store_file}")
set(store_checksums)
foreach(mode "--write-store" "--store")
  execute_process(COMMAND ${QMOE} run --layers 1 --tokens 2 --threads 2 ${mode} ${store_file} --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE report)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "qmoe run ${mode} exited ${rc}:\n${report}")
  endif()
  string(JSON checksum GET "${json}" checksum)
  list(APPEND store_checksums ${checksum})
endforeach()
# --map: the same layer over the mapped file, the same checksum.
execute_process(COMMAND ${QMOE} run --tokens 2 --threads 2 --store ${store_file} --map --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE report)
if(NOT rc EQUAL 0 OR NOT report MATCHES "weights mapped")
  message(FATAL_ERROR "qmoe run --store --map exited ${rc}:\n${report}")
endif()
string(JSON checksum GET "${json}" checksum)
list(APPEND store_checksums ${checksum})
list(GET store_checksums 2 mapped_checksum)
list(GET store_checksums 0 written_checksum)
list(GET store_checksums 1 read_checksum)
if(NOT written_checksum STREQUAL read_checksum OR NOT written_checksum STREQUAL mapped_checksum)
  message(FATAL_ERROR "qmoe run --store decoded ${read_checksum}, --map ${mapped_checksum}, "
                      "--write-store ${written_checksum}:\n${report}")
endif()
foreach(bad "--store;${store_file};--layers;2" "--store;${store_file};--model;gpt-oss-20b"
            "--store;${store_file};--format;int3" "--store;${store_file};--write-store;x.qmoe"
            "--store" "--map" "--store;${store_file};--map;--gpu")
  execute_process(COMMAND ${QMOE} run ${bad} --tokens 1 RESULT_VARIABLE rc OUTPUT_QUIET
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "qmoe run ${bad} exited ${rc}, expected 2:\n${err}")
  endif()
endforeach()
# qmoe store describes the file and, with --verify, checks every record.
execute_process(COMMAND ${QMOE} store ${store_file} --verify --json RESULT_VARIABLE rc
                OUTPUT_VARIABLE json ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "qmoe store --verify exited ${rc}:\n${err}")
endif()
string(JSON verified GET "${json}" verified)
string(JSON store_layers GET "${json}" layers)
string(JSON store_experts GET "${json}" experts)
if(NOT verified STREQUAL "ON" AND NOT verified STREQUAL "true" OR NOT store_layers EQUAL 1
   OR NOT store_experts EQUAL 128)
  message(FATAL_ERROR "qmoe store --verify: unexpected JSON:\n${json}")
endif()
foreach(bad "store" "store;${store_file};--bogus" "store;${store_file};${store_file}")
  execute_process(COMMAND ${QMOE} ${bad} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "qmoe ${bad} exited ${rc}, expected 2:\n${err}")
  endif()
endforeach()
file(REMOVE "${store_file}")
execute_process(COMMAND ${QMOE} store ${store_file} RESULT_VARIABLE rc OUTPUT_QUIET
                ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "cannot open")
  message(FATAL_ERROR "qmoe store of a missing file exited ${rc}:\n${err}")
endif()
execute_process(COMMAND ${QMOE} run --store ${store_file} --tokens 1 RESULT_VARIABLE rc
                OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "cannot open")
  message(FATAL_ERROR "qmoe run --store of a missing file exited ${rc}:\n${err}")
endif()

message(STATUS "qmoe run smoke test passed (checksum ${f32_checksum}, bf16 ${bf16_checksum}, "
               "formats ${seen})")
