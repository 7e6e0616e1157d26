# shardscope_add_test(<name> SOURCES a.cpp... [LIBS libs...] [LABELS l...] [TIMEOUT s] [XVFB]
#                     [OPTIMIZED])
# One Qt Test executable per unit, registered with CTest. Widget tests run with
# QT_QPA_PLATFORM=offscreen; XVFB runs the test in a real X server via xvfb-run. Helpers
# that several areas' tests share live in tests/support.
function(shardscope_add_test name)
  cmake_parse_arguments(T "XVFB;OPTIMIZED" "TIMEOUT" "SOURCES;LIBS;LABELS;ENV" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE Qt6::Test shardscope_warnings ${T_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
  # The test's own code unoptimized; what it tests (the engine's, the widgets' and the app's
  # libraries) keeps the build's -O2. A test compiles in about two thirds of the time
  # (tests/deepspeed/tst_deepspeedagent.cpp: 9.1 s of CPU against 13.3 s at -O2), and CI
  # compiles about 45 of them. No test times anything (benchmarks live in bench/, -O2).
  # OPTIMIZED keeps -O2 for a test whose loops run the engine's header code (templates,
  # inline functions) for long: unoptimized, tst_sessionstore took 30 s instead of 13 and
  # tst_cpucommunicator 19 instead of 9.
  if(NOT T_OPTIMIZED)
    target_compile_options(${name} PRIVATE -O0)
  endif()
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

# shardscope_add_prerequisite_tests(<test> CASE <case> SKIP_NAME <name> CLASS <QtTestClass>
#                                   ENV env...)
# The rule of tests/support/prerequisite.h, held for one real-stack suite: run with ENV (which
# takes one prerequisite away), its case CASE fails in initTestCase (<test>-prerequisite-refused);
# with SHARDSCOPE_ALLOW_SKIP=<name> too, it skips instead (<test>-prerequisite-allowed).
function(shardscope_add_prerequisite_tests test)
  cmake_parse_arguments(P "" "CASE;SKIP_NAME;CLASS" "ENV" ${ARGN})
  get_test_property(${test} ENVIRONMENT base_env)
  add_test(NAME ${test}-prerequisite-refused COMMAND ${test} ${P_CASE})
  set_tests_properties(${test}-prerequisite-refused PROPERTIES TIMEOUT 300
    ENVIRONMENT "${base_env};${P_ENV};SHARDSCOPE_ALLOW_SKIP="
    PASS_REGULAR_EXPRESSION "FAIL! +: ${P_CLASS}::initTestCase\\(\\) a prerequisite is missing[^\n]*SHARDSCOPE_ALLOW_SKIP=${P_SKIP_NAME}")
  add_test(NAME ${test}-prerequisite-allowed COMMAND ${test} ${P_CASE})
  set_tests_properties(${test}-prerequisite-allowed PROPERTIES TIMEOUT 300
    ENVIRONMENT "${base_env};${P_ENV};SHARDSCOPE_ALLOW_SKIP=other,${P_SKIP_NAME}"
    PASS_REGULAR_EXPRESSION "SKIP +: ${P_CLASS}::${P_CASE}[^\n]*\n(.|\n)*Totals: [0-9]+ passed, 0 failed, [1-9]")
endfunction()
