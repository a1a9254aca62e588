# cmake -DIN=file -DOUT=header -DNAME=symbol -P embed_text.cmake: writes a header defining
# `inline constexpr const char NAME[]` with the file's text (a raw string literal), so a binary carries the file.
file(READ "${IN}" text)
string(FIND "${text}" ")RAILYARD_EMBED\"" bad)
if(NOT bad EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter )RAILYARD_EMBED\"")
endif()
file(WRITE "${OUT}" "// Generated from ${IN} by cmake/embed_text.cmake: do not edit.\n#pragma once\n"
     "inline constexpr const char ${NAME}[] = R\"RAILYARD_EMBED(${text})RAILYARD_EMBED\";\n")
