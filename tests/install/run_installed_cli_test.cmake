# cmake -P script; see CMakeLists.txt beside it. Installs the build into a scratch prefix and runs
# the installed `trainguard` with an empty environment (no LD_LIBRARY_PATH), from the prefix it
# was installed to and again after the prefix was moved.
function(run_installed_cli cli)
  foreach(args "version" "--help")
    separate_arguments(argv UNIX_COMMAND "${args}")
    execute_process(COMMAND env -i ${cli} ${argv} WORKING_DIRECTORY ${WORK_DIR}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0 OR NOT out MATCHES "trainguard")
      message(FATAL_ERROR "`env -i ${cli} ${args}` failed (${rc}):\n${out}\n${err}")
    endif()
  endforeach()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR
          "cmake --install ${BUILD_DIR} --prefix ${prefix} failed (${rc}):\n${out}\n${err}")
endif()
run_installed_cli(${prefix}/${BINDIR}/trainguard)
file(RENAME ${prefix} ${WORK_DIR}/moved)
run_installed_cli(${WORK_DIR}/moved/${BINDIR}/trainguard)
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "the installed trainguard ran from its prefix and from a moved one")
