#!/usr/bin/env bash
# Sets up met (see setup.sh) and serves the embedded default model on 127.0.0.1:8000.
set -euo pipefail
cd "$(dirname "$0")/.."
MET_SETUP_BROWSER=0 scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
exec met serve "$@"
