# Run at every build (cmake -P): writes OUT, a header defining KVBENCH_GIT_SHA as
# `git describe --always --dirty --abbrev=12` of SRC, rewriting it only when that changed.
# The binary then records the commit it was built from, whatever the tree holds when it runs
# (a sweep's shards on a cluster run one binary while the tree moves on).
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE sha OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR sha STREQUAL "")
  set(sha "unknown")
endif()
set(text "// Written at build time by cmake/git_sha.cmake.\n#define KVBENCH_GIT_SHA \"${sha}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
