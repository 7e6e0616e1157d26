# Project-wide warning flags; CI builds with SHARDSCOPE_WERROR=ON.
add_library(shardscope_warnings INTERFACE)
target_compile_options(shardscope_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wnon-virtual-dtor>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wshadow=local>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:Clang>>:-Wshadow-uncaptured-local>)
if(SHARDSCOPE_WERROR)
  target_compile_options(shardscope_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
