# shellcheck shell=bash
# Sourced by the launch scripts: make sure .venv exists and holds t5x_like at the locked versions.
# Usage: ensure_venv [EXTRA]   (EXTRA: "test" for the test extra)
# Re-installs only when pyproject.toml or requirements/lock.txt changed since the last install.

ensure_venv() {
  local extra="${1:-}" spec="." stamp want
  [ -n "$extra" ] && spec=".[$extra]"
  local python="${PYTHON:-python3}"
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "t5x_like needs Python >= 3.11; set PYTHON=/path/to/python3.11 and rerun." >&2
    return 1
  fi
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  # shellcheck disable=SC1091
  source .venv/bin/activate
  want="$(cat pyproject.toml requirements/lock.txt requirements/oracles.txt | sha256sum | cut -c1-16)"
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

# The reference code the data-path tests compare against (requirements/oracles.txt), without
# its dependencies, into a folder only the tests' oracle processes put on their path.
install_oracles() {
  rm -rf .venv/oracles
  python -m pip install --quiet --no-deps --target .venv/oracles -r requirements/oracles.txt
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
