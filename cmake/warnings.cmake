# Warnings and sanitizers for the project's own targets (never forced on consumers).
add_library(infer_warnings INTERFACE)
target_compile_options(infer_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
if(INFER_SANITIZE)
  target_compile_options(infer_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer>)
  target_link_options(infer_warnings INTERFACE -fsanitize=address,undefined)
endif()
