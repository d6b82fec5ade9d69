#!/usr/bin/env bash
# The one GPU check (about 5-8 minutes on one H200, no network): builds met._core with CUDA into
# build/cuda-check, runs the C++ tests and the GPU tests, then times decode and prefill with
# benchmarks/gpu_check.py against a plain torch (SDPA) implementation of the same shapes.
#
# Needs on the machine (nothing is downloaded): nvcc (CUDA 12 or 13), cmake >= 3.18, g++,
# python3 with torch (a CUDA build), numpy, pybind11, pytest, tokenizers, jinja2 and safetensors
# (the engine test's tiny model; gguf is not needed); ninja and GoogleTest are used when present.
# Usage: benchmarks/gpu_check.sh [--quick]   (--quick: fewer timing iterations)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MET_GPU_BUILD_DIR:-build/cuda-check}
start=$SECONDS

python3 -c "import torch, numpy, pybind11, pytest, tokenizers, jinja2, safetensors" || {
  echo "gpu_check: needs python3 with torch (CUDA build), numpy, pybind11, pytest," \
    "tokenizers, jinja2 and safetensors" >&2
  exit 2
}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
tests=OFF
if [ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ]; then tests=ON; fi

echo "== build ($build, sm_90, GoogleTest $tests)"
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DMET_ENABLE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DMET_BUILD_TESTS=$tests \
  -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" \
  -DPython_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build "$build" -j "$(nproc)"

# A package tree of python/met plus the fresh extension, leaving python/met itself untouched.
stage="$build/py/met"
rm -rf "$build/py" && mkdir -p "$stage"
for entry in python/met/*; do
  case "$entry" in *.so) continue ;; esac
  ln -s "$(realpath "$entry")" "$stage/"
done
ln -s "$(realpath "$build"/_core*.so)" "$stage/"
export PYTHONPATH="$build/py"

if [ "$tests" = ON ]; then
  echo "== C++ tests"
  "$build/met_tests" --gtest_brief=1
fi
echo "== GPU tests"
python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/python/test_cuda_kernels.py \
  tests/python/test_cuda_llama.py tests/python/test_engine_gpu.py
echo "== timings"
python3 benchmarks/gpu_check.py "$@"
echo "== gpu_check done in $((SECONDS - start)) s"
