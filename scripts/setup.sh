#!/usr/bin/env bash
# Sets up met from a fresh clone: system packages (when root and missing), a virtual environment in
# .venv with a CPU build of torch, and an editable install of met (which compiles met._core).
set -euo pipefail
cd "$(dirname "$0")/.."

apt_needed=()
command -v g++ >/dev/null || apt_needed+=(g++)
command -v cmake >/dev/null || apt_needed+=(cmake)
command -v clang-format >/dev/null || apt_needed+=(clang-format)
[ -f /usr/include/gtest/gtest.h ] || apt_needed+=(libgtest-dev)
python3 -c "import venv, ensurepip" 2>/dev/null || apt_needed+=(python3-venv)
# The chat page's browser test (tests/python/test_webui.py) drives headless Chromium; it is
# installed where we can (CI runs as root on a fresh machine) and only missed elsewhere.
# MET_SETUP_BROWSER=0 (scripts/serve.sh: serving needs no browser) leaves it out.
browser_needed=()
if [ "${MET_SETUP_BROWSER:-1}" != 0 ]; then
  command -v chromium >/dev/null || command -v chromium-browser >/dev/null || browser_needed+=(chromium)
  command -v chromedriver >/dev/null || browser_needed+=(chromium-driver)
fi
if [ ${#browser_needed[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt_needed+=("${browser_needed[@]}")
  else
    echo "met setup: the browser test will skip without ${browser_needed[*]} (apt-get install ${browser_needed[*]})" >&2
  fi
fi
if [ ${#apt_needed[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_needed[@]}" >/dev/null
  else
    echo "met setup: please install: ${apt_needed[*]} (e.g. sudo apt-get install ${apt_needed[*]})" >&2
    exit 1
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build on a CPU machine.
python -c "import torch" 2>/dev/null || pip install -q "${MET_TORCH_SPEC:-torch==2.13.0}"
pip install -q scikit-build-core pybind11 cmake ninja
pip install -q --no-build-isolation -e ".[test]"
