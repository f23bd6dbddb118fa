#!/usr/bin/env bash
# Run the test suite: creates .venv if missing, installs t5x_like with its test extra at the
# locked versions, then runs pytest. Without arguments: ruff (lint and format) and mypy, the
# default suite (under 15 minutes on 2 cores), then the slow set (training runs; ~45 more
# minutes) less the `very_slow` tests (the T5-11B plans, 8-14 minutes each; run them with
# `-m very_slow`). With arguments, just pytest with them (e.g. `-m 'not slow'`, `-m slow` or
# `-k hf`).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/_venv.sh
ensure_venv test
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
if [ "$#" -eq 0 ]; then
  # Lint, format and types first: seconds, and a failure here needs no test run to see.
  python -m ruff check .
  python -m ruff format --check .
  python -m mypy
  python -m pytest
  exec python -m pytest -m "slow and not very_slow"
fi
exec python -m pytest "$@"
