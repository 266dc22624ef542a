# astrai_add_family(<name> KERNELS <.cu...> BINDING <.cpp...> [TESTS <.cu...>])
#   astrai_<name>_kernels  object library of device code (no torch), shared with the standalone tests
#   astrai_<name>          the stable-ABI library installed into the image
#   <test>                 one executable per standalone .cu test (not installed), registered with ctest
#                          twice: `<test>` (full table) and `<test>.small` (the sanitizer's --small mode),
#                          label `cu-test`; `ctest --test-dir <build>/csrc -L cu-test` runs them on a GPU.

set(ASTRAI_GENCODE_FLAGS "")
foreach(_a IN LISTS ASTRAI_CUDA_ARCH)
  list(APPEND ASTRAI_GENCODE_FLAGS "-gencode=arch=compute_${_a},code=sm_${_a}")
endforeach()
foreach(_a IN LISTS ASTRAI_CUDA_PTX)
  list(APPEND ASTRAI_GENCODE_FLAGS "-gencode=arch=compute_${_a},code=compute_${_a}")
endforeach()

# -lineinfo: profilers and the sanitizer map SASS to source; compressed fatbins keep images small.
set(ASTRAI_CUDA_FLAGS -O3 -lineinfo -Xfatbin=-compress-all --expt-relaxed-constexpr
  "-Xcompiler=-fvisibility=hidden"
  "-Xcompiler=-ffile-prefix-map=${CMAKE_SOURCE_DIR}/=")

if(ASTRAI_IMAGE_NAME STREQUAL "")
  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _ "${CMAKE_CUDA_COMPILER_VERSION}")
  set(ASTRAI_IMAGE_NAME "cu${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
endif()
set(ASTRAI_IMAGE_DESTINATION "astrai/extension/lib/${ASTRAI_IMAGE_NAME}")
message(STATUS "astrai: image ${ASTRAI_IMAGE_NAME} (CUDA ${CMAKE_CUDA_COMPILER_VERSION})")

set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# Arches come from ASTRAI_GENCODE_FLAGS; keep CMake from adding its own.
set(CMAKE_CUDA_ARCHITECTURES OFF)
# Nothing in an image carries an RPATH: libtorch.so resolves from the process that imported torch,
# and an untouched install keeps image.json's checksums equal to the built files.
set(CMAKE_SKIP_RPATH ON)

# ctest: the standalone tests of every family register in this directory (csrc/ of the build tree).
if(ASTRAI_BUILD_TESTS)
  enable_testing()
endif()

function(astrai_add_family name)
  cmake_parse_arguments(F "" "" "KERNELS;BINDING;TESTS" ${ARGN})
  if(NOT F_KERNELS OR NOT F_BINDING)
    message(FATAL_ERROR "astrai_add_family(${name}): KERNELS and BINDING are required")
  endif()

  add_library(astrai_${name}_kernels OBJECT ${F_KERNELS})
  target_include_directories(astrai_${name}_kernels PUBLIC "${CMAKE_CURRENT_SOURCE_DIR}")
  target_compile_options(astrai_${name}_kernels PRIVATE ${ASTRAI_CUDA_FLAGS} ${ASTRAI_GENCODE_FLAGS})
  set_target_properties(astrai_${name}_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)

  add_library(astrai_${name} SHARED ${F_BINDING} $<TARGET_OBJECTS:astrai_${name}_kernels>)
  target_include_directories(astrai_${name} PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}")
  target_compile_options(astrai_${name} PRIVATE -O2 -fvisibility=hidden
    "-ffile-prefix-map=${CMAKE_SOURCE_DIR}/=")
  # Static cudart: the library does not depend on torch's own CUDA runtime (cu12 or cu13).
  # --exclude-libs keeps its symbols (and libstdc++'s static bits) out of the dynamic table.
  target_link_libraries(astrai_${name} PRIVATE astrai_torch_stable CUDA::cudart_static)
  target_link_options(astrai_${name} PRIVATE "LINKER:--exclude-libs,ALL" "LINKER:--no-undefined-version")
  set_target_properties(astrai_${name} PROPERTIES PREFIX "" OUTPUT_NAME "astrai_${name}"
    CXX_VISIBILITY_PRESET hidden)
  install(TARGETS astrai_${name} LIBRARY DESTINATION "${ASTRAI_IMAGE_DESTINATION}")
  set_property(GLOBAL APPEND PROPERTY ASTRAI_FAMILIES ${name})

  if(ASTRAI_BUILD_TESTS)
    foreach(_t IN LISTS F_TESTS)
      get_filename_component(_tname "${_t}" NAME_WE)
      add_executable(${_tname} "${_t}" $<TARGET_OBJECTS:astrai_${name}_kernels>)
      target_include_directories(${_tname} PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}")
      target_compile_options(${_tname} PRIVATE ${ASTRAI_CUDA_FLAGS} ${ASTRAI_GENCODE_FLAGS})
      target_link_libraries(${_tname} PRIVATE CUDA::cudart_static)
      set_target_properties(${_tname} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
      # Exit status 0 pass, 1 a case failed, 2 a CUDA error (test_utils.cuh): any non-zero fails ctest.
      add_test(NAME ${_tname} COMMAND ${_tname})
      add_test(NAME ${_tname}.small COMMAND ${_tname} --small)
      set_tests_properties(${_tname} ${_tname}.small PROPERTIES LABELS "cu-test;${name}" TIMEOUT 300)
      set_property(GLOBAL APPEND PROPERTY ASTRAI_CU_TESTS ${_tname})
    endforeach()
  endif()
endfunction()
