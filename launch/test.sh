#!/usr/bin/env bash
# Run the test suite: creates .venv if missing, installs t5x_like with its test extra at the
# locked versions, then runs pytest (extra arguments go to pytest, e.g. `-m slow` or `-k hf`).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/_venv.sh
ensure_venv test
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec python -m pytest "$@"
