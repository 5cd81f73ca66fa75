# ctest -P script: ptxas compiles the wgmma GEMM kernels' PTX (lib/cuda/int4_gemm_wgmma.cu, for
# sm_90a) without injecting a warpgroup wait of its own (its info C7517, "warpgroup.wait is
# injected ... to allow use of registers defined by GMMA"). Such a wait stalls on every wgmma
# group in flight where the kernel meant only the older ones to be done, which serialises the
# MMAs with the folds meant to overlap them: the results stay right, so no other test sees it.
# Usage: cmake -DPTXAS=/path/to/ptxas -DPTX="a.ptx|b.ptx" -P check_wgmma_ptxas.cmake
cmake_minimum_required(VERSION 3.25)
string(REPLACE "|" ";" PTX "${PTX}")
list(REMOVE_ITEM PTX "")
if(NOT PTX)
  message(FATAL_ERROR "no PTX given")
endif()
set(found 0)
foreach(file IN LISTS PTX)
  execute_process(COMMAND "${PTXAS}" -arch=sm_90a "${file}" -o /dev/null
                  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "ptxas failed on ${file}:\n${out}${err}")
  endif()
  string(FIND "${file}" "int4_gemm_wgmma" is_wgmma)
  if(is_wgmma GREATER_EQUAL 0)
    math(EXPR found "${found} + 1")
  endif()
  if("${out}${err}" MATCHES "C7517")
    message(FATAL_ERROR "ptxas injected a warpgroup wait in ${file}:\n${out}${err}")
  endif()
endforeach()
if(found EQUAL 0)
  message(FATAL_ERROR "the wgmma kernels' PTX is not among: ${PTX}")
endif()
message(STATUS "ptxas compiled ${found} wgmma PTX file(s) with no injected warpgroup wait")
