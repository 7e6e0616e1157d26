# Project-wide warning flags; CI builds with SHARDSCOPE_WERROR=ON.
add_library(shardscope_warnings INTERFACE)
target_compile_options(shardscope_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor>)
if(SHARDSCOPE_WERROR)
  target_compile_options(shardscope_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
