# Shared CMake helpers for Railyard targets.

# Warnings for our own code (never for third-party headers, which come in as SYSTEM includes).
function(railyard_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor>)
  if(RAILYARD_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

# railyard_library(NAME SOURCES ... [DEPS ...]): a static library of one module.
function(railyard_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  target_include_directories(${name} PUBLIC ${CMAKE_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${A_DEPS})
  railyard_warnings(${name})
endfunction()

# railyard_binary(NAME SOURCES ... [DEPS ...]): an executable in build/bin.
function(railyard_binary name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS})
  railyard_warnings(${name})
endfunction()

# railyard_test(NAME SOURCES ... [DEPS ...] [LABELS ...] [TIMEOUT s] [E2E]):
# a doctest binary registered with CTest. E2E tests need the local cluster fixture (tests/e2e) and run
# serially, since they share one API server.
function(railyard_test name)
  cmake_parse_arguments(A "E2E" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS} doctest::doctest railyard_test_main)
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR})  # tests/ctest_env.h and the tests' own helpers
  railyard_warnings(${name})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  set(labels ${A_LABELS})
  if(A_E2E)
    list(APPEND labels e2e)
    set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED e2e_cluster RUN_SERIAL TRUE
      ENVIRONMENT "RAILYARD_E2E_STATE_DIR=${RAILYARD_E2E_STATE_DIR};KUBECONFIG=${RAILYARD_E2E_STATE_DIR}/kubeconfig;RAILYARD_SOURCE_DIR=${CMAKE_SOURCE_DIR};RAILYARD_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
  elseif(NOT labels)
    list(APPEND labels unit)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT ${A_TIMEOUT})
  if(NOT A_E2E)
    set_property(TEST ${name} APPEND PROPERTY ENVIRONMENT
      "RAILYARD_SOURCE_DIR=${CMAKE_SOURCE_DIR};RAILYARD_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
  endif()
endfunction()
