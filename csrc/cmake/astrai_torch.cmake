# The LibTorch stable ABI: headers and libtorch.so of whatever torch >= 2.10 the build runs against
# (the CPU wheel is enough). See ../shared/notes/stable-abi.md for why each flag is here.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__)"
  OUTPUT_VARIABLE _torch_out RESULT_VARIABLE _torch_rc ERROR_VARIABLE _torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "astrai: cannot import torch with ${Python_EXECUTABLE}: ${_torch_err}\n"
    "Install torch==2.13.0 first and build with --no-build-isolation (nox -s build does both).")
endif()
string(REPLACE "\n" ";" _torch_out "${_torch_out}")
list(GET _torch_out 0 ASTRAI_TORCH_DIR)
list(GET _torch_out 1 ASTRAI_TORCH_VERSION)
if(ASTRAI_TORCH_VERSION VERSION_LESS "2.10")
  message(FATAL_ERROR "astrai: the stable ABI build needs torch >= 2.10 headers, found ${ASTRAI_TORCH_VERSION}")
endif()
message(STATUS "astrai: torch ${ASTRAI_TORCH_VERSION} at ${ASTRAI_TORCH_DIR}")

add_library(astrai_torch_stable INTERFACE)
# 2.10 is the oldest runtime the libraries promise to load into; one byte each for major and minor.
target_compile_definitions(astrai_torch_stable INTERFACE
  TORCH_TARGET_VERSION=0x020a000000000000 TORCH_STABLE_ONLY USE_CUDA)
target_include_directories(astrai_torch_stable SYSTEM INTERFACE "${ASTRAI_TORCH_DIR}/include")
target_link_directories(astrai_torch_stable INTERFACE "${ASTRAI_TORCH_DIR}/lib")
# NEEDED libtorch.so is required: torch loads its own libraries RTLD_LOCAL, so the shim symbols
# resolve only through this entry. --no-as-needed keeps it even though the link sees few uses.
target_link_libraries(astrai_torch_stable INTERFACE "-Wl,--no-as-needed" torch)
