# shardscope_add_test(<name> SOURCES a.cpp... [LIBS libs...] [LABELS l...] [TIMEOUT s] [XVFB])
# One Qt Test executable per unit, registered with CTest. Widget tests run with
# QT_QPA_PLATFORM=offscreen; XVFB runs the test in a real X server via xvfb-run. Helpers
# that several areas' tests share live in tests/support.
function(shardscope_add_test name)
  cmake_parse_arguments(T "XVFB" "TIMEOUT" "SOURCES;LIBS;LABELS;ENV" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE Qt6::Test shardscope_warnings ${T_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
  if(T_XVFB)
    find_program(XVFB_RUN xvfb-run REQUIRED)
    add_test(NAME ${name} COMMAND ${XVFB_RUN} -a -s "-screen 0 1600x1000x24" $<TARGET_FILE:${name}>)
    set(env "QT_QPA_PLATFORM=xcb")
  else()
    add_test(NAME ${name} COMMAND ${name})
    set(env "QT_QPA_PLATFORM=offscreen")
  endif()
  # The apps a test starts keep their settings (recent files, layout) away from the user's.
  list(APPEND env "SHARDSCOPE_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
       "XDG_CONFIG_HOME=${CMAKE_BINARY_DIR}/test-config" ${T_ENV})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${env}" TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
endfunction()
