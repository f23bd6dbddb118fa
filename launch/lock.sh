#!/usr/bin/env bash
# Re-resolve the dependency set from pyproject.toml in a scratch venv and write the exact
# versions to requirements/lock.txt. Run after changing dependencies; commit the result.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"${PYTHON:-python3}" -m venv "$scratch/venv"
"$scratch/venv/bin/python" -m pip install --quiet --upgrade pip
"$scratch/venv/bin/python" -m pip install --quiet ".[test]"
{
  echo "# Exact versions of the whole dependency set, used as pip constraints by launch/_venv.sh."
  echo "# Regenerate after changing pyproject.toml: bash launch/lock.sh"
  # A local build label (torch 2.13.0+cpu) is dropped: ==2.13.0 matches it and its peers.
  "$scratch/venv/bin/python" -m pip freeze --exclude-editable \
    | grep -v -i '^t5x[-_]like' | sed -E 's/^([A-Za-z0-9_.-]+==[^+]+)\+.*$/\1/'
} > requirements/lock.txt
echo "wrote requirements/lock.txt ($(grep -vc '^#' requirements/lock.txt) packages)"
