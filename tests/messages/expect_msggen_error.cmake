# Passes when MSGGEN refuses SCHEMA with an error matching the regex on SCHEMA's
# "# expect: " line (which includes the line number msggen must report).
file(STRINGS ${SCHEMA} expect REGEX "^# expect: ")
string(REGEX REPLACE "^# expect: " "" expect "${expect}")
if(expect STREQUAL "")
  message(FATAL_ERROR "${SCHEMA} has no '# expect: REGEX' line")
endif()
execute_process(COMMAND ${MSGGEN} ${SCHEMA} --header ${OUT}.h --source ${OUT}.c
                RESULT_VARIABLE rc ERROR_VARIABLE error)
if(rc EQUAL 0)
  message(FATAL_ERROR "msggen accepted ${SCHEMA}")
endif()
if(NOT error MATCHES "${expect}")
  message(FATAL_ERROR "msggen said\n  ${error}\nexpected a match for\n  ${expect}")
endif()
if(EXISTS ${OUT}.h OR EXISTS ${OUT}.c)
  message(FATAL_ERROR "msggen wrote output for a bad schema")
endif()
