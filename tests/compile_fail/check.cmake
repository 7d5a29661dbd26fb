# A compile_fail_<name> ctest: builds the object library made of tests/compile_fail/<name>.cpp, which must
# fail, with every "// expect: REGEX" line of the source matched by the compiler's output (so it fails for
# the reason it is meant to). Arguments: -DBUILD_DIR= -DTARGET= -DSOURCE=
file(STRINGS ${SOURCE} expectations REGEX "^// expect: ")
if(NOT expectations)
  message(FATAL_ERROR "${SOURCE} has no '// expect: REGEX' line")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET}: compiled, but must not")
endif()
foreach(line IN LISTS expectations)
  string(REGEX REPLACE "^// expect: " "" regex "${line}")
  if(NOT out MATCHES "${regex}")
    message(FATAL_ERROR "${TARGET}: the compiler's output does not match '${regex}':\n${out}")
  endif()
endforeach()
message(STATUS "${TARGET}: fails to compile, naming what it should")
