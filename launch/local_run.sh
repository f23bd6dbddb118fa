#!/usr/bin/env bash
# Run the experiment on this machine's CPU (what the README's quickstart does for its own
# config): installs .venv if needed, then the trainer with JAX_PLATFORMS=cpu.
#
#   bash launch/local_run.sh --config launch/experiments/NAME.env [--dry-run] [-- extra args]
#
# An experiment file written for a TPU names gs:// paths and C4; override them after `--` for a
# CPU run, e.g. 10 steps of T5 Base on the offline corpus into a local directory:
#   bash launch/local_run.sh --config launch/experiments/t5_base_v4_32.env -- \
#     --gin.MODEL_DIR=/tmp/t5_base_local --gin.TASK=offline_span_corruption \
#     --gin.BATCH_SIZE=8 --gin.TRAIN_STEPS=10
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/_common.sh
source launch/_venv.sh
parse_args "$@"
require_config GIN_FILES MODEL_DIR
build_train_command
if [ "$DRY_RUN" = false ]; then ensure_venv; fi
run env JAX_PLATFORMS=cpu "${TRAIN_CMD[@]}"
