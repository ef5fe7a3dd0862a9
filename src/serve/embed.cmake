# cmake -DIN=file -DOUT=header -DNAME=kSymbol -P embed.cmake: writes a header holding the file's
# bytes as `inline constexpr unsigned char NAME[]`. A byte array, not a string literal: any byte
# sequence survives, and no compiler limit on literal length applies.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
if(n EQUAL 0)
  message(FATAL_ERROR "embed.cmake: ${IN} is empty")
endif()
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# 16 bytes a line keeps the generated header readable in a debugger.
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp"
     "// Generated from ${NAME_OF_INPUT} by src/serve/embed.cmake; do not edit.\n#pragma once\n"
     "inline constexpr unsigned char ${NAME}[] = {\n${bytes}\n};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
