# Precompiled headers. The standard library, gRPC, protobuf and GoogleTest headers that nearly
# every translation unit includes were a third to two thirds of its compile time (a sidecar test:
# 5.6 s of parsing, 1.9 s with them precompiled); each set is now parsed once per build.
#
# GCC uses a precompiled header only where it was built with the same optimisation, debug and
# code-model flags and with the same predefined macros, so there is one per set of flags: collectived_pch_std and collectived_pch_grpc
# for the libraries and programs (the build type's flags), collectived_pch_tests for the test code
# (tests/CMakeLists.txt, -O1). CMake adds -Winvalid-pch, so with our -Werror a header that could
# not be used fails the build instead of silently costing its parse again. Sources with flags of
# their own (the -O3 kernels) opt out with SKIP_PRECOMPILE_HEADERS.
#
# -DCOLLECTIVED_PCH=OFF turns them off (the fuzz build does: clang, and few sources).
option(COLLECTIVED_PCH "Precompile the headers most sources include" ON)

set(COLLECTIVED_PCH_STD_HEADERS
    <algorithm> <array> <atomic> <chrono> <condition_variable> <cstdint> <cstring> <deque>
    <functional> <map> <memory> <mutex> <optional> <set> <span> <string> <string_view> <thread>
    <unordered_map> <utility> <variant> <vector>)
set(COLLECTIVED_PCH_GRPC_HEADERS ${COLLECTIVED_PCH_STD_HEADERS} <grpcpp/grpcpp.h>
    <google/protobuf/message.h> <google/protobuf/generated_message_reflection.h>)
set(COLLECTIVED_PCH_TEST_HEADERS ${COLLECTIVED_PCH_GRPC_HEADERS} <gtest/gtest.h> <gmock/gmock.h>)

# collectived_add_pch(NAME HEADERS h... LIBS l...): object libraries that only build the
# precompiled HEADERS (found through LIBS) with the compile options of the current directory:
# NAME, and NAME_pic for position-independent code (-fPIC, which GCC also insists on matching).
# Each is built only if some target uses it.
function(collectived_add_pch name)
  cmake_parse_arguments(ARG "" "" "HEADERS;LIBS" ${ARGN})
  if(NOT COLLECTIVED_PCH)
    return()
  endif()
  foreach(variant ${name} ${name}_pic)
    add_library(${variant} OBJECT EXCLUDE_FROM_ALL ${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cc)
    # Our warning flags too: -Wpedantic changes which macros GCC predefines.
    target_link_libraries(${variant} PRIVATE ${ARG_LIBS} collectived_warnings)
    target_precompile_headers(${variant} PRIVATE ${ARG_HEADERS})
  endforeach()
  set_target_properties(${name}_pic PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

# collectived_use_pch(PCH target...): the targets include PCH's precompiled headers (the
# position-independent variant for those that are). Call it after their properties are set.
function(collectived_use_pch pch)
  if(NOT COLLECTIVED_PCH)
    return()
  endif()
  foreach(target ${ARGN})
    get_target_property(pic ${target} POSITION_INDEPENDENT_CODE)
    get_target_property(type ${target} TYPE)
    if(pic OR type STREQUAL "SHARED_LIBRARY" OR type STREQUAL "MODULE_LIBRARY")
      target_precompile_headers(${target} REUSE_FROM ${pch}_pic)
    else()
      target_precompile_headers(${target} REUSE_FROM ${pch})
    endif()
  endforeach()
endfunction()
