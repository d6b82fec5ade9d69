#!/usr/bin/env bash
# Development build: compiles the core, the GoogleTest suite and met._core into build/dev and links
# the extension into python/met/, so `PYTHONPATH=python` imports the fresh build without a reinstall.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${MET_BUILD_DIR:-build/dev}
# -O3 as the Release build users get (CMake's RelWithDebInfo is -O2, which leaves the kernels'
# inner loops unvectorized: the few-rows matmul ran at half speed), with symbols for perf.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMET_BUILD_TESTS=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O3 -g -DNDEBUG" \
  -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" -DPython_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
so=$(ls "$build_dir"/_core*.so)
ln -sf "$(realpath "$so")" "python/met/$(basename "$so")"
