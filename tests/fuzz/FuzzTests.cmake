# The ctest tests fuzz_<target> of the main build (label cpu): each runs
# build-fuzz's <target>_fuzzer (tests/fuzz/CMakeLists.txt, built by
# scripts/setup.sh with clang) for $LOOM_FUZZ_SECONDS (default 30) from a copy
# of tests/fuzz/corpus/<target>; any crash, leak, sanitizer report or uncaught
# exception fails the test. Included from the top-level CMakeLists.txt.
if(LOOM_BUILD_TESTS)
  set(LOOM_FUZZ_BUILD_DIR ${CMAKE_SOURCE_DIR}/build-fuzz CACHE PATH "Build directory of the fuzz targets (-DLOOM_FUZZ=ON)")
  file(GLOB LOOM_FUZZ_TARGET_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/*_fuzzer.cc)
  foreach(fuzzer_source ${LOOM_FUZZ_TARGET_SOURCES})
    get_filename_component(fuzzer_name ${fuzzer_source} NAME_WE)
    string(REGEX REPLACE "_fuzzer$" "" target_name ${fuzzer_name})
    add_test(NAME fuzz_${target_name}
             COMMAND ${CMAKE_SOURCE_DIR}/tests/fuzz/run_fuzzer.sh
                     ${LOOM_FUZZ_BUILD_DIR}/tests/fuzz/${fuzzer_name}
                     ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${target_name}
                     ${CMAKE_BINARY_DIR}/fuzz-artifacts/${target_name})
    # TIMEOUT covers LOOM_FUZZ_SECONDS up to ~10 minutes plus the corpus replay.
    set_tests_properties(fuzz_${target_name} PROPERTIES LABELS cpu TIMEOUT 900)
  endforeach()
endif()
