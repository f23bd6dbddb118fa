# shellcheck shell=bash
# Sourced by the launch scripts: make sure .venv exists and holds t5x_like at the locked versions.
# Usage: ensure_venv [EXTRA]   (EXTRA: "test" for the test extra)
# Re-installs only when pyproject.toml or requirements/lock.txt changed since the last install.
# The interpreter .venv is made from is $PYTHON (default python3); ensure_python sets PYTHON to
# one new enough, installing it with uv where the machine has none (stock TPU VM images).

T5X_LIKE_MIN_PYTHON=3.11

# True when interpreter $1 runs and is at least T5X_LIKE_MIN_PYTHON.
python_is_recent() {
  "$1" -c "import sys; sys.exit(sys.version_info < (${T5X_LIKE_MIN_PYTHON/./, }))" >/dev/null 2>&1
}

# Interpreter $1's version, e.g. 3.11.9 (for the line saying which Python a setup used).
python_version_of() {
  "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null || echo unknown
}

# uv's executable: on PATH, or where `pip install --user uv` puts it (~/.local/bin is often not
# on PATH in a non-login ssh shell). Prints nothing and fails when there is none.
find_uv() {
  if command -v uv 2>/dev/null; then return 0; fi
  if [ -x "${HOME}/.local/bin/uv" ]; then echo "${HOME}/.local/bin/uv"; return 0; fi
  return 1
}

# Install uv for this user from the package index with the system Python's pip; prints its path.
install_uv() {
  local base="${1:-python3}"
  echo "Installing uv with $base -m pip install --user uv ..." >&2
  if ! "$base" -m pip install --quiet --user uv >&2; then
    echo "Could not install uv with $base -m pip; install Python >= ${T5X_LIKE_MIN_PYTHON}" \
      "(or uv) on this machine, or set PYTHON=/path/to/python${T5X_LIKE_MIN_PYTHON}, and rerun." >&2
    return 1
  fi
  find_uv || { echo "pip installed uv, but no uv is on PATH or in ~/.local/bin." >&2; return 1; }
}

# Set and export PYTHON to an interpreter >= T5X_LIKE_MIN_PYTHON, and print one line saying which
# one and whether it was installed now. Order: $PYTHON as given (an error if too old), else
# python3 / python3.N on PATH, else a Python uv installed before, else `uv python install`
# (installing uv itself with pip first when needed). Idempotent: a rerun finds what it installed.
ensure_python() {
  local candidate uv found
  if [ -n "${PYTHON:-}" ]; then
    if ! python_is_recent "$PYTHON"; then
      echo "PYTHON=$PYTHON is not Python >= ${T5X_LIKE_MIN_PYTHON}; point it at a newer one or" \
        "unset it to let ensure_python find or install one." >&2
      return 1
    fi
    echo "Python: $PYTHON ($(python_version_of "$PYTHON")), given as PYTHON; nothing installed."
    return 0
  fi
  for candidate in python3 python3.14 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null 2>&1 && python_is_recent "$candidate"; then
      export PYTHON
      PYTHON="$(command -v "$candidate")"
      echo "Python: $PYTHON ($(python_version_of "$PYTHON")), found on PATH; nothing installed."
      return 0
    fi
  done
  if uv="$(find_uv)" && found="$("$uv" python find ">=${T5X_LIKE_MIN_PYTHON}" 2>/dev/null)" \
      && python_is_recent "$found"; then
    export PYTHON="$found"
    echo "Python: $PYTHON ($(python_version_of "$PYTHON")), installed earlier by uv;" \
      "nothing installed."
    return 0
  fi
  uv="$(find_uv)" || uv="$(install_uv python3)" || return 1
  echo "No Python >= ${T5X_LIKE_MIN_PYTHON} here; installing one with $uv python install ..." >&2
  if ! "$uv" python install "${T5X_LIKE_MIN_PYTHON}" >&2 \
      || ! found="$("$uv" python find "${T5X_LIKE_MIN_PYTHON}")" \
      || ! python_is_recent "$found"; then
    echo "uv could not install Python ${T5X_LIKE_MIN_PYTHON}; see its messages above." >&2
    return 1
  fi
  export PYTHON="$found"
  echo "Python: $PYTHON ($(python_version_of "$PYTHON")), installed now with uv."
}

ensure_venv() {
  local extra="${1:-}" spec="." stamp want
  [ -n "$extra" ] && spec=".[$extra]"
  local python="${PYTHON:-python3}"
  if ! python_is_recent "$python"; then
    echo "t5x_like needs Python >= ${T5X_LIKE_MIN_PYTHON}; set" \
      "PYTHON=/path/to/python${T5X_LIKE_MIN_PYTHON} (or run ensure_python, which installs one" \
      "with uv) and rerun." >&2
    return 1
  fi
  if [ -x .venv/bin/python ] && ! python_is_recent .venv/bin/python; then
    echo "Replacing .venv: it was made with Python $(python_version_of .venv/bin/python)." >&2
    rm -rf .venv
  fi
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  # shellcheck disable=SC1091
  source .venv/bin/activate
  want="$(cat pyproject.toml requirements/lock.txt requirements/oracles*.txt | sha256sum | cut -c1-16)"
  stamp=.venv/.t5x_like_installed
  # The stamp holds "<hash> <extra>"; an install with the test extra also serves plain runs.
  local have
  have="$(cat "$stamp" 2>/dev/null || true)"
  if [ "$have" != "$want ${extra:-none}" ] && { [ -n "$extra" ] || [ "${have%% *}" != "$want" ]; }; then
    echo "Installing t5x_like${extra:+ with the $extra extra} into .venv (locked versions)..."
    python -m pip install --quiet --upgrade pip
    python -m pip install --quiet -c requirements/lock.txt -e "$spec"
    if [ "$extra" = test ]; then install_oracles; fi
    echo "$want ${extra:-none}" > "$stamp"
  fi
}

# The reference code the data-path tests compare against (requirements/oracles.txt), and
# transformers 4 for the checkpoint-format tests (requirements/oracles_transformers4.txt),
# without their dependencies, into folders only the tests' oracle processes put on their path.
install_oracles() {
  rm -rf .venv/oracles .venv/oracles_transformers4
  python -m pip install --quiet --no-deps --target .venv/oracles -r requirements/oracles.txt
  python -m pip install --quiet --no-deps --target .venv/oracles_transformers4 \
    -r requirements/oracles_transformers4.txt
}

# Add jax's accelerator build at the locked jax version: KIND is "tpu" (libtpu) or "gpu"
# (CUDA 12 wheels); anything else (or empty) keeps the CPU build.
install_accelerator() {
  local kind="${1:-}" jax_version
  jax_version="$(grep -E '^jax==' requirements/lock.txt | cut -d= -f3)"
  case "$kind" in
    tpu) python -m pip install --quiet "jax[tpu]==${jax_version}" ;;
    gpu) python -m pip install --quiet "jax[cuda12]==${jax_version}" ;;
    *) ;;
  esac
}
