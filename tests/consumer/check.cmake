# ctest's package_consumer test: install the build tree into a fresh prefix, then build and run
# tests/consumer against it with find_package(infer). Arguments: -DBUILD_DIR= -DSOURCE_DIR= -DWORK_DIR=
# (the consumer runs its own policies on the default model, models/SmolLM2-135M-Instruct.Q4_1.gguf)
file(REMOVE_RECURSE ${WORK_DIR})
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package_consumer: '${ARGN}' failed (${rc})")
  endif()
endfunction()
step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
     -DCMAKE_BUILD_TYPE=Release)
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
set(model ${SOURCE_DIR}/models/SmolLM2-135M-Instruct.Q4_1.gguf)
if(NOT EXISTS ${model})
  message(FATAL_ERROR "package_consumer: the default model is missing at ${model}: run scripts/setup.sh")
endif()
step(${WORK_DIR}/build/consumer ${model})
