# Writes a file's bytes as a C array: cmake -DIN=FILE -DOUT=FILE.c -DNAME=SYMBOL -P embed.cmake
# defines `const unsigned char SYMBOL[]` (a NUL after the bytes) and `const size_t SYMBOL_len`
# (the bytes without it). The gateway's playground page stays a readable .html in the tree and
# needs no file at run time.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR n "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# 16 bytes a line keeps the generated file readable in a debugger.
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp"
     "// generated from ${IN} by embed.cmake — do not edit\n#include <stddef.h>\n"
     "const unsigned char ${NAME}[] = {\n${bytes}0x00};\nconst size_t ${NAME}_len = ${n};\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
