# The layers' include rules, checked on every file (ctest: test_layers, label unit):
#   common/   includes only common/
#   kernels/  includes only kernels/ and common/
#   cache/    (the seam a method plugs into) includes only cache/, kernels/ and common/
#   methods/  includes only methods/, cache/, kernels/ and common/
# so a method needs the seam and the kernels, never the harness, and the seam needs no method.
# Run: cmake -DSOURCE_DIR=<tree> -P tests/check_layers.cmake
cmake_minimum_required(VERSION 3.22)
set(allowed_common "common")
set(allowed_kernels "kernels;common")
set(allowed_cache "cache;kernels;common")
set(allowed_methods "methods;cache;kernels;common")

set(bad "")
foreach(layer common kernels cache methods)
  file(GLOB_RECURSE files "${SOURCE_DIR}/${layer}/*.h" "${SOURCE_DIR}/${layer}/*.cpp"
       "${SOURCE_DIR}/${layer}/*.cu" "${SOURCE_DIR}/${layer}/*.cuh")
  foreach(file ${files})
    file(STRINGS "${file}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"/]+/")
    foreach(line ${includes})
      string(REGEX REPLACE "^[^\"]*\"([^\"/]+)/.*$" "\\1" top "${line}")
      if(NOT top IN_LIST allowed_${layer})
        file(RELATIVE_PATH rel "${SOURCE_DIR}" "${file}")
        string(STRIP "${line}" line)
        list(APPEND bad "${rel}: ${line}")
      endif()
    endforeach()
  endforeach()
endforeach()
if(bad)
  list(JOIN bad "\n  " text)
  message(FATAL_ERROR "includes across layers (tests/check_layers.cmake):\n  ${text}")
endif()
