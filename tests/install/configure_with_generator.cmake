# cmake -P script; see CMakeLists.txt beside it. Configures the whole project (tests, benchmarks,
# examples and the CUDA paths as the calling build has them) with GENERATOR into a scratch dir.
# Configure only: building it all again is too slow for the suite.
file(REMOVE_RECURSE ${WORK_DIR})
separate_arguments(cache_args UNIX_COMMAND "${CACHE_ARGS}")
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -G ${GENERATOR} ${cache_args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring ${SOURCE_DIR} with -G \"${GENERATOR}\" ${CACHE_ARGS} failed "
                      "(${rc}):\n${out}\n${err}")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "configured with -G \"${GENERATOR}\"")
