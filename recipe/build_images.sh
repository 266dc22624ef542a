#!/usr/bin/env bash
# Farm mode of the recipe: compile the image for this variant's CUDA toolkit with the farm's compilers and
# install it under $PREFIX/lib/astrai-kernels/<image>/ (image.json checksums are of the installed files).
set -euxo pipefail
# CMAKE_ARGS (the farm's toolchain settings) comes first so that the install prefix below wins.
stage="$SRC_DIR/_stage"
cmake ${CMAKE_ARGS:-} -S . -B _build -G Ninja -DCMAKE_BUILD_TYPE=Release -DASTRAI_BUILD_TESTS=OFF -DASTRAI_CCACHE=OFF \
  -DCMAKE_INSTALL_PREFIX="$stage" -DPython_EXECUTABLE="$PYTHON"
cmake --build _build --parallel "${CPU_COUNT:-2}"
cmake --install _build
mkdir -p "$PREFIX/lib/astrai-kernels"
cp -R "$stage"/astrai/extension/lib/. "$PREFIX/lib/astrai-kernels/"
