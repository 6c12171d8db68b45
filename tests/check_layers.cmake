# The layers' include rules, checked on every source file of the tree (ctest: test_layers,
# label unit). A layer is a top-level folder, except that harness/model/ (the model and its
# files) and harness/cli/ (the command line, the top) are layers of their own. A file may
# include its own layer's headers and those of the layers listed for it:
#   common    -
#   kernels   common
#   cache     kernels common                 (the seam a method plugs into: no method)
#   methods   cache kernels common           (a method needs the seam and the kernels only)
#   model     cache kernels common           (harness/model: the forward writes a KvCache)
#   datasets  model common                   (the generators count tokens)
#   tasks     datasets common
#   store     common                         (the SQLite store; results/ holds the committed dbs)
#   reports   store common
#   reuse     cache kernels common
#   harness   every layer above
#   serve     harness and every layer below it
#   cli       serve, harness and every layer below (harness/cli: the entry points)
#   bench     anything but cli (and tests' helpers: a local Redis)
#   tests, examples: anything
# so nothing includes a layer above its own: the seam no method, the store no report, the
# harness no server and no command line.
# Calls are checked on the built objects by tests/check_layer_calls.sh (test_layer_calls).
# Run: cmake -DSOURCE_DIR=<tree> -P tests/check_layers.cmake
cmake_minimum_required(VERSION 3.22)
set(allowed_common "")
set(allowed_kernels "common")
set(allowed_cache "kernels;common")
set(allowed_methods "cache;kernels;common")
set(allowed_model "cache;kernels;common")
set(allowed_datasets "model;common")
set(allowed_tasks "datasets;common")
set(allowed_store "common")
set(allowed_reports "store;common")
set(allowed_reuse "cache;kernels;common")
set(allowed_harness "methods;model;datasets;tasks;store;reports;reuse;cache;kernels;common")
set(allowed_serve "harness;${allowed_harness}")
set(allowed_cli "serve;${allowed_serve}")
set(allowed_bench "serve;tests;${allowed_serve}")
set(layers common kernels cache methods model datasets tasks store reports reuse harness serve
    cli bench)

# layer_of(PATH OUT): the layer of a path relative to the tree's root.
function(layer_of path out)
  if(path MATCHES "^harness/model/")
    set(${out} model PARENT_SCOPE)
  elseif(path MATCHES "^harness/cli/")
    set(${out} cli PARENT_SCOPE)
  else()
    string(REGEX REPLACE "/.*$" "" top "${path}")
    set(${out} "${top}" PARENT_SCOPE)
  endif()
endfunction()

set(bad "")
set(checked 0)
set(files "")
foreach(folder common kernels cache methods harness datasets tasks store reports reuse serve bench)
  file(GLOB_RECURSE found RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/${folder}/*.h"
       "${SOURCE_DIR}/${folder}/*.cpp" "${SOURCE_DIR}/${folder}/*.cu" "${SOURCE_DIR}/${folder}/*.cuh")
  list(APPEND files ${found})
endforeach()
foreach(rel ${files})
  layer_of("${rel}" layer)
  math(EXPR checked "${checked} + 1")
  file(STRINGS "${SOURCE_DIR}/${rel}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+/[^\"]+\"")
  foreach(line ${includes})
    string(REGEX REPLACE "^[^\"]*\"([^\"]+)\".*$" "\\1" target "${line}")
    layer_of("${target}" to)
    if(NOT to STREQUAL layer AND NOT to IN_LIST allowed_${layer})
      string(STRIP "${line}" line)
      list(APPEND bad "${rel} (${layer}): ${line} (${to})")
    endif()
  endforeach()
endforeach()
if(checked LESS 100)
  message(FATAL_ERROR "tests/check_layers.cmake: only ${checked} files under ${SOURCE_DIR}")
endif()
if(bad)
  list(JOIN bad "\n  " text)
  message(FATAL_ERROR "includes across layers (tests/check_layers.cmake):\n  ${text}")
endif()
message(STATUS "layers: ${checked} files checked")
