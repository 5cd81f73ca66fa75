# Included by the ctest -P scripts that check machine code (check_int4_prefetch.cmake,
# check_function_emits.cmake): one objdump reading shared by both.
find_program(OBJDUMP_EXECUTABLE objdump REQUIRED)

# Sets `out_var` to the disassembly of `object`, one list item per function: objdump starts each
# with "<address> <symbol>:".
function(disassembled_functions object out_var)
  execute_process(COMMAND ${OBJDUMP_EXECUTABLE} -d --no-show-raw-insn ${object}
                  OUTPUT_VARIABLE text RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "objdump failed on ${object}")
  endif()
  string(REGEX REPLACE "\n([0-9a-f]+ <[^>\n]+>:)" ";\\1" functions "${text}")
  set(${out_var} "${functions}" PARENT_SCOPE)
endfunction()
