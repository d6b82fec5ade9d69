#!/usr/bin/env bash
# The whole test suite: setup, the default model, C++ unit tests (ctest), formatting and lint,
# then pytest. This is the README's test command and what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate

met pull

cmake -S . -B build/tests -G Ninja -DMET_BUILD_TESTS=ON -DMET_BUILD_PYTHON=OFF >/dev/null
cmake --build build/tests -j "$(nproc)"
ctest --test-dir build/tests --output-on-failure

mapfile -t cxx_files < <(git ls-files 'csrc/*.h' 'csrc/*.cpp' 'csrc/*.cc' 'csrc/*.cu' 'csrc/*.cuh' 'csrc/*.inc' 'tests/cpp/*.cc' 'tests/cpp/*.h')
clang-format --dry-run --Werror "${cxx_files[@]}"
ruff check python tests benchmarks
ruff format --check python tests benchmarks

python -m pytest -q tests/python "$@"
