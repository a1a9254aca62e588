# Sanitizer and fuzzing builds (docs/hardening.md).
#
# RAILYARD_SANITIZE=address: ASan + UBSan, every finding fatal (-fno-sanitize-recover), for the unit tests.
# RAILYARD_SANITIZE=thread:  TSan, for the concurrency-heavy tests.
# RAILYARD_FUZZ=ON (clang only): every target gets libFuzzer coverage instrumentation plus ASan+UBSan, and
#   tests/fuzz builds one libFuzzer binary per parser.
# The flags apply to the whole tree so that library code is instrumented too; third-party libraries (gloo, OpenBLAS,
# yaml-cpp, OpenSSL) are not, which is why TSan needs the third-party suppressions in tests/fuzz/tsan.supp (passed by scripts/test.sh).
set(RAILYARD_SANITIZE "" CACHE STRING "Sanitizer build: address (ASan+UBSan), thread (TSan) or empty")
set_property(CACHE RAILYARD_SANITIZE PROPERTY STRINGS "" address thread)
option(RAILYARD_FUZZ "Build the libFuzzer targets in tests/fuzz (needs clang)" OFF)

set(railyard_san_flags "")
if(RAILYARD_SANITIZE STREQUAL "address")
  list(APPEND railyard_san_flags -fsanitize=address,undefined -fno-sanitize-recover=all)
elseif(RAILYARD_SANITIZE STREQUAL "thread")
  list(APPEND railyard_san_flags -fsanitize=thread)
elseif(NOT RAILYARD_SANITIZE STREQUAL "")
  message(FATAL_ERROR "RAILYARD_SANITIZE='${RAILYARD_SANITIZE}': use address, thread or leave it empty")
endif()

if(RAILYARD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "RAILYARD_FUZZ=ON needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang")
  endif()
  if(RAILYARD_SANITIZE STREQUAL "thread")
    message(FATAL_ERROR "RAILYARD_FUZZ=ON runs with ASan+UBSan; do not combine it with RAILYARD_SANITIZE=thread")
  endif()
  if(NOT RAILYARD_SANITIZE STREQUAL "address")
    list(APPEND railyard_san_flags -fsanitize=address,undefined -fno-sanitize-recover=all)
  endif()
endif()

if(railyard_san_flags)
  # Frame pointers and line tables: readable stacks (function, file:line) in every report. -g1, not -g: full debug
  # info adds 9-16 % to each compile (measured on two units, clang ASan -O1) and the reports need only the lines; it
  # also overrode the -g1 that scripts/test.sh asks for.
  add_compile_options(${railyard_san_flags} -fno-omit-frame-pointer -g1)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC documents that sanitizer instrumentation produces false -Wmaybe-uninitialized reports (seen with TSan -O1
    # on std::optional in worker/agent/pod_agent.cc); the plain build keeps the warning as an error.
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>)
  endif()
  add_link_options(${railyard_san_flags})
endif()
if(RAILYARD_FUZZ)
  # GCC's -Wshadow=local (cmake/railyard.cmake) has no clang spelling; clang would refuse it under -Werror.
  add_compile_options(-Wno-unknown-warning-option)
  # Coverage counters in every object; only the fuzz binaries link libFuzzer's main (-fsanitize=fuzzer).
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
