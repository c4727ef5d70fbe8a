# cmake -P script; see CMakeLists.txt beside it. Runs BENCH with the standard Google Benchmark
# flags --benchmark_format=json, --benchmark_filter=FILTER and a tiny --benchmark_min_time, and
# checks that stdout is one JSON document (nothing before or after it) whose benchmarks include
# EXPECT.
execute_process(
  COMMAND ${BENCH} --benchmark_format=json "--benchmark_filter=${FILTER}"
          --benchmark_min_time=${MIN_TIME}
  WORKING_DIRECTORY ${WORK_DIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(what "${BENCH} --benchmark_format=json --benchmark_filter=${FILTER}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "`${what}` failed (${rc}):\n${out}\n${err}")
endif()
string(STRIP "${out}" document)
# string(JSON) stops at the end of the first value and ignores what follows: the ends are checked.
if(NOT document MATCHES "^{" OR NOT document MATCHES "}$")
  message(FATAL_ERROR "`${what}`: stdout is not one JSON object:\n${out}")
endif()
string(JSON count ERROR_VARIABLE json_error LENGTH "${document}" benchmarks)
if(json_error)
  message(FATAL_ERROR "`${what}`: stdout is not JSON (${json_error}):\n${out}")
endif()
set(names "")
if(count GREATER 0)
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON name GET "${document}" benchmarks ${i} name)
    list(APPEND names "${name}")
  endforeach()
endif()
list(FILTER names INCLUDE REGEX "^${EXPECT}")
if(NOT names)
  message(FATAL_ERROR "`${what}`: no benchmark named ${EXPECT}... in the JSON:\n${out}")
endif()
message(STATUS "${BENCH}: JSON with ${count} benchmarks")
