# ctest -P script: the function whose symbol contains FUNCTION, in one of OBJECTS, holds the
# instruction INSTRUCTION. For code whose only effect is on the memory system (a software
# prefetch): no result-checking test can see it disappear, and GCC once deleted such a
# prefetch without a warning (lib/cpu/common/int4_prefetch.h says how).
# Usage: cmake -DOBJECTS="a.o|b.o" -DFUNCTION=run_gemm_rows -DINSTRUCTION=prefetcht1 -P ...
cmake_policy(SET CMP0007 NEW)
string(REPLACE "|" ";" OBJECTS "${OBJECTS}")
list(REMOVE_ITEM OBJECTS "")
include(${CMAKE_CURRENT_LIST_DIR}/disassembled_functions.cmake)
set(found_function FALSE)
foreach(object IN LISTS OBJECTS)
  disassembled_functions(${object} functions)
  foreach(function IN LISTS functions)
    string(REGEX MATCH "<[^>\n]+>:" name "${function}")
    if(name MATCHES "${FUNCTION}")
      set(found_function TRUE)
      if(function MATCHES "\t${INSTRUCTION} ")
        message(STATUS "${object}: ${name} holds ${INSTRUCTION}")
        return()
      endif()
    endif()
  endforeach()
endforeach()
if(NOT found_function)
  message(FATAL_ERROR "no function matching '${FUNCTION}' in: ${OBJECTS}")
endif()
message(FATAL_ERROR "no '${INSTRUCTION}' in any function matching '${FUNCTION}'")
