# cmake -P script; see CMakeLists.txt beside it. Configures the whole project (tests, benchmarks,
# examples and the CUDA paths as the calling build has them) with GENERATOR into a scratch dir,
# then builds BUILD_TARGETS there: the code generation steps, which differ between generators
# (building it all again is too slow for the suite).
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(JOIN " " cmd ${ARGN})
    message(FATAL_ERROR "`${cmd}` failed (${rc}):\n${out}\n${err}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
separate_arguments(cache_args UNIX_COMMAND "${CACHE_ARGS}")
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -G ${GENERATOR} ${cache_args})
foreach(target IN LISTS BUILD_TARGETS)
  run(${CMAKE_COMMAND} --build ${WORK_DIR} --target ${target} -j 2)
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "configured with -G \"${GENERATOR}\" and built ${BUILD_TARGETS}")
