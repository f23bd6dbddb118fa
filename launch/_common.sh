# shellcheck shell=bash
# Shared by the launch scripts: options, the experiment config file, and dry runs.
#
#   --config FILE   an experiment file (bash variables; see launch/experiments/*.env)
#   --dry-run       print every command instead of running it
#   --help          the calling script's header comment
# Everything after `--` goes to the trainer as extra arguments (e.g. --gin.TRAIN_STEPS=100).

DRY_RUN=false
CONFIG=""
EXTRA_ARGS=()

usage() {
  # The comment block at the top of the calling script, without the shebang.
  sed -n '2,/^[^#]/p' "$0" | sed -e '/^[^#]/d' -e 's/^# \{0,1\}//'
}

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --config) CONFIG="$2"; shift 2 ;;
      --config=*) CONFIG="${1#--config=}"; shift ;;
      --dry-run) DRY_RUN=true; shift ;;
      -h|--help) usage; exit 0 ;;
      --) shift; EXTRA_ARGS=("$@"); break ;;
      *) echo "Unknown option $1 (see --help)." >&2; exit 2 ;;
    esac
  done
}

# Read the experiment file and check the variables a script needs: require_config VAR...
require_config() {
  if [ -z "$CONFIG" ]; then
    echo "Pass --config launch/experiments/NAME.env (see --help)." >&2
    exit 2
  fi
  if [ ! -f "$CONFIG" ]; then
    echo "Experiment file $CONFIG does not exist." >&2
    exit 2
  fi
  # shellcheck disable=SC1090
  source "$CONFIG"
  local name missing=()
  for name in "$@"; do
    [ -n "${!name:-}" ] || missing+=("$name")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "$CONFIG does not set: ${missing[*]}." >&2
    exit 2
  fi
}

# One argument as the shell would need it typed: bare when safe, else in single quotes.
shell_quote() {
  local sq="'"
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,~-]+$ ]]; then
    echo "$1"
  else
    echo "'${1//$sq/$sq\\$sq$sq}'"
  fi
}

# Arguments as one shell-quoted line (what --dry-run prints; a remote --command).
quoted() {
  local out=() arg
  for arg in "$@"; do out+=("$(shell_quote "$arg")"); done
  echo "${out[*]}"
}

# Run a command, or print it (one shell-quoted line) with --dry-run.
run() {
  if [ "$DRY_RUN" = true ]; then
    quoted "$@"
  else
    "$@"
  fi
}

# The trainer's command line for the experiment, into the array TRAIN_CMD.
build_train_command() {
  local file binding
  # shellcheck disable=SC2034  # read by the calling script
  TRAIN_CMD=(python -m t5x_like.train)
  for file in ${GIN_FILES}; do TRAIN_CMD+=("--gin_file=${file}"); done
  TRAIN_CMD+=("--gin.MODEL_DIR=${MODEL_DIR}")
  if [ -n "${TFDS_DATA_DIR:-}" ]; then TRAIN_CMD+=("--gin.TFDS_DATA_DIR=${TFDS_DATA_DIR}"); fi
  for binding in ${GIN_BINDINGS:-}; do TRAIN_CMD+=("--gin.${binding}"); done
  TRAIN_CMD+=("${EXTRA_ARGS[@]}")
}

# gcloud's flags naming the experiment's project and zone, into the array GCLOUD_FLAGS.
set_gcloud_flags() {
  # shellcheck disable=SC2034  # read by the calling script
  GCLOUD_FLAGS=("--project=${PROJECT}" "--zone=${ZONE}")
}
