# SHARDSCOPE_SANITIZE: build everything under AddressSanitizer with UBSan (`address`) or under
# ThreadSanitizer (`thread`); CMakePresets.json's asan and tsan presets set it, and
# tests/sanitizers/CMakeLists.txt registers what the test command runs in each.
set(SHARDSCOPE_SANITIZE "" CACHE STRING "Build under a sanitizer: address (ASan + UBSan), thread (TSan) or empty")
set_property(CACHE SHARDSCOPE_SANITIZE PROPERTY STRINGS "" address thread)
if(SHARDSCOPE_SANITIZE STREQUAL "address")
  # -fno-sanitize-recover: the first undefined behaviour aborts the test, so it fails.
  set(shardscope_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=all)
elseif(SHARDSCOPE_SANITIZE STREQUAL "thread")
  # gcc's -Wtsan warns that TSan ignores std::atomic_thread_fence; the clock's seqlock
  # (telemetry/clock.h) fences, but every field it fences is itself atomic.
  set(shardscope_sanitize_flags -fsanitize=thread)
  add_compile_options($<$<CXX_COMPILER_ID:GNU>:-Wno-tsan>)
elseif(NOT SHARDSCOPE_SANITIZE STREQUAL "")
  message(FATAL_ERROR "SHARDSCOPE_SANITIZE is `${SHARDSCOPE_SANITIZE}`; use address, thread or leave it empty")
endif()
if(shardscope_sanitize_flags)
  add_compile_options(${shardscope_sanitize_flags} -fno-omit-frame-pointer)
  add_link_options(${shardscope_sanitize_flags})
endif()
