# ctest -P script: the offload kernels' PTX (lib/cuda/offload_kernels.cu and moe_layer.cu, for
# sm_90) holds the memory operations the doorbell protocol's ordering argument rests on
# (lib/offload/kernels.h), in that order. No result-checking test on a machine without a GPU
# can see them, and on a GPU a missing fence or a plain store in place of a release fails only
# now and then. Usage: cmake -DPTX="a.ptx|b.ptx" -P check_offload_ptx.cmake
cmake_minimum_required(VERSION 3.25)
string(REPLACE "|" ";" PTX "${PTX}")
list(REMOVE_ITEM PTX "")
set(text "")
foreach(file IN LISTS PTX)
  file(READ "${file}" part)
  string(APPEND text "${part}")
endforeach()

# The body of the .entry whose name contains `name` (up to the next .entry or the end).
function(entry_body name out)
  set(rest "${text}")
  while(TRUE)
    string(FIND "${rest}" ".entry" at)
    if(at LESS 0)
      break()
    endif()
    string(SUBSTRING "${rest}" ${at} -1 rest)
    string(SUBSTRING "${rest}" 6 -1 after)
    string(FIND "${after}" ".entry" next)
    if(next GREATER_EQUAL 0)
      math(EXPR length "${next} + 6")
      string(SUBSTRING "${rest}" 0 ${length} body)
    else()
      set(body "${rest}")
    endif()
    string(REGEX MATCH "^[^(]*" header "${body}")
    if(header MATCHES "${name}")
      set(${out} "${body}" PARENT_SCOPE)
      return()
    endif()
    set(rest "${after}")
  endwhile()
  message(FATAL_ERROR "no kernel matching '${name}' in: ${PTX}")
endfunction()

# Position of the first `pattern` (a plain string) in `body`, or a failure naming `why`.
function(first_at body pattern why out)
  string(FIND "${body}" "${pattern}" at)
  if(at LESS 0)
    message(FATAL_ERROR "${why}: no '${pattern}'")
  endif()
  set(${out} ${at} PARENT_SCOPE)
endfunction()

# Publish, in the kernel whose name contains `name`: every thread's system fence, the barrier,
# then thread 0's release of req_seq.
function(check_publish name)
  entry_body("${name}" classify)
  first_at("${classify}" "membar.sys" "${name}: the payload's system fence" fence)
  first_at("${classify}" "st.release.sys.b64" "${name}: the doorbell's release" release)
  string(SUBSTRING "${classify}" ${fence} -1 from_fence)
  first_at("${from_fence}" "bar.sync" "${name}: the barrier after the fence" barrier)
  math(EXPR barrier "${fence} + ${barrier}")
  if(NOT fence LESS release OR NOT barrier LESS release)
    message(FATAL_ERROR "${name}: the release of req_seq (at ${release}) must follow the "
                        "system fence (${fence}) and the barrier after it (${barrier})")
  endif()
  first_at("${classify}" "bar.red.popc" "${name}: the cold count (__syncthreads_count)" c)
  first_at("${classify}" "ld.relaxed.gpu" "${name}: the sticky error read" e)
  message(STATUS "${name}: fence ${fence} < barrier ${barrier} < release ${release}")
endfunction()

# Wait, in the kernel whose name contains `name`: the acquire of done_seq before the uncached
# reads of the answer.
function(check_wait name)
  entry_body("${name}" wait)
  first_at("${wait}" "ld.acquire.sys.b64" "${name}: the acquire of done_seq" acquire)
  first_at("${wait}" "%globaltimer" "${name}: the deadline's clock" clock)
  first_at("${wait}" "ld.global.cv" "${name}: the uncached reads of the answer" cv)
  first_at("${wait}" "atom.global.or" "${name}: the sticky error" sticky)
  if(NOT acquire LESS cv)
    message(FATAL_ERROR "${name}: the answer is read (at ${cv}) before done_seq is acquired "
                        "(${acquire})")
  endif()
  message(STATUS "${name}: acquire ${acquire} < uncached read ${cv}")
endfunction()

# The wait kernel launches with programmatic dependent launch after the layer's FC2: it may start
# before FC2 (and through it FC1's classify) has completed, so its griddepcontrol.wait must come
# before its first read of global memory (the call record, done_seq, y); and it must let the
# next kernel launch early (griddepcontrol.launch_dependents present; where is free).
function(check_waits_for_preceding_grid name)
  entry_body("${name}" wait)
  first_at("${wait}" "griddepcontrol.wait" "${name}: the wait for the preceding grid" gridwait)
  first_at("${wait}" "griddepcontrol.launch_dependents" "${name}: the early launch of the next"
           launch)
  string(REGEX MATCH "ld\\.(global|acquire|relaxed|volatile)[^\n]*" first_load "${wait}")
  first_at("${wait}" "${first_load}" "${name}: a global load" load)
  if(NOT gridwait LESS load)
    message(FATAL_ERROR "${name}: global memory is read (at ${load}: ${first_load}) before the "
                        "wait for the preceding grid (${gridwait})")
  endif()
  message(STATUS "${name}: griddepcontrol.wait ${gridwait} < first global load ${load}")
endfunction()

# The standalone kernels (lib/cuda/offload_kernels.cu) and the MoE layer's FC1, whose block 0
# publishes in a hybrid layer (lib/cuda/moe_layer.cu).
check_publish("classify_publish")
check_wait("wait_accumulate")
check_waits_for_preceding_grid("wait_accumulate")
check_publish("moe_fc1_kernel")
