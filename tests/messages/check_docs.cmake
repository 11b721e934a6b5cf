# Fails when DOCS differs from what MSGGEN generates from SCHEMA now.
execute_process(COMMAND ${MSGGEN} ${SCHEMA} --docs ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "msggen failed on ${SCHEMA}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${OUT} ${DOCS} RESULT_VARIABLE differ)
if(NOT differ EQUAL 0)
  message(FATAL_ERROR "docs/messages.md is out of date with messages/schema.msg; "
                      "run `cmake --build <build dir> --target messages-docs` and commit it")
endif()
